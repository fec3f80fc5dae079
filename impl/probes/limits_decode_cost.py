"""CPU cost of the decode contract's limit checks on the 262144-token vLLM body (21.5 MB).

Each decoder decodes the body with its checks and with them patched out, alternately, ROUNDS
times (`time.process_time`, so waiting for a core on a loaded machine does not count); prints
the medians and their ratio, then the two checks alone.
Run: `python -m impl.probes.limits_decode_cost [ROUNDS]`.
"""

from __future__ import annotations

import statistics
import sys
import time

import impl.decode.msgspec as msgspec_module
import impl.decode.orjson as orjson_module
import impl.decode.simdjson as simdjson_module
from impl import registry
from impl.decode import _limits
from impl.workloads.synthetic import body_for


def _skip(body: bytes) -> None:
    return None


def _never(body: bytes) -> bool:
    return False


WITHOUT = {
    "simdjson": (simdjson_module, {"check_depth": _skip, "_WRAP_FROM": 1 << 62}),
    "msgspec": (msgspec_module, {"check_depth": _skip, "may_hold_long_integer": _never}),
    "orjson": (orjson_module, {"check_depth": _skip}),
}


def cpu_ms(call, argument: bytes) -> float:
    began = time.process_time()
    call(argument)
    return (time.process_time() - began) * 1e3


def main(rounds: int) -> None:
    body = body_for(262144, kind="vllm")
    for name, (module, patch) in WITHOUT.items():
        decoder = registry.create("decode", name)
        original = {attr: getattr(module, attr) for attr in patch}
        checked, unchecked = [], []
        try:
            for _ in range(rounds):
                for attr, value in original.items():
                    setattr(module, attr, value)
                checked.append(cpu_ms(decoder.decode, body))
                for attr, value in patch.items():
                    setattr(module, attr, value)
                unchecked.append(cpu_ms(decoder.decode, body))
        finally:
            for attr, value in original.items():
                setattr(module, attr, value)
        with_, without = statistics.median(checked), statistics.median(unchecked)
        ratio = with_ / without
        print(f"{name}: {with_:.1f} ms with the checks, {without:.1f} without ({ratio:.2f}x)")
    for check in ("check_depth", "may_hold_long_integer"):
        function = getattr(_limits, check)
        alone = statistics.median(cpu_ms(function, body) for _ in range(rounds))
        print(f"{check} alone: {alone:.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 11)
