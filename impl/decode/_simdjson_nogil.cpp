// impl.decode._simdjson_nogil: a vLLM completion body -> the Completion's raw buffers, without
// the GIL: simdjson's SIMD stage 1 (the system libsimdjson, runtime-dispatched to the best
// kernel of this CPU) indexes every structural byte and validates UTF-8; a targeted walk over
// that index then checks the JSON grammar of the whole body and parses only the numbers the
// Completion keeps.
//
// decode(body: bytes, prompt_tokens: bytes | None, k: int, max_depth: int, max_int_digits: int)
//   -> None when this fast path cannot vouch for the body (the caller asks the reference), or
//   -> (sequences, prompt_logprobs, topk_token_ids, topk_logprobs) where sequences is a list of
//      (int32 bytearray, float32 bytearray, is_stop) in index order and the other three are
//      bytearrays or None. prompt_tokens, when given, is the caller's prompt as int64 bytes.
//
// Everything between the stage 1 call and the copies into bytearrays runs with the GIL
// released. The walk validates every value it skips exactly as Python's json module would
// accept it (number grammar, integers up to max_int_digits digits, literals, escapes through
// simdjson's own string parser, nesting up to max_depth), and parses what it keeps: token ids as
// int32, logprobs with simdjson's correctly rounded number parser, like Python's float, then
// (float),
// numpy's double-to-float32 rounding. It answers None for anything it is not sure of
// (duplicated or escaped keys where it reads keys, integers beyond 18 digits where it reads
// them, wrong types, length mismatches, lone surrogates and invalid UTF-8, which the reference
// tolerates), so the reference decodes the body or raises the right DecodeError.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kTopkPadLogprob = -99999.0f;

struct Choice {
  int64_t index = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool stop = false;
  size_t prompt_logprobs = 0;   // index position of the value + 1; 0 = absent or null
  size_t prompt_token_ids = 0;  // likewise (null counts as present, as in the reference)
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
  size_t max_int_digits;
};

inline bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
inline bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

enum class Num { Bad, Int, Float };

// The first byte at or after p that is not an ASCII digit, eight bytes at a time (reading up
// to seven bytes past it stays within the body's readable padding).
inline const uint8_t* skip_digits(const uint8_t* p) {
  while (true) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    // A byte is a digit iff its high nibble is 3 and adding 6 keeps it there; a carry out of a
    // non-digit byte only disturbs the bytes after it.
    uint64_t high = (v & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL;
    uint64_t over = ((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL;
    uint64_t bad = high | over;
    if (bad) return p + (__builtin_ctzll(bad) >> 3);
    p += 8;
  }
}

// JSON's number grammar over exactly [p, e); `digits` = the integer part's digit count. The
// scans need no bounds check: every token ends before a structural or whitespace byte, or at
// the end of the body, where a Python bytes object (or our padded copy) holds a NUL or space.
inline Num number_kind(const uint8_t* p, const uint8_t* e, size_t& digits) {
  p += *p == '-';
  const uint8_t* first = p;
  if (*p == '0') {
    p++;
  } else if (*p >= '1' && *p <= '9') {
    p = skip_digits(p + 1);
  } else {
    return Num::Bad;
  }
  digits = static_cast<size_t>(p - first);
  if (p == e) return Num::Int;
  if (*p == '.') {
    if (!is_digit(*++p)) return Num::Bad;
    p = skip_digits(p + 1);
  }
  if ((*p | 0x20) == 'e') {
    p++;
    p += *p == '+' || *p == '-';
    if (!is_digit(*p)) return Num::Bad;
    p = skip_digits(p + 1);
  }
  return p == e ? Num::Float : Num::Bad;
}

// A JSON integer of at most 18 digits (so it fits int64 exactly).
inline bool small_int(const uint8_t* s, const uint8_t* e, int64_t& out) {
  bool negative = *s == '-';
  const uint8_t* p = s + negative;
  size_t digits = static_cast<size_t>(e - p);
  if (digits == 0 || digits > 18 || (*p == '0' && digits > 1)) return false;
  int64_t value = 0;
  for (; p < e; p++) {
    if (!is_digit(*p)) return false;
    value = value * 10 + (*p - '0');
  }
  out = negative ? -value : value;
  return true;
}

// A JSON number as Python's float() of it, finite; false for anything else (or beyond 18
// integer digits, or a double that overflows: the reference decides those). `e` is the end
// of the token. Fractions and exponents go through simdjson's own correctly rounded parser
// (the one its DOM uses), which checks their grammar and that a separator follows; an integer
// (Python reads it as an int, so -0 is 0.0) is converted exactly.
inline bool finite_double(const uint8_t* s, const uint8_t* e, double& out) {
  const uint8_t* p = s + (*s == '-');
  const uint8_t* first = p;
  while (is_digit(*p)) p++;
  size_t digits = static_cast<size_t>(p - first);
  if (digits == 0 || digits > 18) return false;
  if (*p == '.' || (*p | 0x20) == 'e') {
    return !simdjson::fallback::numberparsing::parse_double(s).get(out) && std::isfinite(out);
  }
  int64_t value;
  if (!small_int(s, e, value)) return false;
  out = static_cast<double>(value);
  return true;
}

struct Walker {
  const uint8_t* buf;
  size_t len;
  const uint32_t* idx;
  size_t n;
  const Request& rq;
  const simdjson::internal::dom_parser_implementation& impl;
  std::vector<uint8_t>& scratch;
  size_t pos = 0;

  uint8_t peek() const { return pos < n ? buf[idx[pos]] : 0; }
  bool is_null() const { return peek() == 'n' && token_is("null"); }

  // End of the scalar token at pos: the next structural byte, less whitespace.
  const uint8_t* token_end() const {
    size_t end = pos + 1 < n ? idx[pos + 1] : len;
    while (end > idx[pos] && is_ws(buf[end - 1])) end--;
    return buf + end;
  }
  bool token_is(std::string_view literal) const {
    const uint8_t* s = buf + idx[pos];
    return static_cast<size_t>(token_end() - s) == literal.size() &&
           std::memcmp(s, literal.data(), literal.size()) == 0;
  }

  // The string at pos (content in [s, e)); escapes validated by simdjson's string parser.
  bool string(const uint8_t*& s, const uint8_t*& e, bool& escaped) {
    if (peek() != '"') return false;
    const uint8_t* open = buf + idx[pos];
    const uint8_t* close = token_end() - 1;
    if (close <= open || *close != '"') return false;
    s = open + 1;
    e = close;
    size_t length = static_cast<size_t>(e - s);
    if (length <= 8) {  // most strings are short tokens: one word, no call
      uint64_t v = 0;
      std::memcpy(&v, s, 8);  // within the body's readable padding
      uint64_t x = (v ^ 0x5C5C5C5C5C5C5C5CULL) | (length == 8 ? 0 : ~0ULL << (8 * length));
      escaped = ((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL) != 0;
    } else {
      escaped = std::memchr(s, '\\', length) != nullptr;
    }
    if (escaped) {
      size_t need = static_cast<size_t>(e - s) + simdjson::SIMDJSON_PADDING;
      if (scratch.size() < need) scratch.resize(need);
      if (impl.parse_string(s, scratch.data()) == nullptr) return false;
    }
    pos++;
    return true;
  }

  bool scalar() {
    if (pos >= n) return false;
    const uint8_t* s = buf + idx[pos];
    bool ok;
    switch (*s) {
      case 't': ok = token_is("true"); break;
      case 'f': ok = token_is("false"); break;
      case 'n': ok = token_is("null"); break;
      default: {
        // Most skipped numbers end right at the next structural byte: one comparison.
        const uint8_t* next = pos + 1 < n ? buf + idx[pos + 1] : buf + len;
        const uint8_t* e = next;
        while (e > s && is_ws(e[-1])) e--;
        size_t digits = 0;
        Num kind = number_kind(s, e, digits);
        ok = kind == Num::Float || (kind == Num::Int && digits <= rq.max_int_digits);
      }
    }
    pos++;
    return ok;
  }

  template <typename F>
  bool array(size_t depth, F&& element) {
    if (depth > rq.max_depth) return false;
    pos++;
    if (peek() == ']') return ++pos, true;
    while (true) {
      if (!element()) return false;
      uint8_t c = peek();
      if (c == ',') {
        pos++;
      } else {
        return c == ']' && (++pos, true);
      }
    }
  }

  // member(key, escaped) parses the value at pos.
  template <typename F>
  bool object(size_t depth, F&& member) {
    if (depth > rq.max_depth) return false;
    pos++;
    if (peek() == '}') return ++pos, true;
    while (true) {
      const uint8_t *s, *e;
      bool escaped;
      if (!string(s, e, escaped) || peek() != ':') return false;
      pos++;
      std::string_view key(reinterpret_cast<const char*>(s), static_cast<size_t>(e - s));
      if (!member(key, escaped)) return false;
      uint8_t c = peek();
      if (c == ',') {
        pos++;
      } else {
        return c == '}' && (++pos, true);
      }
    }
  }

  // Validates the value at pos (inside a container at `depth`) and steps over it.
  bool skip(size_t depth) {
    switch (peek()) {
      case '{':
        return object(depth + 1, [&](std::string_view, bool) { return skip(depth + 1); });
      case '[':
        return array(depth + 1, [&] { return skip(depth + 1); });
      case '"': {
        const uint8_t *s, *e;
        bool escaped;
        return string(s, e, escaped);
      }
      default:
        return scalar();
    }
  }

  bool number(double& out) {
    if (pos >= n || !finite_double(buf + idx[pos], token_end(), out)) return false;
    pos++;
    return true;
  }

  bool integer(int64_t& out) {
    if (pos >= n || !small_int(buf + idx[pos], token_end(), out)) return false;
    pos++;
    return true;
  }

  bool logprobs(Choice& choice) {  // the value of "logprobs" (in a choice, itself at depth 3)
    if (is_null()) return ++pos, true;
    if (peek() != '{') return false;
    bool seen = false;
    return object(4, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      if (key != "token_logprobs") return skip(4);
      if (seen) return false;
      seen = true;
      if (is_null()) return ++pos, true;
      if (peek() != '[') return false;
      return array(5, [&] {
        double value = 0.0;
        if (is_null()) {
          pos++;
        } else if (!number(value)) {
          return false;
        }
        choice.logprobs.push_back(static_cast<float>(value));  // double, then float32
        return true;
      });
    });
  }

  bool choice(Choice& out) {
    if (peek() != '{') return false;
    static constexpr std::string_view names[] = {"index", "token_ids", "logprobs",
                                                 "finish_reason", "prompt_logprobs",
                                                 "prompt_token_ids"};
    bool seen[6] = {};
    bool has_index = false;
    bool ok = object(3, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      size_t which = 0;
      while (which < 6 && key != names[which]) which++;
      if (which == 6) return skip(3);
      if (seen[which]) return false;
      seen[which] = true;
      switch (which) {
        case 0:
          return has_index = integer(out.index);
        case 1:
          if (is_null()) return ++pos, true;
          if (peek() != '[') return false;
          return array(4, [&] {
            int64_t token;
            if (!integer(token) || token < INT32_MIN || token > INT32_MAX) return false;
            out.tokens.push_back(static_cast<int32_t>(token));
            return true;
          });
        case 2:
          return logprobs(out);
        case 3:
          if (peek() == '"') {
            const uint8_t *s, *e;
            bool esc;
            if (!string(s, e, esc) || esc) return false;
            std::string_view finish(reinterpret_cast<const char*>(s), static_cast<size_t>(e - s));
            out.stop = finish == "stop" || finish == "stop_token";
            return true;
          }
          return skip(3);
        case 4:
          out.prompt_logprobs = is_null() ? 0 : pos + 1;
          return skip(3);
        default:
          out.prompt_token_ids = pos + 1;
          return skip(3);
      }
    });
    if (!ok || !has_index) return false;
    size_t n_tokens = out.tokens.size();
    if (out.logprobs.empty()) {
      out.logprobs.assign(n_tokens, 0.0f);  // no logprobs requested: zeros
    } else if (out.logprobs.size() != n_tokens) {
      return false;
    }
    return true;
  }

  bool root(std::vector<Choice>& choices) {
    if (peek() != '{') return false;
    bool seen = false;
    bool ok = object(1, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      if (key != "choices") return skip(1);
      if (seen || peek() != '[') return false;
      seen = true;
      return array(2, [&] {
        choices.emplace_back();
        return choice(choices.back());
      });
    });
    return ok && seen && pos == n;
  }

  // One member of a prompt logprob entry: {"logprob": number|null, "rank": int, ...}.
  struct Item {
    bool object = false, rank_ok = false, logprob_ok = true;
    int64_t rank = 0;
    float logprob = kNaN;
  };
  bool item(Item& out) {  // a value in a prompt logprob entry (an object at depth 5)
    if (peek() != '{') return skip(5);  // not an object: only an error if it is read
    out.object = true;
    bool seen_rank = false, seen_logprob = false;
    return object(6, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      if (key == "rank") {
        if (seen_rank) return false;
        seen_rank = true;
        if (peek() == '-' || is_digit(peek())) {
          out.rank_ok = integer(out.rank);
          return out.rank_ok;
        }
        return skip(6);
      }
      if (key == "logprob") {
        if (seen_logprob) return false;
        seen_logprob = true;
        if (is_null()) return ++pos, true;
        double value;
        if (peek() == '-' || is_digit(peek())) {
          if (!number(value)) return false;
          out.logprob = static_cast<float>(value);
          return true;
        }
        out.logprob_ok = false;
        return skip(6);
      }
      return skip(6);
    });
  }

  struct Ranked {
    int64_t rank;
    int32_t token;
    float logprob;
  };

  bool prompt(const Choice& first, Result& out) {
    std::vector<int64_t> own_ids;
    const int64_t* tokens = rq.prompt_tokens;
    size_t n_tokens = rq.n_prompt_tokens;
    if (tokens == nullptr) {
      if (first.prompt_token_ids == 0) return false;
      pos = first.prompt_token_ids - 1;
      if (peek() != '[') return false;
      bool ok = array(4, [&] {
        int64_t token;
        if (!integer(token)) return false;
        own_ids.push_back(token);
        return true;
      });
      if (!ok) return false;
      tokens = own_ids.data();
      n_tokens = own_ids.size();
    }
    pos = first.prompt_logprobs - 1;
    if (peek() != '[') return false;
    size_t k = rq.k > 0 ? static_cast<size_t>(rq.k) : 0;
    out.has_prompt = true;
    out.prompt.assign(n_tokens, kNaN);
    out.topk_ids.assign(n_tokens * k, 0);
    out.topk_lps.assign(n_tokens * k, kTopkPadLogprob);
    std::vector<std::string_view> keys;
    std::vector<Ranked> ranked;
    size_t row = 0;
    bool ok = array(4, [&] {
      if (row >= n_tokens) return false;
      size_t i = row++;
      if (is_null()) return ++pos, true;
      if (peek() != '{') return false;
      char text[24];
      int length = std::snprintf(text, sizeof text, "%lld", static_cast<long long>(tokens[i]));
      std::string_view own_key(text, static_cast<size_t>(length));
      keys.clear();
      ranked.clear();
      bool entry_ok = object(5, [&](std::string_view key, bool escaped) {
        if (escaped) return false;
        keys.push_back(key);
        bool own = key == own_key;
        if (!own && k == 0) return skip(5);
        if (is_null()) {
          pos++;
          return k == 0;  // a null own value is skipped; with k > 0 a null item is an error
        }
        Item it;
        if (!item(it) || !it.object) return false;
        if (own) {
          if (!it.logprob_ok) return false;
          out.prompt[i] = it.logprob;
        }
        if (k == 0) return true;
        if (key.empty() || key.size() > 10 || !it.rank_ok) return false;
        int64_t token = 0;
        for (char c : key) {
          if (c < '0' || c > '9') return false;
          token = token * 10 + (c - '0');
        }
        if (token > INT32_MAX) return false;
        if (it.rank < 1 || static_cast<uint64_t>(it.rank) > k) return true;
        if (!it.logprob_ok) return false;
        ranked.push_back({it.rank, static_cast<int32_t>(token), it.logprob});
        return true;
      });
      if (!entry_ok) return false;
      std::sort(keys.begin(), keys.end());
      if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return false;
      std::stable_sort(ranked.begin(), ranked.end(),
                       [](const Ranked& a, const Ranked& b) { return a.rank < b.rank; });
      for (size_t j = 0; j < ranked.size() && j < k; j++) {
        out.topk_ids[i * k + j] = ranked[j].token;
        out.topk_lps[i * k + j] = ranked[j].logprob;
      }
      return true;
    });
    return ok && row == n_tokens;
  }
};

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

bool decode(const Request& rq, Result& out) {
  thread_local std::unique_ptr<simdjson::internal::dom_parser_implementation> stage1;
  thread_local std::vector<uint8_t> padded, scratch;
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
  Walker walk{buf, rq.len, stage1->structural_indexes.get(), stage1->n_structural_indexes, rq,
              *stage1, scratch};
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

PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS,
     "decode(body, prompt_tokens, k, max_depth, max_int_digits) -> buffers, or None when the reference must "
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
  // API_VERSION: bumped whenever decode()'s arguments or result change, so that a stale build
  // left in the tree reads as unavailable instead of failing at the first call.
  if (PyModule_AddStringConstant(m, "SIMDJSON_VERSION", HOTPATH_XSTR(SIMDJSON_VERSION)) < 0 ||
      PyModule_AddIntConstant(m, "API_VERSION", 2) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
