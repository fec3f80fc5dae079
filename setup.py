"""The optional compiled decoder: `impl.decode._simdjson_nogil`, C++ over the system simdjson.

Everything else about the package is in pyproject.toml. The extension needs g++ and simdjson's
headers and library (Debian/Ubuntu: `apt-get install g++ libsimdjson-dev`). Without them the
build prints a warning and the install goes on (`optional=True`); the `simdjson_nogil` decoder
is then reported unavailable with that hint and skipped by the tests and benchmarks.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "impl.decode._simdjson_nogil",
            sources=["impl/decode/_simdjson_nogil.cpp"],
            depends=[
                "impl/decode/_simdjson_nogil_numbers.h",
                "impl/decode/_simdjson_nogil_walk.h",
                "impl/decode/_simdjson_nogil_body.h",
            ],
            libraries=["simdjson"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O3"],
            optional=True,
        )
    ]
)
