// impl.decode's compiled decoders: JSON number tokens checked without a branch per byte.
//
// A number is checked once its length is known (the index walk: the next structural index,
// less whitespace; the byte walk: the first byte that can end one): a short natural number
// (text_offset, token ids) in one 8-byte word; the usual forms from the 32-byte digit mask of
// two SSE2 loads and the few non-digits it points at (`quick_shape`); anything else by a mask
// per character class (`shape`) or, past 32 bytes, byte by byte. Its `Shape` (where its '.'
// and exponent are) is what floats.h reads it by.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "bytes.h"

namespace nogil {

// Where the parts of a number token of `len` bytes are: `dot` and `exp` are the offsets of
// '.' and 'e'/'E', or `len` when absent; `negative` whether it starts with '-'.
struct Shape {
  size_t len, dot, exp;
  bool negative;
  bool integer() const { return dot == len && exp == len; }
  size_t int_digits() const { return (dot < exp ? dot : exp) - negative; }
};

// JSON's grammar, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, byte by byte: any length.
inline bool shape_long(const uint8_t* s, size_t len, Shape& out) {
  const uint8_t* p = s;
  const uint8_t* e = s + len;
  out = Shape{len, len, len, *p == '-'};
  p += out.negative;
  if (*p == '0') {
    p++;
  } else if (*p >= '1' && *p <= '9') {
    p = skip_digits(p + 1);
  } else {
    return false;
  }
  if (p == e) return true;
  if (*p == '.') {
    out.dot = static_cast<size_t>(p - s);
    if (!is_digit(*++p)) return false;
    p = skip_digits(p + 1);
  }
  if ((*p | 0x20) == 'e') {
    out.exp = static_cast<size_t>(p - s);
    p++;
    p += *p == '+' || *p == '-';
    if (!is_digit(*p)) return false;
    p = skip_digits(p + 1);
  }
  return p == e;
}

#if defined(__SSE2__)
inline uint32_t bytes_eq(__m128i lo, __m128i hi, char c) {
  __m128i want = _mm_set1_epi8(c);
  return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(lo, want))) |
         static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(hi, want))) << 16;
}
inline uint32_t bytes_digit(__m128i lo, __m128i hi) {
  __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8(9);
  __m128i a = _mm_sub_epi8(lo, zero), b = _mm_sub_epi8(hi, zero);  // digits become 0..9
  return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(a, nine), a))) |
         static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(b, nine), b)))
             << 16;
}
#endif

// The same grammar for a token of 1..32 bytes as bit masks (bit i = byte i), no loop. Reads 32
// bytes from s: within the body's readable padding.
inline bool shape(const uint8_t* s, size_t len, Shape& out) {
#if defined(__SSE2__)
  if (len == 0 || len > 32) return len != 0 && shape_long(s, len, out);
  __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  uint32_t span = len == 32 ? ~0u : (1u << len) - 1;
  uint32_t digit = bytes_digit(lo, hi) & span;
  uint32_t minus = bytes_eq(lo, hi, '-') & span;
  uint32_t sign = minus | (bytes_eq(lo, hi, '+') & span);
  uint32_t dot = bytes_eq(lo, hi, '.') & span;
  __m128i lower = _mm_set1_epi8(0x20);
  uint32_t exp = bytes_eq(_mm_or_si128(lo, lower), _mm_or_si128(hi, lower), 'e') & span;
  uint32_t other = sign | dot | exp;
  uint32_t lead = minus & 1;  // a leading '-'
  uint32_t bad = span ^ (digit | other);         // a byte no number has
  bad |= ~(digit | minus) & 1;                    // starts with a digit or '-'
  bad |= ~digit & (1u << (len - 1));              // ends with a digit
  bad |= other & (other >> 1) & ~(exp & (sign >> 1));  // two non-digits only as e then sign
  bad |= sign & ~((exp << 1) | lead);             // a sign is first ('-' only) or follows e
  bad |= (dot & (dot - 1)) | (exp & (exp - 1));   // at most one '.' and one 'e'
  bad |= (exp != 0 && dot > exp);                 // the '.' before the 'e'
  bad |= (s[lead] == '0') & (digit >> (lead + 1));  // no leading zero: 0 is a whole part
  if (bad) return false;
  out = Shape{len, dot ? static_cast<size_t>(__builtin_ctz(dot)) : len,
              exp ? static_cast<size_t>(__builtin_ctz(exp)) : len, lead != 0};
  return true;
#else
  return len != 0 && shape_long(s, len, out);
#endif
}

// The digits among the first 32 bytes at s, as a bit mask (bit i = byte i).
inline uint32_t digit_mask(const uint8_t* s) {
#if defined(__SSE2__)
  return bytes_digit(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16)));
#else
  uint32_t mask = 0;
  for (int i = 0; i < 32; i++) mask |= static_cast<uint32_t>(is_digit(s[i])) << i;
  return mask;
#endif
}

// The forms numbers take in practice (-?int, -?int.frac, either with e[+-]?exp), checked
// from the digit mask and the few non-digits it points at: about a third of `shape`'s work.
// True only for a valid number (with `out` filled); false when not sure, for `shape` to decide.
[[gnu::always_inline]] inline bool quick_shape_masked(const uint8_t* s, size_t len, uint32_t digits,
                                                      Shape& out) {
  uint32_t span = static_cast<uint32_t>((1ULL << len) - 1);
  uint32_t negative = s[0] == '-';
  uint32_t other = (span & ~digits) ^ negative;  // non-digits after the sign
  size_t first = other ? static_cast<size_t>(__builtin_ctz(other)) : len;
  size_t whole = first - negative;
  if (whole == 0 || (s[negative] == '0' && whole > 1)) return false;
  if (other == 0) {
    out = Shape{len, len, len, negative != 0};
    return true;
  }
  uint32_t rest = other & (other - 1);
  size_t dot = len, exp = first;
  if (s[first] == '.') {
    exp = rest ? static_cast<size_t>(__builtin_ctz(rest)) : len;
    if (exp == first + 1) return false;  // no fraction digit
    dot = first;
    if (rest == 0) {
      out = Shape{len, dot, len, negative != 0};
      return true;
    }
    rest &= rest - 1;
  }
  if ((s[exp] | 0x20) != 'e') return false;
  size_t digits_at = exp + 1;
  if (rest != 0) {  // only a sign right after the e
    if (rest != 1u << (exp + 1) || (s[exp + 1] != '-' && s[exp + 1] != '+')) return false;
    digits_at++;
  }
  if (digits_at >= len) return false;
  out = Shape{len, dot, exp, negative != 0};
  return true;
}

inline bool quick_shape(const uint8_t* s, size_t len, Shape& out) {
  if (len > 32 || len == 0) return false;
  return quick_shape_masked(s, len, digit_mask(s), out);
}

// A non-negative integer of 1..8 digits without a leading zero (text_offset, token ids): one
// word. False when not (the other checks decide).
inline bool short_natural(const uint8_t* s, size_t len) {
  if (len > 8 || len == 0) return false;
  uint64_t v = load8(s);
  uint64_t high = (v & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL;
  uint64_t over = ((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL;
  uint64_t mask = ~0ULL >> (64 - 8 * len);  // the token's bytes
  return ((high | over) & mask) == 0 && (s[0] != '0' || len == 1);
}

inline bool any_shape(const uint8_t* s, size_t len, Shape& out) {
  return quick_shape(s, len, out) || shape(s, len, out);
}

// A JSON integer token of at most 18 digits (so it fits int64 exactly); false otherwise.
inline bool small_int(const uint8_t* s, size_t len, int64_t& out) {
  bool negative = *s == '-';
  size_t digits = len - negative;
  if (len == 0 || digits == 0 || digits > 18) return false;
  const uint8_t* p = s + negative;
  if (*p == '0' && digits > 1) return false;
  // All digits? The same nibble test as skip_digits, over the token's bytes only.
  for (size_t at = 0; at < digits; at += 8) {
    uint64_t v = load8(p + at);
    uint64_t high = (v & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL;
    uint64_t over = ((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL;
    uint64_t bad = high | over;
    size_t here = digits - at < 8 ? digits - at : 8;
    if (here < 8) bad &= (1ULL << (8 * here)) - 1;
    if (bad) return false;
  }
  int64_t value = static_cast<int64_t>(digits19(p, digits));
  out = negative ? -value : value;
  return true;
}

}  // namespace nogil
