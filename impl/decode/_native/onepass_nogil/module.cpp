// impl.decode._onepass_nogil: the module (its Python side is common/module.h). A vLLM completion
// body -> the Completion's raw buffers, without the GIL, in one pass over the bytes (walk.h):
// no stage 1 and no index; the walk itself checks the JSON grammar of the whole body, strings
// (escapes, control characters, UTF-8) included, and parses only the numbers the Completion
// keeps (common/reader.h, common/floats.h). It accepts exactly what _simdjson_nogil accepts and
// answers None (the reference decides) where that does.
#define PY_SSIZE_T_CLEAN
#include <Python.h>


#include <cstdint>
#include <vector>

#include "../common/module.h"
#include "walk.h"

namespace {

bool decode(const Request& rq, Result& out) {
  thread_local std::vector<uint8_t> padded, closers;
  // The walk reads up to kPadding bytes past a position at or before the end. The byte at the
  // end is a NUL (of the bytes object, or of the copy), which no rule accepts; the bytes after
  // it are read but never decide anything.
  const uint8_t* buf = readable_body(rq, 0, padded);
  closers.resize(rq.max_depth + 2);
  Reader<ByteWalker> walk{{buf, rq.len, rq, closers.data()}};
  walk.ws();
  return walk.body(out);
}

PyModuleDef module;

// The module, with TARGET (the instruction set this build was compiled for) and CPU_AVX2
// (whether this CPU can run the AVX2 build: x86-64-v3, i.e. AVX2, BMI1/2 and LZCNT, plus
// PCLMUL; the Python side asks the baseline build before importing the other).
PyObject* onepass_module(const char* name, const char* target) {
  PyObject* m = create_module(module, name,
                              "One pass over the bytes, no index: vLLM completion bodies "
                              "decoded without the GIL.");
  if (m == nullptr) return nullptr;
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("x86-64-v3") && __builtin_cpu_supports("pclmul");
  if (PyModule_AddStringConstant(m, "TARGET", target) < 0 ||
      PyModule_AddObjectRef(m, "CPU_AVX2", avx2 ? Py_True : Py_False) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

}  // namespace

#if defined(HOTPATH_AVX2_BUILD)  // module_avx2.cpp
#if !defined(__AVX2__) || !defined(__BMI2__) || !defined(__PCLMUL__)
#error "onepass_nogil/module_avx2.cpp is built with -march=x86-64-v3 -mpclmul (setup.py passes them)"
#endif
PyMODINIT_FUNC PyInit__onepass_nogil_avx2() {
  return onepass_module("_onepass_nogil_avx2", "avx2");
}
#else
PyMODINIT_FUNC PyInit__onepass_nogil() { return onepass_module("_onepass_nogil", "baseline"); }
#endif
