// impl.decode's compiled decoders: the Python side, shared by simdjson_nogil/module.cpp and
// onepass_nogil/module.cpp. Each module includes this file, defines `bool decode(const Request&,
// Result&)` (run without the GIL: its walk under a `Reader`) and creates its module with
// `create_module`.
//
// decode(body: bytes, prompt_tokens: bytes | None, k: int, max_depth: int, max_int_digits: int)
//   -> None when the fast path cannot vouch for the body (the caller asks the reference), or
//   -> (sequences, prompt_logprobs, topk_token_ids, topk_logprobs) where sequences is a list of
//      (int32 buffer, float32 buffer, is_stop) in index order and the other three are buffers
//      or None (OutputBuffers: writable, from a pool of resident blocks, buffers.h).
//      prompt_tokens, when given, is the caller's prompt as int64 bytes.
// number(token: bytes) -> float | None: one token read as a kept logprob (for tests).
// pool_stats() -> (blocks, bytes, reused): the output pool's state (for tests).
#pragma once

#include <Python.h>  // after PY_SSIZE_T_CLEAN, first in the module

#include <string>
#include <vector>

#include "buffers.h"
#include "floats.h"
#include "reader.h"
#include "shapes.h"

namespace {

using namespace nogil;

bool decode(const Request& rq, Result& out);

template <typename T>
PyObject* as_buffer(const std::vector<T>& values) {
  return output_buffer(values.data(), values.size() * sizeof(T));
}

PyObject* to_python(const Result& result) {
  PyObject* sequences = PyList_New(static_cast<Py_ssize_t>(result.n));
  if (sequences == nullptr) return nullptr;
  for (size_t i = 0; i < result.n; i++) {
    const Choice& choice = result.choices[result.order[i]];
    PyObject* item = Py_BuildValue("(NNO)", as_buffer(choice.tokens),
                                   as_buffer(choice.logprobs),
                                   choice.stop ? Py_True : Py_False);
    if (item == nullptr) {
      Py_DECREF(sequences);
      return nullptr;
    }
    PyList_SET_ITEM(sequences, static_cast<Py_ssize_t>(i), item);
  }
  if (!result.has_prompt) return Py_BuildValue("(NOOO)", sequences, Py_None, Py_None, Py_None);
  return Py_BuildValue("(NNNN)", sequences, as_buffer(result.prompt),
                       as_buffer(result.topk_ids), as_buffer(result.topk_lps));
}

// The body's bytes for the walk, which reads the byte at `len` (a NUL no rule accepts): a bytes
// object's own (its NUL), or the first `length` bytes of a bytearray whose byte at `length` is a
// NUL (a kept receive buffer read in place, without the copy to bytes); held in `view`.
bool body_of(PyObject* body, Py_ssize_t length, Py_buffer* view, Request& rq) {
  if (PyBytes_Check(body)) {
    rq.body = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(body));
    rq.len = static_cast<size_t>(PyBytes_GET_SIZE(body));
    return true;
  }
  if (!PyByteArray_Check(body) || length < 0) {
    PyErr_SetString(PyExc_TypeError, "body must be bytes, or a bytearray with a length");
    return false;
  }
  if (PyObject_GetBuffer(body, view, PyBUF_SIMPLE) != 0) return false;
  const uint8_t* data = reinterpret_cast<const uint8_t*>(view->buf);
  if (length >= view->len || data[length] != 0) {
    PyBuffer_Release(view);
    view->obj = nullptr;
    PyErr_SetString(PyExc_ValueError, "the bytearray must hold a NUL at the body's length");
    return false;
  }
  rq.body = data;
  rq.len = static_cast<size_t>(length);
  return true;
}

PyObject* py_decode(PyObject*, PyObject* args) {
  PyObject* body;
  PyObject* prompt_tokens;
  long long k, max_depth, max_int_digits;
  Py_ssize_t length = -1;
  if (!PyArg_ParseTuple(args, "OOLLL|n:decode", &body, &prompt_tokens, &k, &max_depth,
                        &max_int_digits, &length)) {
    return nullptr;
  }
  Request rq{};
  Py_buffer view{};
  if (!body_of(body, length, &view, rq)) return nullptr;
  struct Held {  // the bytearray stays pinned (not resizable) until the call returns
    Py_buffer* view;
    ~Held() {
      if (view->obj != nullptr) PyBuffer_Release(view);
    }
  } held{&view};
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
  thread_local Result result;  // reused: its vectors keep their pages from call to call
  result.clear();
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
  // 32 bytes before the token (logprob_double reads them) and padding after it, as in a body.
  std::string padded(32, ' ');
  padded.append(reinterpret_cast<const char*>(data), len);
  padded.append(kPadding, ' ');
  const uint8_t* s = reinterpret_cast<const uint8_t*>(padded.data()) + 32;
  Shape sh;
  double value;
  if (len == 0 || !any_shape(s, len, sh) ||
      !(logprob_double(s, len, sh, value) || shaped_double(s, len, sh, value))) {
    Py_RETURN_NONE;
  }
  return PyFloat_FromDouble(value);
}

PyMethodDef methods[] = {
    {"number", py_number, METH_O,
     "number(token) -> float, or None where the walk would hand the body to the reference."},
    {"pool_stats", py_pool_stats, METH_NOARGS,
     "pool_stats() -> (blocks, bytes, reused): the output pool's blocks and bytes kept now and "
     "the blocks it has handed out again."},
    {"decode", py_decode, METH_VARARGS,
     "decode(body, prompt_tokens, k, max_depth, max_int_digits) -> buffers, or None when the "
     "reference must decide. Parses without the GIL."},
    {nullptr, nullptr, 0, nullptr},
};

// The module `name` with `doc`, the two functions and its constants. API_VERSION: bumped
// whenever the functions or their results change, so a stale build left in the tree reads as
// unavailable instead of failing at the first call. SANITIZED: built with AddressSanitizer
// (`make sanitize` checks that its build is).
PyObject* create_module(PyModuleDef& def, const char* name, const char* doc) {
  def = {PyModuleDef_HEAD_INIT, name, doc, -1, methods, nullptr, nullptr, nullptr, nullptr};
  if (PyType_Ready(&OutputBufferType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&def);
  if (m == nullptr) return nullptr;
  if (PyModule_AddIntConstant(m, "API_VERSION", 7) < 0 ||
      PyModule_AddObjectRef(m, "SANITIZED", kSanitized ? Py_True : Py_False) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}

}  // namespace
