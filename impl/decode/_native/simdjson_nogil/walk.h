// impl.decode._simdjson_nogil's walk over stage 1's structural index.
//
// One pass over the index checks the grammar of the whole body and reads what the Completion keeps.
// The values it skips (most of a body: `text_offset`, `tokens`, `top_logprobs`, the text) go
// through `skip`, one loop with an explicit stack and no call per value: a string costs one look at
// the byte before the next structural one (its closing quote; escapes were checked for the whole
// body up front), a number one `quick_shape` or word check (common/shapes.h), a literal one compare;
// arrays of scalars get a tighter loop of their own. The parts it reads (choices, `token_ids`,
// `token_logprobs`, prompt logprobs) are small object/array helpers around that loop (their readers
// are in common/reader.h). Anything outside the common shape answers false ("not sure"), and the
// reference decides.
#pragma once

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string_view>
#include <vector>

#include "../common/bytes.h"
#include "../common/floats.h"
#include "../common/request.h"
#include "../common/shapes.h"

namespace nogil {


struct IndexWalker {
  const uint8_t* buf;
  size_t len;
  const uint32_t* idx;
  size_t n;
  const Request& rq;
  uint8_t* closers;  // skip()'s stack: the closing byte of each open container, by depth
  size_t pos = 0;

  // The byte at index position p <= n + 1 (past the end: the byte after the body, see decode).
  uint8_t at(size_t p) const { return buf[idx[p]]; }
  uint8_t peek() const { return at(pos); }
  bool is_null() const { return peek() == 'n' && token_is("null"); }
  bool take_null() {
    if (!is_null()) return false;
    pos++;
    return true;
  }
  bool at_end() const { return pos == n; }

  // At most how many elements the array at pos has (each but the last takes two index
  // entries): reserved up front, no regrowth. Pages never written are never touched, so an
  // overestimate costs address space, not memory.
  size_t elements_bound() const { return (n - pos) / 2 + 1; }

  // A kept logprob, rounded correctly to a double. (logprob_double, the byte walk's reader,
  // costs this walk 7% more instructions for no time: the digit-count branches it avoids are
  // predicted here, where a number's length comes from the index.)
  bool number(double& out) {
    if (pos >= n || !finite_double(buf + idx[pos], token_len(pos), out)) return false;
    pos++;
    return true;
  }

  bool integer(int64_t& out) {
    if (pos >= n || !small_int(buf + idx[pos], token_len(pos), out)) return false;
    pos++;
    return true;
  }

  // Length of the scalar token at index position p (<= n): up to the next structural byte,
  // less whitespace.
  size_t token_len(size_t p) const {
    const uint8_t* s = buf + idx[p];
    const uint8_t* e = buf + idx[p + 1];
    while (e > s && is_ws(e[-1])) e--;
    return static_cast<size_t>(e - s);
  }
  bool token_is(std::string_view literal) const {
    return token_len(pos) == literal.size() &&
           std::memcmp(buf + idx[pos], literal.data(), literal.size()) == 0;
  }

  // The string opened at index position p (< n) closes before the next structural byte: its
  // last byte other than whitespace is the closing quote (stage 1 found where strings end).
  bool string_closes(size_t p, const uint8_t** close_out = nullptr) const {
    const uint8_t* open = buf + idx[p];
    const uint8_t* close = buf + idx[p + 1] - 1;
    while (close > open && is_ws(*close)) close--;
    if (close_out != nullptr) *close_out = close;
    return close > open && *close == '"';
  }

  // The string at pos (content in [s, e)), read: `escaped` says whether it has a backslash.
  bool string(const uint8_t*& s, const uint8_t*& e, bool& escaped) {
    const uint8_t* close;
    if (peek() != '"' || !string_closes(pos, &close)) return false;
    s = buf + idx[pos] + 1;
    e = close;
    size_t length = static_cast<size_t>(e - s);
    if (length <= 8) {  // most keys are short: one word, no call
      uint64_t v = load8(s);  // within the body's readable padding
      uint64_t x = (v ^ 0x5C5C5C5C5C5C5C5CULL) | (length == 8 ? 0 : ~0ULL << (8 * length));
      escaped = ((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL) != 0;
    } else {
      escaped = std::memchr(s, '\\', length) != nullptr;
    }
    pos++;
    return true;
  }

  bool scalar_ok(size_t p) const {
    const uint8_t* s = buf + idx[p];
    size_t length = token_len(p);
    switch (*s) {
      case 't': return length == 4 && std::memcmp(s, "true", 4) == 0;
      case 'f': return length == 5 && std::memcmp(s, "false", 5) == 0;
      case 'n': return length == 4 && std::memcmp(s, "null", 4) == 0;
      default: {
        if (short_natural(s, length)) return length <= rq.max_int_digits;
        Shape sh;
        return any_shape(s, length, sh) && (!sh.integer() || sh.int_digits() <= rq.max_int_digits);
      }
    }
  }

  // top_logprobs: skip(depth) (the byte walk's shortcut for it has no use for an index).
  bool skip_top_logprobs(size_t depth, size_t, size_t) { return skip(depth); }

  // Validates the value at pos (inside a container at `depth`) and steps over it: one loop,
  // containers on `closers`, as Python's json would accept it, nesting up to max_depth.
  bool skip(size_t depth) {
    const size_t base = depth;
    uint8_t c = peek();
  value:
    switch (c) {
      case '{':
      case '[':
        if (++depth > rq.max_depth) return false;
        closers[depth] = c + 2;  // '{' + 2 == '}', '[' + 2 == ']'
        c = at(++pos);
        if (c == closers[depth]) {
          pos++;
          depth--;
          goto after;
        }
        if (closers[depth] == '}') goto key;
        // An array of scalars (text_offset, tokens: most of a body) in a loop of its own.
        while (c != '{' && c != '[') {
          if (c == '"' ? !string_closes(pos) : !scalar_ok(pos)) return false;
          c = at(++pos);
          if (c != ',') {
            if (c != ']') return false;
            pos++;
            depth--;
            goto after;
          }
          c = at(++pos);
        }
        goto value;  // a container element: the general loop takes over
      case '"':
        if (!string_closes(pos)) return false;
        pos++;
        goto after;
      default:
        if (!scalar_ok(pos)) return false;
        pos++;
        goto after;
    }
  key:
    if (c != '"' || !string_closes(pos) || at(++pos) != ':') return false;
    c = at(++pos);
    goto value;
  after:
    if (depth == base) return true;
    c = peek();
    if (c == ',') {
      c = at(++pos);
      if (closers[depth] == '}') goto key;
      goto value;
    }
    if (c != closers[depth]) return false;
    pos++;
    depth--;
    goto after;
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

  // No bulk path for token ids here: the reader's int32_array reads each one.
  bool bulk_int32(std::vector<int32_t>&) { return true; }
  void bulk_logprobs(std::vector<float>&) {}

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
};

}  // namespace nogil
