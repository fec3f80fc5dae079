"""Two builds of a compiled decoder side by side on every body kind: the installed one against
another build of the same extension (an older commit's, say), in one process, interleaved.

A shared, loaded machine moves a decode's wall time from call to call, so two builds
are only compared within one run: each round decodes the body with both (the order alternating
from round to round), and the table shows both best calls, their ratio and the median of the
rounds' ratios. Bodies: `impl.workloads.realtext`'s kinds in both renderings at TOKENS (262144 by
default). Before timing, the two builds' answers are compared, array for array: a build that
answers differently is an error, not a figure.

    python -m impl.probes.decode_builds OTHER.so [--module _onepass_nogil_avx2]
        [--rounds 15] [--tokens 262144] [--kinds prose,code]

OTHER.so: a built `impl/decode/_onepass_nogil_avx2*.so` (or the module `--module` names), e.g.
from a worktree of an older commit built in place (docs/native.md: comparing two builds).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import statistics
import time
from types import ModuleType

from impl.decode import MAX_DEPTH, MAX_INT_DIGITS
from impl.workloads import realtext


def load_build(path: str, module: str) -> ModuleType:
    """The extension at `path` as a module of its own (not registered in sys.modules, so the
    installed build of the same name stays what `impl.decode` uses)."""
    spec = importlib.util.spec_from_file_location(f"impl.decode.{module}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a loadable extension")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def _call(build: ModuleType, body: bytes) -> tuple[float, object]:
    started = time.perf_counter()
    got = build.decode(body, None, 0, MAX_DEPTH, MAX_INT_DIGITS)
    return time.perf_counter() - started, got


def _contents(answer: object) -> object:
    """An extension's answer with every buffer as its bytes (the buffers compare by identity)."""
    if isinstance(answer, tuple | list):
        return [_contents(item) for item in answer]
    if answer is None or isinstance(answer, bool):
        return answer
    return bytes(memoryview(answer))


def compare(installed: ModuleType, other: ModuleType, body: bytes, rounds: int) -> dict:
    """Both builds on `body`, `rounds` interleaved rounds: best calls and round ratios."""
    _, want = _call(other, body)
    _, got = _call(installed, body)
    if want is None or _contents(got) != _contents(want):
        raise SystemExit("the two builds answer this body differently (or hand it over)")
    best = {"other": float("inf"), "installed": float("inf")}
    ratios = []
    for round_ in range(rounds):
        order = ("other", "installed") if round_ % 2 == 0 else ("installed", "other")
        took = {}
        for name in order:
            took[name], _ = _call(other if name == "other" else installed, body)
            best[name] = min(best[name], took[name])
        ratios.append(took["installed"] / took["other"])
    return {**best, "median_ratio": statistics.median(ratios)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", help="the other build's .so file")
    parser.add_argument("--module", default="_onepass_nogil_avx2", help="extension module name")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=262144)
    parser.add_argument("--kinds", default=",".join(realtext.KINDS))
    args = parser.parse_args(argv)
    installed = importlib.import_module(f"impl.decode.{args.module}")
    other = load_build(args.other, args.module)
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.rounds} rounds; "
          f"ms by best call; ratio installed/other")  # fmt: skip
    print(f"{'body':<22} {'other':>8} {'installed':>9} {'best/best':>9} {'median':>7} {'GB/s':>6}")
    for kind in args.kinds.split(","):
        for how in realtext.RENDERS:
            reason = realtext.unavailable_reason(kind, how)
            if reason is not None:
                print(f"{kind}-{how}: n/a ({reason})")
                continue
            body = realtext.body_for(args.tokens, kind=kind, render_as=how)
            row = compare(installed, other, body, args.rounds)
            print(
                f"{kind + '-' + how:<22} {row['other'] * 1e3:8.2f} {row['installed'] * 1e3:9.2f} "
                f"{row['installed'] / row['other']:9.3f} {row['median_ratio']:7.3f} "
                f"{len(body) / row['installed'] / 1e9:6.2f}"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
