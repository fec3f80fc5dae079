// impl.decode._onepass_nogil's walk: one pass over the body's bytes, no structural index.
//
// The same grammar walk as simdjson_nogil/walk.h (same interface, so common/reader.h reads the
// body over either), but reading the bytes directly: `pos` is always at the first byte of the
// next token, past any whitespace. A string is found and checked 16 bytes a step (its closing
// quote, escapes, control characters; UTF-8 (common/utf8.h) only when it has a byte >= 0x80); a number's end is the first byte valid JSON can follow it with, and its grammar
// is checked from the same two 16-byte loads (common/shapes.h). Nothing is indexed first, so
// there is no 4-bytes-per-token index to write and read back, but each token's end is known
// only once the token before it is read: a chain from token to token. Where a body is long and
// regular, arrays break that chain, checked 64 bytes at a time from byte-class masks
// (bulk.h: text_offset, token_ids, tokens, the kept token_logprobs and the skipped
// top_logprobs objects; escapes and, in the AVX2 build, UTF-8 included). Anything they doubt
// goes through the token-at-a-time path, which decides.
//
// Reads: up to 64 bytes past a position at or before the end (the caller pads, see decode),
// and the byte at the end must be one no rule accepts (a NUL).
#pragma once

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string_view>
#include <vector>

#include "../common/bytes.h"
#include "../common/escapes.h"
#include "../common/floats.h"
#include "../common/request.h"
#include "../common/shapes.h"
#include "../common/utf8.h"
#include "bulk.h"
#include "echo.h"

namespace nogil {

struct ByteWalker {
  const uint8_t* buf;
  size_t len;
  const Request& rq;
  uint8_t* closers;  // skip()'s stack: the closing byte of each open container, by depth
  size_t pos = 0;  // always at a byte other than whitespace (or at len)
  // While skip_top_logprobs checks a top_logprobs array (at depth `depth`; 0: none): the next
  // elements of the `tokens` and `token_logprobs` arrays its objects may repeat (echo.h).
  struct Echo {
    size_t tokens = 0, logprobs = 0, depth = 0;
  } echo;

  uint8_t peek() const { return buf[pos]; }
  void ws() {
    while (is_ws(buf[pos])) pos++;
  }
  // Moves to p, then past any whitespace.
  void go(size_t p) {
    pos = p;
    if (is_ws(buf[pos])) ws();
  }
  void step() { go(pos + 1); }
  bool at_end() const { return pos == len; }
  bool is_null() const { return peek() == 'n' && std::memcmp(buf + pos, "null", 4) == 0; }
  bool take_null() {
    if (!is_null()) return false;
    go(pos + 4);
    return true;
  }
  size_t elements_bound() const { return (len - pos) / 2 + 1; }

  // The string whose opening quote is at p: true with `end` just past its closing quote, its
  // content checked: no control character, every escape valid, UTF-8 valid (only checked for a
  // string with a byte >= 0x80). 16 bytes a step.
  bool string_at(size_t p, size_t& end, bool& escaped) const {
    const uint8_t* s = buf + p + 1;
    const uint8_t* q = s;
    escaped = false;
    uint32_t high = 0;
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), slash = _mm_set1_epi8('\\'),
                  space = _mm_set1_epi8(0x20);
    while (true) {
      __m128i v = load16(q);
      uint32_t upper = static_cast<uint32_t>(_mm_movemask_epi8(v));  // bytes >= 0x80
      uint32_t m = static_cast<uint32_t>(_mm_movemask_epi8(
                       _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, slash)))) |
                   (static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmplt_epi8(v, space))) & ~upper);
      if (m == 0) {
        high |= upper;
        q += 16;
        continue;
      }
      unsigned at = static_cast<unsigned>(__builtin_ctz(m));
      high |= upper & ((1u << at) - 1);
      q += at;
      if (*q == '"') break;
      if (*q != '\\') return false;  // a control character (or the NUL past the end)
      size_t e = escape_len(q);
      if (e == 0) return false;
      escaped = true;
      q += e;
    }
#else
    while (true) {
      uint8_t c = *q;
      if (c == '"') break;
      if (c == '\\') {
        size_t e = escape_len(q);
        if (e == 0) return false;
        escaped = true;
        q += e;
        continue;
      }
      if (c < 0x20) return false;
      high |= c >> 7;
      q++;
    }
#endif
    if (high != 0 && !utf8_valid(s, static_cast<size_t>(q - s))) return false;
    end = static_cast<size_t>(q + 1 - buf);
    return true;
  }

  bool string(const uint8_t*& s, const uint8_t*& e, bool& escaped) {
    size_t end;
    if (peek() != '"' || !string_at(pos, end, escaped)) return false;
    s = buf + pos + 1;
    e = buf + end - 1;
    go(end);
    return true;
  }
  bool skip_string() {
    size_t end;
    bool escaped;
    if (!string_at(pos, end, escaped)) return false;
    go(end);
    return true;
  }

  // The number token at s: its length (to the first byte valid JSON can follow a number with:
  // ',', ']', '}', whitespace, or the NUL past the end; anything else in between fails its
  // grammar) and its shape, from one 32-byte load pair; false when it is not a JSON number.
  [[gnu::always_inline]] static bool number_token(const uint8_t* s, size_t& len, Shape& sh) {
#if defined(__SSE2__)
    __m128i lo = load16(s), hi = load16(s + 16);
    uint32_t term = ends(lo) | ends(hi) << 16;
    if (term != 0) {
      len = static_cast<size_t>(__builtin_ctz(term));
      if (len == 0) return false;
      return quick_shape_masked(s, len, bytes_digit(lo, hi), sh) || shape(s, len, sh);
    }
    len = 32;
    while (true) {
      uint32_t more = ends(load16(s + len));
      if (more) {
        len += static_cast<size_t>(__builtin_ctz(more));
        return shape_long(s, len, sh);
      }
      len += 16;
    }
#else
    len = 0;
    while (!(s[len] == ',' || (s[len] | 0x20) == '}' || s[len] <= ' ' || s[len] >= 0x80)) len++;
    return len != 0 && shape_long(s, len, sh);
#endif
  }
#if defined(__SSE2__)
  static uint32_t ends(__m128i v) {
    __m128i end = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(',')),
                               _mm_cmpeq_epi8(_mm_or_si128(v, _mm_set1_epi8(0x20)),
                                              _mm_set1_epi8('}')));
    end = _mm_or_si128(end, _mm_cmplt_epi8(v, _mm_set1_epi8(0x21)));
    return static_cast<uint32_t>(_mm_movemask_epi8(end));
  }
#endif

  // The scalar at pos (not a string): checked, stepped over.
  bool skip_scalar() {
    const uint8_t* s = buf + pos;
    size_t length;
    switch (*s) {
      case 't': length = 4; if (std::memcmp(s, "true", 4) != 0) return false; break;
      case 'f': length = 5; if (std::memcmp(s, "false", 5) != 0) return false; break;
      case 'n': length = 4; if (std::memcmp(s, "null", 4) != 0) return false; break;
      default: {
        Shape sh;
        if (!number_token(s, length, sh) ||
            (sh.integer() && sh.int_digits() > rq.max_int_digits)) {
          return false;
        }
      }
    }
    go(pos + length);
    return true;
  }

  bool number(double& out) {
    const uint8_t* s = buf + pos;
    size_t length;
    Shape sh;
    if (!number_token(s, length, sh)) return false;
    // logprob_double reads 32 bytes before s: any kept number is further into the body.
    if (!(pos >= 32 && logprob_double(s, length, sh, out)) && !shaped_double(s, length, sh, out)) {
      return false;
    }
    go(pos + length);
    return true;
  }

  bool integer(int64_t& out) {
    const uint8_t* s = buf + pos;
    size_t length;
    Shape sh;
    if (!number_token(s, length, sh) || !sh.integer() || sh.int_digits() > 18) return false;
    int64_t value = static_cast<int64_t>(digits19(s + sh.negative, sh.int_digits()));
    out = sh.negative ? -value : value;
    go(pos + length);
    return true;
  }

  bool skip(size_t depth) {
    const size_t base = depth;
    uint8_t c = peek();
#if !defined(__AVX2__)
    // The baseline build leaves strings with a byte >= 0x80 to the walk, so on non-ASCII text
    // (top_logprobs keys) its bulk checks fail element after element, each after reading a
    // block or two: after one that took nothing, the next kBulkCooldown elements go one at a
    // time (multilingual json, 262144 tokens: 92 ms with a try per element, 49 ms before the
    // bulk checks took escapes). The AVX2 build takes such text, and tries every element.
    constexpr unsigned kBulkCooldown = 8;
    unsigned cooldown = 0;
#endif
  value:
    switch (c) {
      case '{':
      case '[':
        if (++depth > rq.max_depth) return false;
        closers[depth] = c + 2;
        step();
        c = peek();
        if (c == closers[depth]) {
          step();
          depth--;
          goto after;
        }
        if (closers[depth] == '}') goto key;
        goto elements;
      case '"':
        if (!skip_string()) return false;
        goto after;
      default:
        if (!skip_scalar()) return false;
        goto after;
    }
  key:
    if (c != '"' || !skip_string() || peek() != ':') return false;
    step();
    c = peek();
    goto value;
  elements:  // c is the first byte of an array element
    while (true) {
      // Runs of strings, numbers or flat objects in bulk; the rest one at a time.
      size_t bulk = pos;
#if !defined(__AVX2__)
      if (cooldown) {
        cooldown--;
      } else
#endif
      {
        if (c == '{' && depth == echo.depth) bulk = echoed_objects();
        if (bulk == pos) {
          bulk = c == '"'     ? plain_strings(buf, pos)
                 : c == '{'   ? flat_objects(buf, pos)
                 : is_digit(c) ? naturals(buf, pos, [](const uint8_t*, size_t) {})
                               : pos;
        }
        if (bulk == pos && (c == '-' || is_digit(c))) {
          auto any = [](const uint8_t*, const Shape&) { return true; };
          bulk = logprob_runs<false>(buf, pos, any);
          if (bulk == pos) bulk = logprob_runs<true>(buf, pos, any);
        }
#if !defined(__AVX2__)
        if (bulk == pos) cooldown = kBulkCooldown;
#endif
      }
      if (bulk != pos) {
        go(bulk);
        c = peek();
        continue;
      }
      if (c == '{' || c == '[') goto value;
      if (c == '"' ? !skip_string() : !skip_scalar()) return false;
      c = peek();
      if (c != ',') {
        if (c != ']') return false;
        step();
        depth--;
        goto after;
      }
      step();
      c = peek();
    }
  after:
    if (depth == base) return true;
    c = peek();
    if (c == ',') {
      step();
      c = peek();
      if (closers[depth] == '}') goto key;
      goto elements;
    }
    if (c != closers[depth]) return false;
    step();
    depth--;
    goto after;
  }


  // top_logprobs, checked first against the tokens and logprobs the walk has checked:
  // echo_walk.h.
  bool skip_top_logprobs(size_t depth, size_t tokens_at, size_t logprobs_at);
  size_t echoed_objects();
  bool more_members(size_t depth);

  // Token ids in bulk (the reader's int32_array calls it before each id it reads itself):
  // whole windows of naturals from pos into `out`, stopping at an id it did not take. False
  // when one of them does not fit int32.
  bool bulk_int32(std::vector<int32_t>& out) {
    if (!is_digit(peek())) return true;
    uint64_t high = 0;  // the bits of every id above int32's, or'ed
    go(naturals(buf, pos, [&](const uint8_t* s, size_t length) {
      // an id has at most 6 digits in every vocabulary we know: one word (digits8), a
      // branch that never changes its mind; naturals hands over at most 18 digits
      uint64_t value = length <= 8 ? digits8(s, static_cast<unsigned>(length)) : digits19(s, length);
      high |= value >> 31;
      out.push_back(static_cast<int32_t>(value));
    }));
    return high == 0;
  }

  // Kept logprobs in bulk (the reader's logprob array calls it before each one it reads
  // itself): whole windows of logprob_runs from pos into `out`, each read as number() reads
  // it; one it cannot read stops the run there (the general path decides it).
  void bulk_logprobs(std::vector<float>& out) {
    if (!is_digit(peek()) && peek() != '-') return;
    // the narrow form (one whole digit, two exponent digits) first; where it takes nothing,
    // the whole form (bulk.h)
    size_t end = logprob_runs<false>(buf, pos, [&](const uint8_t* s, const Shape& sh) {
      return read_logprob<false>(s, sh, out);
    });
    if (end == pos) {
      end = logprob_runs<true>(buf, pos, [&](const uint8_t* s, const Shape& sh) {
        return read_logprob<true>(s, sh, out);
      });
    }
    go(end);
  }
  // A number logprob_runs passed (in its whole form with `wide`) into `out`, read as number()
  // reads it; false when it cannot be (the general path decides it).
  template <bool wide>
  [[gnu::always_inline]] static bool read_logprob(const uint8_t* s, const Shape& sh,
                                                  std::vector<float>& out) {
    double value;
    if (!checked_logprob_double<wide>(s, sh.len, sh.dot, sh.exp, sh.negative, value) &&
        !general_double(s, sh.len, value)) {
      return false;
    }
    out.push_back(static_cast<float>(value));  // double, then float32
    return true;
  }
  // The general reader out of line, from the bytes: what checked_logprob_double leaves (~1 in
  // 512 roundings, more than 19 significant digits) is rare, and inline its code (and the
  // Shape it would take, kept in memory for it) took registers and stores from the common path.
  [[gnu::noinline]] static bool general_double(const uint8_t* s, size_t len, double& out) {
    return finite_double(s, len, out);
  }

  template <typename F>
  bool array(size_t depth, F&& element) {
    if (depth > rq.max_depth) return false;
    step();
    if (peek() == ']') return step(), true;
    while (true) {
      if (!element()) return false;
      uint8_t c = peek();
      if (c == ',') {
        step();
      } else {
        return c == ']' && (step(), true);
      }
    }
  }

  template <typename F>
  bool object(size_t depth, F&& member) {
    if (depth > rq.max_depth) return false;
    step();
    if (peek() == '}') return step(), true;
    while (true) {
      const uint8_t *s, *e;
      bool escaped;
      if (!string(s, e, escaped) || peek() != ':') return false;
      step();
      std::string_view key(reinterpret_cast<const char*>(s), static_cast<size_t>(e - s));
      if (!member(key, escaped)) return false;
      uint8_t c = peek();
      if (c == ',') {
        step();
      } else {
        return c == '}' && (step(), true);
      }
    }
  }
};

}  // namespace nogil

#include "echo_walk.h"  // ByteWalker's top_logprobs methods, which need it whole
