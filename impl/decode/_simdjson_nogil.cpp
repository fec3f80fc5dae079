// impl.decode._simdjson_nogil, part 4 of 4: the module. A vLLM completion body -> the
// Completion's raw buffers, without the GIL: simdjson's SIMD stage 1 (the system libsimdjson,
// runtime-dispatched to the best kernel of this CPU) indexes every structural byte, validates
// UTF-8 and rejects unescaped control characters in strings; one memchr-driven sweep checks
// every backslash escape (_simdjson_nogil_numbers.h); the walk over the index
// (_simdjson_nogil_walk.h, _simdjson_nogil_body.h) then checks the JSON grammar of the whole
// body and parses only the numbers the Completion keeps.
//
// decode(body: bytes, prompt_tokens: bytes | None, k: int, max_depth: int, max_int_digits: int)
//   -> None when this fast path cannot vouch for the body (the caller asks the reference), or
//   -> (sequences, prompt_logprobs, topk_token_ids, topk_logprobs) where sequences is a list of
//      (int32 bytearray, float32 bytearray, is_stop) in index order and the other three are
//      bytearrays or None. prompt_tokens, when given, is the caller's prompt as int64 bytes.
// number(token: bytes) -> float | None: one token read as a kept logprob (for tests).
//
// Everything between the stage 1 call and the copies into bytearrays runs with the GIL
// released. The walk validates every value it skips exactly as Python's json module would
// accept it (number grammar, integers up to max_int_digits digits, literals, escapes, nesting
// up to max_depth), and parses what it keeps: token ids as int32, logprobs correctly rounded to
// a double like Python's float, then (float), numpy's double-to-float32 rounding. It answers
// None for anything it is not sure of (duplicated or escaped keys where it reads keys, integers
// beyond 18 digits or logprobs beyond 19 significant digits where it reads them, wrong types,
// length mismatches, lone surrogates and invalid UTF-8, which the reference tolerates), so the
// reference decodes the body or raises the right DecodeError.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "_simdjson_nogil_body.h"

namespace {

using namespace nogil;

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

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
  // Stage 1 and the string parser read up to SIMDJSON_PADDING bytes past the end, whatever
  // their values: the body is copied only when those bytes would cross into the next page.
  const uint8_t* buf = rq.body;
  uintptr_t last = reinterpret_cast<uintptr_t>(buf + rq.len - 1);
  if (last % page_size() + simdjson::SIMDJSON_PADDING >= page_size()) {
    padded.assign(buf, buf + rq.len);
    padded.resize(rq.len + simdjson::SIMDJSON_PADDING, ' ');
    buf = padded.data();
  }
  if (stage1->stage1(buf, rq.len, simdjson::stage1_mode::regular)) return false;
  if (!escapes_valid(buf, rq.len)) return false;
  closers.resize(rq.max_depth + 2);
  // The walk reads the index one past its end without a bounds check: there, two entries at
  // `len` (stage 1 writes the same; its buffer has room) point at the byte after the body, a
  // NUL or a space, which no rule accepts, so every path fails there.
  uint32_t* idx = stage1->structural_indexes.get();
  size_t n_idx = stage1->n_structural_indexes;
  idx[n_idx] = idx[n_idx + 1] = static_cast<uint32_t>(rq.len);
  Reader walk{{buf, rq.len, idx, n_idx, rq, closers.data()}};
  if (!walk.root(out.choices)) return false;
  size_t n = out.choices.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; i++) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return out.choices[a].index < out.choices[b].index;
  });
  if (n && out.choices[order[0]].prompt_logprobs && !walk.prompt(out.choices[order[0]], out)) {
    return false;
  }
  std::vector<Choice> sorted;
  sorted.reserve(n);
  for (size_t at : order) sorted.push_back(std::move(out.choices[at]));
  out.choices = std::move(sorted);
  return true;
}

template <typename T>
PyObject* as_bytearray(const std::vector<T>& values) {
  return PyByteArray_FromStringAndSize(reinterpret_cast<const char*>(values.data()),
                                       static_cast<Py_ssize_t>(values.size() * sizeof(T)));
}

PyObject* to_python(const Result& result) {
  PyObject* sequences = PyList_New(static_cast<Py_ssize_t>(result.choices.size()));
  if (sequences == nullptr) return nullptr;
  for (size_t i = 0; i < result.choices.size(); i++) {
    const Choice& choice = result.choices[i];
    PyObject* item = Py_BuildValue("(NNO)", as_bytearray(choice.tokens),
                                   as_bytearray(choice.logprobs),
                                   choice.stop ? Py_True : Py_False);
    if (item == nullptr) {
      Py_DECREF(sequences);
      return nullptr;
    }
    PyList_SET_ITEM(sequences, static_cast<Py_ssize_t>(i), item);
  }
  if (!result.has_prompt) return Py_BuildValue("(NOOO)", sequences, Py_None, Py_None, Py_None);
  return Py_BuildValue("(NNNN)", sequences, as_bytearray(result.prompt),
                       as_bytearray(result.topk_ids), as_bytearray(result.topk_lps));
}

PyObject* py_decode(PyObject*, PyObject* args) {
  PyObject* body;
  PyObject* prompt_tokens;
  long long k, max_depth, max_int_digits;
  if (!PyArg_ParseTuple(args, "SOLLL:decode", &body, &prompt_tokens, &k, &max_depth,
                        &max_int_digits)) {
    return nullptr;
  }
  Request rq{};
  rq.body = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(body));
  rq.len = static_cast<size_t>(PyBytes_GET_SIZE(body));
  rq.k = k;
  rq.max_depth = max_depth > 0 ? static_cast<size_t>(max_depth) : 1;
  rq.max_int_digits = max_int_digits > 0 ? static_cast<size_t>(max_int_digits) : 1;
  if (prompt_tokens != Py_None) {
    if (!PyBytes_Check(prompt_tokens)) {
      PyErr_SetString(PyExc_TypeError, "prompt_tokens must be int64 bytes or None");
      return nullptr;
    }
    rq.prompt_tokens = reinterpret_cast<const int64_t*>(PyBytes_AS_STRING(prompt_tokens));
    rq.n_prompt_tokens = static_cast<size_t>(PyBytes_GET_SIZE(prompt_tokens)) / sizeof(int64_t);
  }
  if (rq.len == 0) Py_RETURN_NONE;
  Result result;
  bool ok = false;
  Py_BEGIN_ALLOW_THREADS
  try {
    ok = decode(rq, result);
  } catch (...) {  // std::bad_alloc from a vector: the reference decides (and reports)
    ok = false;
  }
  Py_END_ALLOW_THREADS
  if (!ok) Py_RETURN_NONE;
  return to_python(result);
}

// number(token: bytes) -> float | None: the token read as the walk reads a kept logprob (None
// where the walk would hand the body to the reference). For tests: it shows the double itself,
// before the float32 rounding that could hide a wrong last bit.
PyObject* py_number(PyObject*, PyObject* token) {
  if (!PyBytes_Check(token)) {
    PyErr_SetString(PyExc_TypeError, "token must be bytes");
    return nullptr;
  }
  const uint8_t* data = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(token));
  size_t len = static_cast<size_t>(PyBytes_GET_SIZE(token));
  std::vector<uint8_t> padded(data, data + len);  // what follows a token in a body, and padding
  padded.resize(len + simdjson::SIMDJSON_PADDING, ' ');
  double value;
  if (len == 0 || !finite_double(padded.data(), len, value)) Py_RETURN_NONE;
  return PyFloat_FromDouble(value);
}

PyMethodDef methods[] = {
    {"number", py_number, METH_O,
     "number(token) -> float, or None where the walk would hand the body to the reference."},
    {"decode", py_decode, METH_VARARGS,
     "decode(body, prompt_tokens, k, max_depth, max_int_digits) -> buffers, or None when the "
     "reference must decide. Parses without the GIL."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_simdjson_nogil",
    "simdjson (system library) decode of vLLM completion bodies without the GIL.", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__simdjson_nogil() {
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
#define HOTPATH_STR(x) #x
#define HOTPATH_XSTR(x) HOTPATH_STR(x)
  // API_VERSION: bumped whenever the module's functions or their results change, so a stale build
  // left in the tree reads as unavailable instead of failing at the first call.
  if (PyModule_AddStringConstant(m, "SIMDJSON_VERSION", HOTPATH_XSTR(SIMDJSON_VERSION)) < 0 ||
      PyModule_AddIntConstant(m, "API_VERSION", 3) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
