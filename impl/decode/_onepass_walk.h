// impl.decode._onepass_nogil's walk: one pass over the body's bytes, no structural index.
//
// The same grammar walk as _simdjson_nogil_walk.h (same interface, so _nogil_body.h reads the
// body over either), but reading the bytes directly: `pos` is always at the first byte of the
// next token, past any whitespace. A string is found and checked 16 bytes a step (its closing
// quote, escapes, control characters; UTF-8 by simdjson's validator only when it has a byte
// >= 0x80); a number's end is the first byte valid JSON can follow it with, and its grammar
// is checked from the same two 16-byte loads (_nogil_numbers.h). Nothing is indexed first, so
// there is no 4-bytes-per-token index to write and read back, but each token's end is known
// only once the token before it is read: a chain from token to token. Where a body is long and
// regular, arrays break that chain, checked 64 bytes at a time from byte-class masks (`Block`:
// two AVX2 or four SSE2 vectors): runs of natural numbers (text_offset, token_ids) and of plain
// ASCII strings (tokens), each window ending at its last comma; the kept logprobs and the
// top_logprobs objects as a stream of blocks, the grammar as relations between the masks,
// each byte against the bytes before it (the previous block's masks carried in). Anything they
// doubt goes through the token-at-a-time path, which decides.
//
// Reads: up to 64 bytes past a position at or before the end (the caller pads, see decode),
// and the byte at the end must be one no rule accepts (a NUL).
#pragma once

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string_view>
#include <vector>

#include "_nogil_numbers.h"
#include "_nogil_request.h"
#if defined(__AVX2__) || defined(__PCLMUL__)
#include <immintrin.h>
#endif

namespace nogil {

#if defined(__SSE2__)
inline __m128i load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The 64 bytes at s, loaded once, and masks of byte classes over them (bit i: byte i is of
// the class): two AVX2 vectors where the build targets AVX2, else four SSE2 ones.
class Block {
 public:
  explicit Block(const uint8_t* s) {
    for (int i = 0; i < kVectors; i++) v_[i] = load(s + i * kWidth);
  }
  uint64_t eq(char c) const {
    return mask([c](Vec x) { return cmpeq(x, set1(c)); });
  }
  uint64_t digits() const {  // '0'..'9': x - '0' is at most 9, unsigned
    return mask([](Vec x) {
      Vec d = sub(x, set1('0'));
      return cmpeq(min_u(d, set1(9)), d);
    });
  }
  uint64_t odd() const {  // a backslash, a control byte or a byte >= 0x80 (signed < 0x20)
    return mask([](Vec x) { return bor(cmpeq(x, set1('\\')), cmpgt(set1(0x20), x)); });
  }

 private:
#if defined(__AVX2__)
  using Vec = __m256i;
  static constexpr int kWidth = 32;
  static Vec load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const Vec*>(p)); }
  static Vec set1(char c) { return _mm256_set1_epi8(c); }
  static Vec cmpeq(Vec a, Vec b) { return _mm256_cmpeq_epi8(a, b); }
  static Vec cmpgt(Vec a, Vec b) { return _mm256_cmpgt_epi8(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_epi8(a, b); }
  static Vec min_u(Vec a, Vec b) { return _mm256_min_epu8(a, b); }
  static Vec bor(Vec a, Vec b) { return _mm256_or_si256(a, b); }
  static uint64_t bits(Vec a) { return static_cast<uint32_t>(_mm256_movemask_epi8(a)); }
#else
  using Vec = __m128i;
  static constexpr int kWidth = 16;
  static Vec load(const uint8_t* p) { return load16(p); }
  static Vec set1(char c) { return _mm_set1_epi8(c); }
  static Vec cmpeq(Vec a, Vec b) { return _mm_cmpeq_epi8(a, b); }
  static Vec cmpgt(Vec a, Vec b) { return _mm_cmpgt_epi8(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm_sub_epi8(a, b); }
  static Vec min_u(Vec a, Vec b) { return _mm_min_epu8(a, b); }
  static Vec bor(Vec a, Vec b) { return _mm_or_si128(a, b); }
  static uint64_t bits(Vec a) { return static_cast<uint32_t>(_mm_movemask_epi8(a)); }
#endif
  static constexpr int kVectors = 64 / kWidth;
  template <typename Test>
  uint64_t mask(Test&& test) const {
    uint64_t out = 0;
    for (int i = 0; i < kVectors; i++) out |= bits(test(v_[i])) << (i * kWidth);
    return out;
  }
  Vec v_[kVectors];
};
#endif

struct Walker {
  const uint8_t* buf;
  size_t len;
  const Request& rq;
  uint8_t* closers;  // skip()'s stack: the closing byte of each open container, by depth
  size_t pos = 0;  // always at a byte other than whitespace (or at len)

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
  // content checked: no control character, every escape valid, UTF-8 valid (by simdjson's
  // validator, only for a string with a byte >= 0x80). 16 bytes a step.
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
    if (high != 0 &&
        !simdjson::validate_utf8(reinterpret_cast<const char*>(s), static_cast<size_t>(q - s))) {
      return false;
    }
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

  // Bit i: the XOR of bits 0..i of x (one carry-less multiply where the build has PCLMUL).
  static uint64_t prefix_xor(uint64_t x) {
#if defined(__PCLMUL__)
    return static_cast<uint64_t>(_mm_cvtsi128_si64(
        _mm_clmulepi64_si128(_mm_cvtsi64_si128(static_cast<int64_t>(x)), _mm_set1_epi8(-1), 0)));
#else
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    return x ^ (x << 32);
#endif
  }
  // x moved k (1..63) bytes on: bit i is bit i - k of x, the low k bits the top k of `carried`
  // (the same mask of the block before).
  static uint64_t before(uint64_t x, uint64_t carried, int k) {
    return (x << k) | (carried >> (64 - k));
  }
  // The bits below the lowest set bit of x (all 64 when x is 0).
  static uint64_t below_first(uint64_t x) { return x ? (x & (0 - x)) - 1 : ~0ULL; }
  // The bits up to and including bit `last`.
  static uint64_t through(int last) { return last == 63 ? ~0ULL : (2ULL << last) - 1; }

  // Elements of an array from `start` (an element's first byte) on that are natural numbers
  // of at most 18 digits (no leading zero) separated by bare commas, 64 bytes at a time: each
  // window ends at its last comma, so it holds only whole elements; `each(first, length)`
  // sees each of them. Returns where it stopped: the first byte of an element it did not
  // check (the last one, or one it doubts: the general path decides those).
  template <typename F>
  size_t naturals(size_t start, F&& each) const {
#if defined(__SSE2__)
    while (true) {
      const uint8_t* s = buf + start;
      Block block(s);
      uint64_t digit = block.digits(), comma = block.eq(',');
      comma &= below_first(~(digit | comma));  // the first byte of neither kind stops it
      if (comma == 0) return start;
      int last = 63 - __builtin_clzll(comma);
      uint64_t window = through(last);
      uint64_t starts = ((comma << 1) | 1) & window;
      uint64_t zero = block.eq('0');
      if ((starts & comma) | (starts & zero & (digit >> 1))) return start;
      size_t first = 0;
      while (comma) {
        size_t end = static_cast<size_t>(__builtin_ctzll(comma));
        if (end - first > 18) return start + first;
        each(s + first, end - first);
        first = end + 1;
        comma &= comma - 1;
      }
      start += first;
    }
#else
    (void)each;
    return start;
#endif
  }

  // Elements of an array from `start` (an opening quote) on that are plain strings (ASCII
  // without control characters or backslashes) separated by bare commas, 64 bytes at a
  // time: the quotes pair up, so which bytes are inside a string is a prefix XOR of the quote
  // mask, and each window ends at its last comma outside the strings. Returns where it
  // stopped: the first byte of an element it did not check.
  size_t plain_strings(size_t start) const {
#if defined(__SSE2__)
    while (true) {
      Block block(buf + start);
      uint64_t quote = block.eq('"'), comma = block.eq(',');
      uint64_t valid = below_first(block.odd());
      uint64_t inside = prefix_xor(quote);  // 1 from an opening quote up to its closing one
      uint64_t between = ~inside & ~quote & valid;  // outside every string
      uint64_t separators = between & comma;
      if (separators == 0) return start;
      int last = 63 - __builtin_clzll(separators);
      uint64_t window = through(last);
      uint64_t closes = quote & ~inside & window;
      uint64_t opens = quote & inside & window;
      // Open, close, separator, open, ...: anything else outside a string breaks the chain.
      if (((closes << 1) & window) != separators || (((separators << 1) & window) | 1) != opens) {
        return start;
      }
      start += static_cast<size_t>(last) + 1;
    }
#else
    return start;
#endif
  }

  // The form vLLM prints logprobs in, -?d.d+(e[+-]dd)?, checked over a stream of 64-byte
  // blocks as relations between byte-class masks, each byte against the bytes before it (the
  // previous block's masks carried): a '.' right after each number's one whole digit and a
  // digit after the '.'; an 'e' after a digit, then a sign, two digits and the number's end;
  // a '-' first or right after the 'e'. (That the whole part is a digit follows.) `check`
  // answers the bytes that break it.
  struct LogprobForm {
    uint64_t signed_start = 0, whole = 0, dot = 0, e = 0, digit = 0;  // the previous block's

    uint64_t check(uint64_t starts, uint64_t digit_now, uint64_t minus, uint64_t dot_now,
                   uint64_t e_now, uint64_t plus) {
      uint64_t number = digit_now | minus | dot_now | e_now | plus;
      uint64_t signed_now = starts & minus;
      uint64_t whole_now = (starts & ~minus) | before(signed_now, signed_start, 1);
      uint64_t e1 = before(e_now, e, 1);
      uint64_t bad = (dot_now ^ before(whole_now, whole, 1)) |
                     (before(dot_now, dot, 1) & ~digit_now) | (minus & ~(starts | e1)) |
                     (plus & ~e1) | (e_now & ~before(digit_now, digit, 1)) |
                     (e1 & ~(minus | plus)) | (before(e_now, e, 2) & ~digit_now) |
                     (before(e_now, e, 3) & ~digit_now) | (before(e_now, e, 4) & number);
      signed_start = signed_now;
      whole = whole_now;
      dot = dot_now;
      e = e_now;
      digit = digit_now;
      return bad;
    }
  };

  // Elements of an array from `start` (an element's first byte) on that are numbers printed
  // the way vLLM prints logprobs, -?d.d+ with maybe e[+-]dd, separated by bare commas. Checked
  // 64 bytes a block as a stream, as relations between the byte-class masks, each byte against
  // the bytes before it (a '.' right after each element's one whole digit, a digit after it;
  // an 'e' after a digit and before a sign, two digits and the comma; a '-' first or after the
  // 'e'); once a block passes, `each(first, shape)` sees each element its commas end. `each`
  // returns false to stop there. Returns where it stopped: the first byte of an element it did
  // not take (the block with the array's end, or anything else, leaves the elements it holds
  // to the general path). Needs 32 readable bytes before `start` (logprob_double reads them).
  template <typename F>
  size_t logprob_runs(size_t start, F&& each) const {
#if defined(__SSE2__)
    if (start < 32) return start;
    uint64_t prev_comma = 1ULL << 63;  // as if a comma came before the first element
    LogprobForm form;
    size_t first = start;  // the first element not taken yet
    for (size_t at = start;; at += 64) {
      Block block(buf + at);
      uint64_t digit = block.digits(), comma = block.eq(','), minus = block.eq('-');
      uint64_t dot = block.eq('.'), e = block.eq('e'), plus = block.eq('+');
      uint64_t bad = ~(digit | comma | minus | dot | e | plus) |
                     form.check(before(comma, prev_comma, 1), digit, minus, dot, e, plus);
      if (bad) return first;
      for (uint64_t ends = comma; ends; ends &= ends - 1) {
        size_t end = at + static_cast<size_t>(__builtin_ctzll(ends));
        const uint8_t* s = buf + first;
        size_t length = end - first;
        bool negative = *s == '-';
        // an exponent is e[+-]dd, so its 'e' is 4 bytes from the end (for a shorter number
        // that byte is the comma before it)
        size_t exp = buf[end - 4] == 'e' ? length - 4 : length;
        if (!each(s, Shape{length, size_t{negative} + 1, exp, negative})) return first;
        first = end + 1;
      }
      prev_comma = comma;
    }
#else
    (void)each;
    return start;
#endif
  }

  // Elements of an array from `start` (an opening brace) on that are flat objects the way
  // vLLM prints top_logprobs, {"key":number,...}: keys plain strings (ASCII without control
  // characters or backslashes), values numbers in the logprob form, no whitespace. Checked
  // 64 bytes a block as a stream: which bytes are in strings is a prefix XOR of the quotes,
  // which are in objects one of the braces (each carried into the next block), and the
  // grammar is relations between the class masks, each byte against the bytes before it
  // (`before` shifts a mask by k bytes, the previous block's top bits carried in). Returns
  // where it stopped: the first byte of the element after the last comma between objects in
  // the blocks it passed (an element it did not check, left to the general path).
  size_t flat_objects(size_t start) const {
#if defined(__SSE2__)
    struct Carried {  // the previous block's masks
      uint64_t number = 0, colon = 0, opens_next = 0, close = 0, outer = 1ULL << 63;
      uint64_t inside = 0, object = 0;  // all ones when the previous block ended in one
    } prev;
    LogprobForm form;
    size_t resume = start;
    for (size_t at = start;; at += 64) {
      Block block(buf + at);
      uint64_t quote = block.eq('"');
      uint64_t inside = prefix_xor(quote) ^ prev.inside;  // an opening quote and its bytes
      uint64_t out = ~(inside | quote);
      uint64_t open = block.eq('{') & out, close = block.eq('}') & out;
      uint64_t comma = block.eq(',') & out, colon = block.eq(':') & out;
      uint64_t digit = block.digits() & out, minus = block.eq('-') & out;
      uint64_t dot = block.eq('.') & out, e = block.eq('e') & out, plus = block.eq('+') & out;
      uint64_t number = digit | minus | dot | e | plus;
      uint64_t object = prefix_xor(open | close) ^ prev.object;  // a '{' up to before its '}'
      uint64_t opens = quote & inside;
      uint64_t members = comma & object, outer = comma & ~object;
      uint64_t starts = number & ~before(number, prev.number, 1);
      uint64_t after_number = before(number, prev.number, 1) & ~number;
      // What may follow what: '{' only after a comma between objects (or first), then a key;
      // a key only after '{' or a comma between members; a number only after ':'; after a
      // number only a comma between members or '}'; after '}' only a comma between objects.
      // (That each key's closing quote is followed by ':', that braces take turns and that
      // numbers are only in objects follows from these.)
      uint64_t bad = (block.odd() & inside) | (out & ~(open | close | colon | comma | number)) |
                     (open ^ before(outer, prev.outer, 1)) |
                     (opens ^ before(open | members, prev.opens_next, 1)) |
                     (starts ^ before(colon, prev.colon, 1)) | ((members | close) ^ after_number) |
                     (outer ^ before(close, prev.close, 1)) |
                     form.check(starts, digit, minus, dot, e, plus);
      if (bad) return resume;
      if (outer) resume = at + 64 - static_cast<size_t>(__builtin_clzll(outer));
      prev = Carried{number, colon, open | members, close, outer, 0 - (inside >> 63),
                     0 - (object >> 63)};
    }
#else
    return start;
#endif
  }

  bool skip(size_t depth) {
    const size_t base = depth;
    uint8_t c = peek();
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
      // Runs of plain strings, numbers or flat objects in bulk; the rest one at a time.
      size_t bulk = c == '"'     ? plain_strings(pos)
                    : c == '{'   ? flat_objects(pos)
                    : is_digit(c) ? naturals(pos, [](const uint8_t*, size_t) {})
                                  : pos;
      if (bulk == pos && (c == '-' || is_digit(c))) {
        bulk = logprob_runs(pos, [](const uint8_t*, const Shape&) { return true; });
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


  // Token ids in bulk (the reader's int32_array calls it before each id it reads itself):
  // whole windows of naturals from pos into `out`, stopping at an id it did not take. False
  // when one of them does not fit int32.
  bool bulk_int32(std::vector<int32_t>& out) {
    if (!is_digit(peek())) return true;
    bool fits = true;
    go(naturals(pos, [&](const uint8_t* s, size_t length) {
      uint64_t value = digits19(s, length);
      fits &= value <= INT32_MAX;
      out.push_back(static_cast<int32_t>(value));
    }));
    return fits;
  }

  // Kept logprobs in bulk (the reader's logprob array calls it before each one it reads
  // itself): whole windows of logprob_runs from pos into `out`, each read as number() reads
  // it; one it cannot read stops the run there (the general path decides it).
  void bulk_logprobs(std::vector<float>& out) {
    if (!is_digit(peek()) && peek() != '-') return;
    go(logprob_runs(pos, [&](const uint8_t* s, const Shape& sh) {
      double value;
      if (!checked_logprob_double(s, sh.len, sh.exp, sh.negative, value) &&
          !shaped_double(s, sh.len, sh, value)) {
        return false;
      }
      out.push_back(static_cast<float>(value));  // double, then float32
      return true;
    }));
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
