"""The optional compiled decoders: `impl.decode._simdjson_nogil` and `impl.decode._onepass_nogil`.

Everything else about the package is in pyproject.toml. Both are C++, share their headers and
need g++ and simdjson's headers and library (Debian/Ubuntu: `apt-get install g++
libsimdjson-dev`). Without them the build prints a warning and the install goes on
(`optional=True`); the `simdjson_nogil` and `onepass_nogil` decoders are then reported
unavailable with that hint and skipped by the tests and benchmarks.
"""

from setuptools import Extension, setup

HEADERS = [
    "impl/decode/_nogil_request.h",
    "impl/decode/_nogil_numbers.h",
    "impl/decode/_nogil_body.h",
    "impl/decode/_nogil_module.h",
]


def compiled_decoder(name: str, walk: str) -> Extension:
    return Extension(
        f"impl.decode.{name}",
        sources=[f"impl/decode/{name}.cpp"],
        depends=[*HEADERS, f"impl/decode/{walk}"],
        libraries=["simdjson"],
        language="c++",
        extra_compile_args=["-std=c++17", "-O3"],
        optional=True,
    )


setup(
    ext_modules=[
        compiled_decoder("_simdjson_nogil", "_simdjson_nogil_walk.h"),
        compiled_decoder("_onepass_nogil", "_onepass_walk.h"),
    ]
)
