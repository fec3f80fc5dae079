"""The optional compiled decoders: `impl.decode._simdjson_nogil`, `impl.decode._onepass_nogil`
and its AVX2 build `impl.decode._onepass_nogil_avx2`.

Everything else about the package is in pyproject.toml. All are C++, share their headers and
need g++ and simdjson's headers and library (Debian/Ubuntu: `apt-get install g++
libsimdjson-dev`). Without them the build prints a warning and the install goes on
(`optional=True`); the decoders are then reported unavailable with that hint and skipped by the
tests and benchmarks. The AVX2 build is compiled on any x86-64 machine (g++ targets the
instruction set, the build machine need not have it) and imported only on a CPU that has it.
"""

import platform

from setuptools import Extension, setup

HEADERS = [
    "impl/decode/_nogil_request.h",
    "impl/decode/_nogil_numbers.h",
    "impl/decode/_nogil_body.h",
    "impl/decode/_nogil_module.h",
]


def compiled_decoder(
    name: str, walk: tuple[str, ...], *, flags: tuple[str, ...] = (), base: str = ""
) -> Extension:
    """The extension `name` from impl/decode/{name}.cpp (which includes `base`'s .cpp, if set)
    over the walk in the `walk` headers."""
    depends = [*HEADERS, *(f"impl/decode/{header}" for header in walk)]
    if base:
        depends.append(f"impl/decode/{base}.cpp")
    return Extension(
        f"impl.decode.{name}",
        sources=[f"impl/decode/{name}.cpp"],
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


ONEPASS = ("_onepass_walk.h", "_onepass_bulk.h")
EXTENSIONS = [
    compiled_decoder("_simdjson_nogil", ("_simdjson_nogil_walk.h",)),
    compiled_decoder("_onepass_nogil", ONEPASS),
]
if X86_64:
    EXTENSIONS.append(
        compiled_decoder("_onepass_nogil_avx2", ONEPASS, flags=AVX2, base="_onepass_nogil")
    )

setup(ext_modules=EXTENSIONS)
