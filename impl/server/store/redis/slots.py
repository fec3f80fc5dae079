"""Slot groups: how the shared store lays its keys over a Redis Cluster's 16,384 hash slots.

A record, its payload, its dedup key and its sampling session's completion log must share one
hash slot (a Lua script may touch keys of one slot only), and so must the structures a script
changes with them: the pending set, the byte buckets, the counters. Giving each sampling
session its own pending set would leave the store nothing to sum, so sessions are spread over
GROUPS slot groups instead: a session's group is `crc32(sampling_session_id) % GROUPS`, and
every key of the group carries the group's hash tag (`hotpath:{tag}r:<id>`). The tags are
chosen so that group g's slot lies in the g-th 1/GROUPS of the slot range: with the usual
layout of contiguous slot ranges per shard (`redis-cli --cluster create`), the groups fall
evenly over the shards (16 over 3 shards: 6, 5, 5), and a shard added or resharded moves
whole groups.

A request id names its group (`<group as 2 hex digits>.<id>`), so `retrieve_future` finds the
record from the id alone; the rest of the id is the store's own and is not read.
"""

from __future__ import annotations

import itertools
import string
import zlib

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

#: slot groups: more spread the load finer, each costs the counters' refresh 3 commands
GROUPS = 16


def _tags(groups: int) -> list[str]:
    """For each group, the shortest tag (then the first in order) whose slot is in its share."""
    share = REDIS_CLUSTER_HASH_SLOTS // groups
    found: dict[int, str] = {}
    alphabet = string.ascii_lowercase + string.digits
    for length in itertools.count(1):
        for chars in itertools.product(alphabet, repeat=length):
            tag = "".join(chars)
            group = key_slot(tag.encode()) // share
            if group < groups and group not in found:
                found[group] = tag
        if len(found) == groups:
            return [found[g] for g in range(groups)]
    raise AssertionError("unreachable")


TAGS = _tags(GROUPS)
#: each group's hash slot
SLOTS = [key_slot(tag.encode()) for tag in TAGS]


def group_of(sampling_session_id: str) -> int:
    return zlib.crc32(sampling_session_id.encode()) % GROUPS


def tagged(request_id: str, group: int) -> str:
    """A request id that names its group."""
    return f"{group:02x}.{request_id}"


def group_of_id(request_id: str) -> int | None:
    """The group a request id names, or None for an id this store did not hand out."""
    if len(request_id) < 4 or request_id[2] != ".":
        return None
    try:
        group = int(request_id[:2], 16)
    except ValueError:
        return None
    return group if group < GROUPS else None
