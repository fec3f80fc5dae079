"""The optional compiled decoders: `impl.decode._simdjson_nogil`, `impl.decode._onepass_nogil`
and its AVX2 build `impl.decode._onepass_nogil_avx2`.

Everything else about the package is in pyproject.toml. All are C++ from `impl/decode/_native/`
(`common/`: what both walks share; `simdjson_nogil/`, `onepass_nogil/`: each decoder's walk and
module) and need g++ and simdjson's headers and library (Debian/Ubuntu: `apt-get install g++
libsimdjson-dev`). Without them the build prints a warning and the install goes on
(`optional=True`); the decoders are then reported unavailable with that hint and skipped by the
tests and benchmarks. The AVX2 build is compiled on any x86-64 machine (g++ targets the
instruction set, the build machine need not have it) and imported only on a CPU that has it.
"""

import platform
from pathlib import Path

from setuptools import Extension, setup

NATIVE = Path("impl/decode/_native")
COMMON = sorted(str(path) for path in (NATIVE / "common").glob("*.h"))


def compiled_decoder(name: str, source: str, *, flags: tuple[str, ...] = ()) -> Extension:
    """The extension `impl.decode._{name}` from `_native/{source}`, rebuilt when any header of
    its folder or of common/ changes."""
    folder = NATIVE / Path(source).parent
    depends = [*COMMON, *(str(path) for path in sorted(folder.glob("*.h")))]
    depends += [
        str(path) for path in sorted(folder.glob("*.cpp")) if path.name != Path(source).name
    ]
    return Extension(
        f"impl.decode._{name}",
        sources=[str(NATIVE / source)],
        depends=depends,
        libraries=["simdjson"],
        language="c++",
        extra_compile_args=["-std=c++17", "-O3", *flags],
        optional=True,
    )


# x86-64-v3 (AVX2, BMI1/2, LZCNT) and PCLMUL for the onepass walk's 32-byte vectors and
# carry-less prefix XOR; only on x86-64, where g++ knows them.
AVX2 = ("-march=x86-64-v3", "-mpclmul")
X86_64 = platform.machine().lower() in ("x86_64", "amd64")


EXTENSIONS = [
    compiled_decoder("simdjson_nogil", "simdjson_nogil/module.cpp"),
    compiled_decoder("onepass_nogil", "onepass_nogil/module.cpp"),
]
if X86_64:
    EXTENSIONS.append(
        compiled_decoder("onepass_nogil_avx2", "onepass_nogil/module_avx2.cpp", flags=AVX2)
    )

setup(ext_modules=EXTENSIONS)
