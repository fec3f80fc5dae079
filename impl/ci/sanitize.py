"""`make sanitize`: the compiled decoders under AddressSanitizer and UBSan, their tests and the
fuzzer run on that build; any report fails (exit status 1).

1. A copy of the tree in `.sanitize/` (the install's own build stays as it is) is built with
   `setup.py build_ext --inplace` and `CXXFLAGS`/`CFLAGS`/`LDFLAGS` = `FLAGS` (setuptools 72
   and later compile C++ with `CXXFLAGS`, earlier ones with `CFLAGS`): ASan and UBSan, UBSan's
   reports fatal too (`-fno-sanitize-recover=all`), the standard library's bounds checks
   (`_GLIBCXX_ASSERTIONS`) and vectors annotated for ASan (a read past a vector's size, not
   only past its capacity, is reported). The sources see the sanitizer and then copy every body
   into a buffer of exactly its size plus the padding the walks may read (`readable_body` in
   `_native/common/request.h`), so a read past it is reported instead of being safe by design.
2. Every compiled decoder that the install built here must import from that copy and report
   `SANITIZED` (a build that silently dropped the flags would check nothing).
3. `tests/decode/test_compiled.py`, `tests/decode/test_buffers.py` and
   `tests/decode/test_regressions.py`, then the fuzzer for `--seconds`, run there with the
   compiler's ASan runtime preloaded into python (CPython is not built with ASan; leak
   detection is off, since the interpreter keeps memory at exit on purpose). A report ends the
   process with a failure; the fuzzer keeps the case that did it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import time

from impl import registry
from impl.ci.repo import ROOT

TREE = ROOT / ".sanitize"
FLAGS = (
    "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer "
    "-D_GLIBCXX_ASSERTIONS -D_GLIBCXX_SANITIZE_VECTOR=1"
)
COPIED = ("impl", "tests", "setup.py", "pyproject.toml", "README.md")
TESTS = (
    "tests/decode/test_compiled.py",
    "tests/decode/test_buffers.py",
    "tests/decode/test_regressions.py",
)
COMPILED = {
    "simdjson_nogil": "_simdjson_nogil",
    "onepass_nogil": "_onepass_nogil",
    "onepass_nogil_avx2": "_onepass_nogil_avx2",
}


def copy_tree() -> None:
    """The sources into TREE (built files, caches and the sanitized build's own output kept
    out; unchanged files keep their times, so an unchanged extension is not rebuilt)."""
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info", ".pytest_cache")
    TREE.mkdir(exist_ok=True)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, TREE / name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(source, TREE / name)


def preload() -> str:
    """The compiler's ASan runtime, which python must load before anything else, and its C++
    runtime (without it ASan cannot find the real `__cxa_throw` when a C++ library python loads
    later throws: pysimdjson does, on a body it rejects)."""
    compiler = (os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "g++").split()[0]
    found = []
    for library in ("libasan.so", "libstdc++.so"):
        path = subprocess.run(
            [compiler, f"-print-file-name={library}"], capture_output=True, text=True
        ).stdout.strip()
        if not os.path.isabs(path):
            raise SystemExit(f"sanitize: {compiler} has no {library} (Debian: apt-get install g++)")
        found.append(path)
    return " ".join(found)


def environment(preload: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_PRELOAD"] = preload
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1"
    return env


def step(title: str, command: list[str], env: dict[str, str]) -> bool:
    print(f"sanitize: {title}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    ok = subprocess.run(command, cwd=TREE, env=env, check=False).returncode == 0
    print(f"sanitize: {title}: {'ok' if ok else 'FAILED'} ({time.monotonic() - started:.0f} s)")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m impl.ci.sanitize",
        description="Build the compiled decoders with ASan and UBSan (in .sanitize/), then run "
        "their tests and the fuzzer on that build; exit 1 on any report.",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="fuzzer time (default 60)")
    parser.add_argument("--tests", nargs="*", default=list(TESTS), help="test files to run")
    args = parser.parse_args(argv)
    expected = [n for n in COMPILED if registry.unavailable_reason("decode", n) is None]
    if not expected:
        print("sanitize: no compiled decoder is built here (see hotpath list)", file=sys.stderr)
        return 1
    copy_tree()
    build_env = dict(os.environ, CFLAGS=FLAGS, CXXFLAGS=FLAGS, LDFLAGS=FLAGS)
    python = sys.executable
    build = [python, "setup.py", "-q", "build_ext", "--inplace"]
    stamp = TREE / ".flags"  # setuptools rebuilds on changed sources only, not changed flags
    if not stamp.exists() or stamp.read_text() != FLAGS:
        build.append("--force")
    if not step("build", build, build_env):
        return 1
    stamp.write_text(FLAGS)
    env = environment(preload())
    check = "; ".join(
        f"import impl.decode.{COMPILED[n]} as m; "
        f"assert m.SANITIZED and m.__file__.startswith({str(TREE)!r}), m.__file__"
        for n in expected
    )
    if not step(
        f"check that {', '.join(expected)} are the sanitized build", [python, "-c", check], env
    ):
        return 1
    # --capture=sys: a sanitizer's report (written to fd 2) is shown, not lost with the process
    tests = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys", *args.tests]
    ok = step("tests", tests, env)
    fuzz = [python, "-m", "impl.decode.fuzz", "--seconds", str(args.seconds)]
    fuzz += ["--regressions", str(ROOT / "tests" / "fixtures" / "decode-regressions")]
    ok = step("fuzz", fuzz, env) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
