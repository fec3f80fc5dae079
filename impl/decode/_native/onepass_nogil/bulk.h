// impl.decode._onepass_nogil's bulk checks: array elements checked 64 bytes at a time.
//
// Without a structural index each token's end depends on the token before (walk.h),
// a chain the CPU cannot run ahead on. Long regular arrays break it here: each 64-byte block
// becomes bit masks of byte classes (`Block`: two AVX2 or four SSE2 vectors), and the grammar
// of the elements is checked as relations between the masks. `naturals` and `plain_strings`
// (text_offset, token_ids; tokens) check windows that end at their last comma, so each holds
// only whole elements; `logprob_runs` and `flat_objects` (token_logprobs; top_logprobs) check
// a stream of blocks, each byte against the bytes before it with the previous block's masks
// carried in (`before`), so no block is cut short. Each answers where it stopped: the first
// byte of an element it did not check, which the walk's token-at-a-time path then decides.
//
// Reads: 64 bytes from each block start, which is at or before the array's end (a byte no
// check accepts); logprob_runs starts 32 bytes or more into the body, since the logprob
// readers load the 32 bytes before a number (common/floats.h).
#pragma once

#include <cstdint>

#include "../common/bytes.h"
#include "../common/shapes.h"
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

// Bit i: the XOR of bits 0..i of x (one carry-less multiply where the build has PCLMUL).
inline uint64_t prefix_xor(uint64_t x) {
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
inline uint64_t before(uint64_t x, uint64_t carried, int k) {
  return (x << k) | (carried >> (64 - k));
}
// The bits below the lowest set bit of x (all 64 when x is 0).
inline uint64_t below_first(uint64_t x) { return x ? (x & (0 - x)) - 1 : ~0ULL; }
// The bits up to and including bit `last`.
inline uint64_t through(int last) { return last == 63 ? ~0ULL : (2ULL << last) - 1; }

// Elements of an array from `start` (an element's first byte) on that are natural numbers
// of at most 18 digits (no leading zero) separated by bare commas, 64 bytes at a time: each
// window ends at its last comma, so it holds only whole elements; `each(first, length)`
// sees each of them. Returns where it stopped: the first byte of an element it did not
// check (the last one, or one it doubts: the general path decides those).
template <typename F>
size_t naturals(const uint8_t* buf, size_t start, F&& each) {
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
inline size_t plain_strings(const uint8_t* buf, size_t start) {
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
// previous block's masks carried): a whole part of one digit, a '.' right after it and a
// digit after the '.'; an 'e' after a digit, then a sign, two digits and the number's end;
// a '-' first or right after the 'e'. (That a digit comes before the 'e' follows.) The whole
// digit is checked itself, not left to the '.' that must follow it: a block's elements are
// taken once the block passes, and a lone '-' or an empty element can end at the block's last
// byte (its comma, where the whole digit would be), the missing '.' only seen in the next
// block. `check` answers the bytes that break it.
struct LogprobForm {
  uint64_t signed_start = 0, whole = 0, dot = 0, e = 0;  // the previous block's

  uint64_t check(uint64_t starts, uint64_t digit, uint64_t minus, uint64_t dot_now,
                 uint64_t e_now, uint64_t plus) {
    uint64_t number = digit | minus | dot_now | e_now | plus;
    uint64_t signed_now = starts & minus;
    uint64_t whole_now = (starts & ~minus) | before(signed_now, signed_start, 1);
    uint64_t e1 = before(e_now, e, 1);
    uint64_t bad = (whole_now & ~digit) | (dot_now ^ before(whole_now, whole, 1)) |
                   (before(dot_now, dot, 1) & ~digit) |
                   (minus & ~(starts | e1)) | (plus & ~e1) | (e1 & ~(minus | plus)) |
                   (before(e_now, e, 2) & ~digit) | (before(e_now, e, 3) & ~digit) |
                   (before(e_now, e, 4) & number);
    signed_start = signed_now;
    whole = whole_now;
    dot = dot_now;
    e = e_now;
    return bad;
  }
};

// Elements of an array from `start` (an element's first byte) on that are numbers in the form
// LogprobForm checks, separated by bare commas, checked 64 bytes a block as a stream; once a
// block passes, `each(first, shape)` sees each element its commas end. `each` returns false
// to stop there. Returns where it stopped: the first byte of an element it did not take (the
// block with the array's end, or anything else, leaves the elements it holds to the general
// path). Needs 32 readable bytes before `start`: the readers `each` calls load them.
template <typename F>
size_t logprob_runs(const uint8_t* buf, size_t start, F&& each) {
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
inline size_t flat_objects(const uint8_t* buf, size_t start) {
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
    uint64_t number1 = before(number, prev.number, 1);  // the byte before is in a number
    uint64_t starts = number & ~number1, after_number = number1 & ~number;
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

}  // namespace nogil
