// impl.decode._simdjson_nogil: a vLLM completion body -> the Completion's raw buffers, parsed by
// simdjson (the system libsimdjson, DOM API, one reused parser per thread) WITHOUT the GIL.
//
// decode(body: bytes, prompt_tokens: bytes | None, k: int, max_depth: int)
//   -> None when this fast path cannot vouch for the body (the caller asks the reference), or
//   -> (sequences, prompt_logprobs, topk_token_ids, topk_logprobs) where sequences is a list of
//      (int32 bytearray, float32 bytearray, is_stop) in index order and the other three are
//      bytearrays or None. prompt_tokens, when given, is the caller's prompt as int64 bytes.
//
// Everything between the parse and the copies into bytearrays runs with the GIL released. The
// parse validates the whole body (every number, string, literal and bracket); the walk below
// follows the reference decoder's rules and answers None for anything it is not sure of
// (duplicated keys it reads, non-int64 integers, wrong types, length mismatches), so the
// reference raises the right DecodeError or decodes what simdjson cannot (1e400, big ints,
// lone surrogates, invalid UTF-8 in strings).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kTopkPadLogprob = -99999.0f;
constexpr size_t kInitialCapacity = 1 << 16;

struct Choice {
  int64_t index = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool stop = false;
};

struct Result {
  std::vector<Choice> choices;
  bool has_prompt = false;
  std::vector<float> prompt;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_lps;
};

struct Request {
  const uint8_t* body;
  size_t len;
  const int64_t* prompt_tokens;  // nullptr: take the first choice's prompt_token_ids
  size_t n_prompt_tokens;
  int64_t k;
  size_t max_depth;
};

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// The named fields of `obj` (absent ones stay null elements); false if one of them repeats
// (Python keeps the last duplicate, simdjson would give us the first: the reference decides).
template <size_t N>
bool fields(object obj, const std::string_view (&names)[N], element (&out)[N], bool (&seen)[N]) {
  for (size_t i = 0; i < N; i++) seen[i] = false;
  for (auto field : obj) {
    for (size_t i = 0; i < N; i++) {
      if (field.key == names[i]) {
        if (seen[i]) return false;
        seen[i] = true;
        out[i] = field.value;
      }
    }
  }
  return true;
}

bool is_null(const element& e, bool seen) { return !seen || e.type() == element_type::NULL_VALUE; }

// A JSON number as Python's float() of it (correctly rounded; ints round to nearest even like
// Python's int -> float), finite. False for any other value.
bool finite_number(const element& e, double& out) {
  switch (e.type()) {
    case element_type::INT64:
      out = static_cast<double>(e.get_int64().value_unsafe());
      return true;
    case element_type::UINT64:
      out = static_cast<double>(e.get_uint64().value_unsafe());
      return true;
    case element_type::DOUBLE:
      out = e.get_double().value_unsafe();
      return std::isfinite(out);
    default:
      return false;
  }
}

bool int64_value(const element& e, int64_t& out) {
  if (e.type() != element_type::INT64) return false;
  out = e.get_int64().value_unsafe();
  return true;
}

bool sequence(object obj, Choice& choice, element& prompt_logprobs, bool& has_prompt_logprobs,
              element& prompt_token_ids, bool& has_prompt_token_ids) {
  static constexpr std::string_view names[] = {"index", "token_ids", "logprobs", "finish_reason",
                                               "prompt_logprobs", "prompt_token_ids"};
  element value[6];
  bool seen[6];
  if (!fields(obj, names, value, seen)) return false;
  if (!seen[0] || !int64_value(value[0], choice.index)) return false;

  if (!is_null(value[1], seen[1])) {
    array ids;
    if (value[1].get_array().get(ids)) return false;
    choice.tokens.reserve(ids.size());
    for (element id : ids) {
      int64_t token;
      if (!int64_value(id, token) || token < INT32_MIN || token > INT32_MAX) return false;
      choice.tokens.push_back(static_cast<int32_t>(token));
    }
  }

  bool have_values = false;
  array values;
  if (!is_null(value[2], seen[2])) {
    object lp;
    if (value[2].get_object().get(lp)) return false;
    static constexpr std::string_view lp_names[] = {"token_logprobs"};
    element lp_value[1];
    bool lp_seen[1];
    if (!fields(lp, lp_names, lp_value, lp_seen)) return false;
    if (!is_null(lp_value[0], lp_seen[0])) {
      if (lp_value[0].get_array().get(values)) return false;
      have_values = values.size() > 0;
    }
  }
  size_t n = choice.tokens.size();
  if (!have_values) {
    choice.logprobs.assign(n, 0.0f);  // no logprobs requested: zeros
  } else {
    if (values.size() != n) return false;
    choice.logprobs.reserve(n);
    for (element v : values) {
      double d = 0.0;
      if (v.type() != element_type::NULL_VALUE && !finite_number(v, d)) return false;
      choice.logprobs.push_back(static_cast<float>(d));  // double, then float32: numpy's rounding
    }
    if (choice.logprobs.size() != n) return false;
  }

  if (seen[3] && value[3].type() == element_type::STRING) {
    std::string_view finish = value[3].get_string().value_unsafe();
    choice.stop = finish == "stop" || finish == "stop_token";
  }
  has_prompt_logprobs = !is_null(value[4], seen[4]);
  prompt_logprobs = value[4];
  has_prompt_token_ids = seen[5];
  prompt_token_ids = value[5];
  return true;
}

// The reference's `_prompt_value`: an object whose `logprob` is null/absent (NaN) or a number.
bool prompt_value(const element& item, float& out) {
  object obj;
  if (item.get_object().get(obj)) return false;
  static constexpr std::string_view names[] = {"logprob"};
  element value[1];
  bool seen[1];
  if (!fields(obj, names, value, seen)) return false;
  if (is_null(value[0], seen[0])) {
    out = kNaN;
    return true;
  }
  double d;
  if (!finite_number(value[0], d)) return false;
  out = static_cast<float>(d);
  return true;
}

struct Ranked {
  int64_t rank;
  int32_t token;
  float logprob;
};

bool prompt(const Request& rq, element entries_value, bool has_ids, element ids_value,
            Result& out) {
  array entries;
  if (entries_value.get_array().get(entries)) return false;
  std::vector<int64_t> own_ids;
  const int64_t* tokens = rq.prompt_tokens;
  size_t n_tokens = rq.n_prompt_tokens;
  if (tokens == nullptr) {
    array ids;
    if (!has_ids || ids_value.get_array().get(ids)) return false;
    for (element id : ids) {
      int64_t token;
      if (!int64_value(id, token)) return false;
      own_ids.push_back(token);
    }
    tokens = own_ids.data();
    n_tokens = own_ids.size();
  }
  size_t n = entries.size();
  if (n != n_tokens) return false;
  size_t k = rq.k > 0 ? static_cast<size_t>(rq.k) : 0;
  out.has_prompt = true;
  out.prompt.assign(n, kNaN);
  out.topk_ids.assign(n * k, 0);
  out.topk_lps.assign(n * k, kTopkPadLogprob);
  std::vector<std::string_view> keys;
  std::vector<Ranked> ranked;
  size_t i = 0;
  for (element entry_value : entries) {
    size_t row = i++;
    if (entry_value.type() == element_type::NULL_VALUE) continue;
    object entry;
    if (entry_value.get_object().get(entry)) return false;
    keys.clear();
    for (auto field : entry) keys.push_back(field.key);
    std::sort(keys.begin(), keys.end());
    if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return false;
    char text[24];
    int length = std::snprintf(text, sizeof text, "%lld", static_cast<long long>(tokens[row]));
    std::string_view own_key(text, static_cast<size_t>(length));
    ranked.clear();
    for (auto field : entry) {
      if (field.key == own_key && field.value.type() != element_type::NULL_VALUE &&
          !prompt_value(field.value, out.prompt[row])) {
        return false;
      }
      if (k == 0) continue;
      std::string_view key = field.key;  // a token id: 1..10 ASCII digits, at most INT32_MAX
      if (key.empty() || key.size() > 10) return false;
      int64_t token = 0;
      for (char c : key) {
        if (c < '0' || c > '9') return false;
        token = token * 10 + (c - '0');
      }
      if (token > INT32_MAX) return false;
      object item;
      if (field.value.get_object().get(item)) return false;
      static constexpr std::string_view names[] = {"rank"};
      element value[1];
      bool seen[1];
      int64_t rank;
      if (!fields(item, names, value, seen) || !seen[0] || !int64_value(value[0], rank)) {
        return false;
      }
      if (rank < 1 || static_cast<uint64_t>(rank) > k) continue;
      Ranked r{rank, static_cast<int32_t>(token), 0.0f};
      if (!prompt_value(field.value, r.logprob)) return false;
      ranked.push_back(r);
    }
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const Ranked& a, const Ranked& b) { return a.rank < b.rank; });
    for (size_t j = 0; j < ranked.size() && j < k; j++) {
      out.topk_ids[row * k + j] = ranked[j].token;
      out.topk_lps[row * k + j] = ranked[j].logprob;
    }
  }
  return true;
}

bool decode(const Request& rq, Result& out) {
  thread_local simdjson::dom::parser parser;
  thread_local size_t depth = 0;
  if (depth != rq.max_depth) {
    if (parser.allocate(kInitialCapacity, rq.max_depth)) return false;
    depth = rq.max_depth;
  }
  // simdjson reads up to SIMDJSON_PADDING bytes past the end; the bytes' values do not matter,
  // so the body is copied only when those bytes would cross into the next page.
  uintptr_t last = reinterpret_cast<uintptr_t>(rq.body + rq.len - 1);
  bool copy = last % page_size() + simdjson::SIMDJSON_PADDING >= page_size();
  element root;
  if (parser.parse(rq.body, rq.len, copy).get(root)) return false;
  object top;
  if (root.get_object().get(top)) return false;
  static constexpr std::string_view names[] = {"choices"};
  element value[1];
  bool seen[1];
  array choices;
  if (!fields(top, names, value, seen) || !seen[0] || value[0].get_array().get(choices)) {
    return false;
  }
  size_t n = choices.size();
  out.choices.resize(n);
  std::vector<element> prompt_logprobs(n), prompt_token_ids(n);
  std::vector<char> has_prompt_logprobs(n), has_prompt_token_ids(n);
  std::vector<size_t> order(n);
  size_t i = 0;
  for (element choice_value : choices) {
    object choice;
    if (choice_value.get_object().get(choice)) return false;
    bool has_lp = false, has_ids = false;
    if (!sequence(choice, out.choices[i], prompt_logprobs[i], has_lp, prompt_token_ids[i],
                  has_ids)) {
      return false;
    }
    has_prompt_logprobs[i] = has_lp;
    has_prompt_token_ids[i] = has_ids;
    order[i] = i;
    i++;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return out.choices[a].index < out.choices[b].index;
  });
  if (n && has_prompt_logprobs[order[0]]) {
    size_t first = order[0];
    if (!prompt(rq, prompt_logprobs[first], has_prompt_token_ids[first], prompt_token_ids[first],
                out)) {
      return false;
    }
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
  long long k, max_depth;
  if (!PyArg_ParseTuple(args, "SOLL:decode", &body, &prompt_tokens, &k, &max_depth)) {
    return nullptr;
  }
  Request rq{};
  rq.body = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(body));
  rq.len = static_cast<size_t>(PyBytes_GET_SIZE(body));
  rq.k = k;
  rq.max_depth = max_depth > 0 ? static_cast<size_t>(max_depth) : 1;
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

PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS,
     "decode(body, prompt_tokens, k, max_depth) -> buffers, or None when the reference must "
     "decide. Parses without the GIL."},
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
  if (PyModule_AddStringConstant(m, "SIMDJSON_VERSION", HOTPATH_XSTR(SIMDJSON_VERSION)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
