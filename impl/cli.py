"""The `hotpath` command: a thin dispatcher over the library.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
only the chosen one is imported, so `hotpath --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("impl.listing", "what is registered per family, what runs here, and why not"),
    "bench": ("impl.bench", "the main job: every family's table; records picks for the server"),
    "serve": ("impl.server.cli", "the Tinker-SDK-compatible sampling server (FastAPI on uvicorn)"),
    "router": ("impl.harness.router.server", "the fake vLLM router (instant, barrier, latency)"),
    "loadtest": ("impl.harness.load", "drive a server like the Tinker SDK and report"),
    "profile": ("impl.profile", "record a py-spy profile of an implementation or the server"),
}


def _top_parser() -> argparse.ArgumentParser:
    epilog = "commands:\n" + "\n".join(
        f"  {name:<10} {summary}" for name, (_, summary) in COMMANDS.items()
    )
    epilog += "\n\n`hotpath COMMAND --help` explains each command's options."
    parser = argparse.ArgumentParser(
        prog="hotpath",
        description="Benchmark-first research on the hot path of an LLM sampling server.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    name = argv[0]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r}; choose from {', '.join(COMMANDS)}")
    module_name, summary = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(
        prog=f"hotpath {name}",
        description=(module.__doc__ or summary).strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
