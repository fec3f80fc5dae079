"""`hotpath list`: every registered implementation per family, whether it runs here, and why not."""

from __future__ import annotations

import argparse

from impl import registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "family", nargs="?", choices=registry.all_families(), help="only this family"
    )


def run(args: argparse.Namespace) -> int:
    for family in [args.family] if args.family else registry.all_families():
        print(f"{family} (reference: {registry.reference(family)})")
        width = max(map(len, registry.names(family)))
        for name in registry.names(family):
            entry = registry.entry(family, name)
            reason = registry.unavailable_reason(family, name)
            status = "ok " if reason is None else "n/a"
            print(f"  {status} {name:<{width}} {entry.summary}")
            if reason:
                print(f"      {reason}")
    return 0
