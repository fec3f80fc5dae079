"""The optional compiled decoders: `impl.decode._simdjson_nogil`, `impl.decode._onepass_nogil`
and its AVX2 build `impl.decode._onepass_nogil_avx2`.

Everything else about the package is in pyproject.toml. All are C++ from `impl/decode/_native/`
(`common/`: what both walks share; `simdjson_nogil/`, `onepass_nogil/`: each decoder's walk and
module) and need only a C++17 compiler (g++): no system library. The Eisel-Lemire table is
written at build time by `_native/powers_of_five.py`; `_simdjson_nogil` compiles simdjson's own
sources (`simdjson.h`, `simdjson.cpp`), which the pysimdjson package ships and pyproject.toml
names as a build requirement, so pip fetches them with the build. Without a compiler the build
prints a warning and the install goes on (`optional=True`); the decoders are then reported
unavailable with the install hint and skipped by the tests and benchmarks. The AVX2 build is
compiled on any x86-64 machine (g++ targets the instruction set, the build machine need not
have it) and imported only on a CPU that has it.

Compiler flags from the environment are added as usual (`CFLAGS`, `LDFLAGS`): `make sanitize`
builds with `-fsanitize=address,undefined` that way (docs/native.md).
"""

import importlib.util
import os
import platform
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("impl/decode/_native")
COMMON = sorted(str(path) for path in (NATIVE / "common").glob("*.h"))
POWERS = NATIVE / "powers_of_five.py"


def simdjson_sources() -> Path | None:
    """The folder with simdjson's amalgamated `simdjson.h` and `simdjson.cpp`: the pysimdjson
    package the build runs with (pyproject.toml's build requirement), or None."""
    spec = importlib.util.find_spec("simdjson")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "simdjson.h").is_file() and (Path(folder) / "simdjson.cpp").is_file():
            return Path(folder)
    return None


def compiled_decoder(
    name: str, source: str, *, flags: tuple[str, ...] = (), simdjson: Path | None = None
) -> Extension:
    """The extension `impl.decode._{name}` from `_native/{source}`, rebuilt when any header of
    its folder or of common/ changes; with `simdjson` (a folder), simdjson's sources too.

    `-fvisibility=hidden`: the module exports only its `PyInit_` function (which Python's
    `PyMODINIT_FUNC` marks visible), so the walk's out-of-line functions are called directly,
    not through the PLT as symbols another library could interpose."""
    folder = NATIVE / Path(source).parent
    depends = [*COMMON, str(POWERS), *(str(path) for path in sorted(folder.glob("*.h")))]
    depends += [
        str(path) for path in sorted(folder.glob("*.cpp")) if path.name != Path(source).name
    ]
    extension = Extension(
        f"impl.decode._{name}",
        sources=[str(NATIVE / source)],
        depends=depends,
        language="c++",
        extra_compile_args=["-std=c++17", "-O3", "-fvisibility=hidden", *flags],
        optional=True,
    )
    extension.simdjson = simdjson  # added by BuildNative: an absolute path, outside the tree
    return extension


class BuildNative(build_ext):
    """build_ext that writes the generated header first and builds the extensions side by side."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # one compiler per core: simdjson.cpp alone takes ~15 s
            self.parallel = os.cpu_count() or 1

    def build_extensions(self) -> None:
        sys.path.insert(0, str(POWERS.parent))
        try:
            import powers_of_five
        finally:
            sys.path.pop(0)
        generated = Path(self.build_temp) / "generated"
        powers_of_five.write(generated / "powers_of_five.h")
        for extension in self.extensions:
            extension.include_dirs.append(str(generated))
            # simdjson's sources join here, not in setup(): setuptools refuses absolute paths
            # among an extension's sources when it builds a wheel (`pip wheel .`, asv).
            simdjson = getattr(extension, "simdjson", None)
            if simdjson is not None:
                extension.sources.append(str(simdjson / "simdjson.cpp"))
                extension.include_dirs.append(str(simdjson))
                extension.depends.append(str(simdjson / "simdjson.h"))
        super().build_extensions()


# x86-64-v3 (AVX2, BMI1/2, LZCNT) and PCLMUL for the onepass walk's 32-byte vectors and
# carry-less prefix XOR; only on x86-64, where g++ knows them.
AVX2 = ("-march=x86-64-v3", "-mpclmul")
X86_64 = platform.machine().lower() in ("x86_64", "amd64")

EXTENSIONS = []
SIMDJSON = simdjson_sources()
if SIMDJSON is not None:  # first: the longest to build (simdjson.cpp), started first
    EXTENSIONS.append(
        compiled_decoder("simdjson_nogil", "simdjson_nogil/module.cpp", simdjson=SIMDJSON)
    )
else:
    print(
        "warning: simdjson's sources (the pysimdjson package) are not importable here, so "
        "impl.decode._simdjson_nogil is not built: install with pip's build isolation "
        "(pip install -e .), or pip install pysimdjson first",
        file=sys.stderr,
    )
EXTENSIONS.append(compiled_decoder("onepass_nogil", "onepass_nogil/module.cpp"))
if X86_64:
    EXTENSIONS.append(
        compiled_decoder("onepass_nogil_avx2", "onepass_nogil/module_avx2.cpp", flags=AVX2)
    )

setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": BuildNative})
