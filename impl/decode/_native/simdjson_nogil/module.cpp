// impl.decode._simdjson_nogil: the module (its Python side is common/module.h). A vLLM completion
// body -> the Completion's raw buffers, without the GIL: simdjson's SIMD stage 1 (simdjson's own
// sources, from the pysimdjson package setup.py builds with, compiled into this module;
// runtime-dispatched to the best kernel of this CPU) indexes every structural byte,
// validates UTF-8 and rejects unescaped control characters in strings; one memchr-driven sweep
// checks every backslash escape (common/escapes.h); the walk over the index (walk.h, read by
// common/reader.h) then checks the JSON grammar of the whole body and parses only the numbers
// the Completion keeps.
//
// Everything between the stage 1 call and the copies into bytearrays runs with the GIL released.
// The walk validates every value it skips exactly as Python's json module would accept it (number
// grammar, integers up to max_int_digits digits, literals, escapes, nesting up to max_depth), and
// parses what it keeps: token ids as int32, logprobs correctly rounded to a double like Python's
// float, then (float), numpy's double-to-float32 rounding. It answers None for anything it is not
// sure of (duplicated or escaped keys where it reads keys, integers beyond 18 digits or logprobs
// beyond 19 significant digits where it reads them, wrong types, length mismatches, lone surrogates
// and invalid UTF-8, which the reference tolerates), so the reference decodes the body or raises
// the right DecodeError.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "../common/escapes.h"
#include "../common/module.h"
#include "walk.h"

namespace {

static_assert(kPadding >= simdjson::SIMDJSON_PADDING, "stage 1 reads SIMDJSON_PADDING bytes past");

bool decode(const Request& rq, Result& out) {
  thread_local std::unique_ptr<simdjson::internal::dom_parser_implementation> stage1;
  thread_local std::vector<uint8_t> padded, closers;
  if (!stage1 || stage1->capacity() < rq.len) {
    size_t capacity = std::max<size_t>(rq.len, 1 << 16);
    if (!stage1) {
      const simdjson::implementation& best = *simdjson::get_active_implementation();
      if (best.create_dom_parser_implementation(capacity, rq.max_depth, stage1)) return false;
    } else if (stage1->allocate(capacity, rq.max_depth)) {
      return false;
    }
  }
  // Stage 1 reads up to SIMDJSON_PADDING bytes past the end, whatever their values.
  const uint8_t* buf = readable_body(rq, ' ', padded);
  if (stage1->stage1(buf, rq.len, simdjson::stage1_mode::regular)) return false;
  if (!escapes_valid(buf, rq.len)) return false;
  closers.resize(rq.max_depth + 2);
  // The walk reads the index one past its end without a bounds check: there, two entries at
  // `len` (stage 1 writes the same; its buffer has room) point at the byte after the body, a
  // NUL or a space, which no rule accepts, so every path fails there.
  uint32_t* idx = stage1->structural_indexes.get();
  size_t n_idx = stage1->n_structural_indexes;
  idx[n_idx] = idx[n_idx + 1] = static_cast<uint32_t>(rq.len);
  Reader<IndexWalker> walk{{buf, rq.len, idx, n_idx, rq, closers.data()}};
  return walk.body(out);
}

PyModuleDef module;

}  // namespace

// The module, with SIMDJSON_VERSION: the simdjson it was built with.
PyMODINIT_FUNC PyInit__simdjson_nogil() {
  PyObject* m = create_module(module, "_simdjson_nogil",
                              "simdjson's stage 1 and an index walk: vLLM completion bodies "
                              "decoded without the GIL.");
  if (m != nullptr && PyModule_AddStringConstant(m, "SIMDJSON_VERSION", SIMDJSON_VERSION) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
