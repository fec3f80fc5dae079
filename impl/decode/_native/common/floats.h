// impl.decode's compiled decoders: a checked number token read as a correctly rounded double.
//
// A kept logprob as vLLM prints it (d.ddd, maybe with an exponent) is read without a branch on
// its digit count (`logprob_double`: its fraction's digits from two 16-byte loads that end where
// it ends, sixteen at a time by SSE2 multiply-adds) and rounded correctly by the Eisel-Lemire
// step of simdjson's `compute_float_64` (its table, without its Clinger shortcut); any other form
// goes the general way (`shaped_double`); what Eisel-Lemire cannot decide goes to simdjson's own
// `parse_double`, and more than 19 significant digits to the reference.
#pragma once

#include <simdjson.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "bytes.h"
#include "shapes.h"

namespace nogil {

// mantissa x 10^power (mantissa != 0, power within simdjson's table) correctly rounded to a
// double: the Eisel-Lemire step of simdjson's `compute_float_64`, without its Clinger shortcut
// (whose division and extra branch cost more than they save on 16-17 digit logprobs) and
// without its subnormal branch. False when it cannot decide (or the result is subnormal or
// infinite): the caller then asks simdjson's full parser.
inline bool eisel_lemire(int64_t power, uint64_t mantissa, bool negative, double& out) {
  int64_t exponent = (((152170 + 65536) * power) >> 16) + 1024 + 63;
  int lz = __builtin_clzll(mantissa);
  mantissa <<= lz;
  const uint32_t index = 2 * static_cast<uint32_t>(power - simdjson::internal::smallest_power);
  const uint64_t* five = simdjson::internal::power_of_five_128;
  __uint128_t first = static_cast<__uint128_t>(mantissa) * five[index];
  uint64_t low = static_cast<uint64_t>(first), high = static_cast<uint64_t>(first >> 64);
  if ((high & 0x1FF) == 0x1FF) {
    __uint128_t second = static_cast<__uint128_t>(mantissa) * five[index + 1];
    uint64_t carry = static_cast<uint64_t>(second >> 64);
    low += carry;
    if (carry > low) high++;
    if (low == ~0ULL) return false;
  }
  uint64_t upperbit = high >> 63;
  uint64_t bits = high >> (upperbit + 9);
  lz += static_cast<int>(1 ^ upperbit);
  int64_t real_exponent = exponent - lz;
  if (real_exponent <= 0) return false;
  if (low <= 1 && power >= -4 && power <= 23 && (bits & 3) == 1) {  // exactly halfway: to even
    if ((bits << (upperbit + 64 - 53 - 2)) == high) bits &= ~1ULL;
  }
  bits += bits & 1;
  bits >>= 1;
  if (bits >= (1ULL << 53)) {
    bits = 1ULL << 52;
    real_exponent++;
  }
  if (real_exponent > 2046) return false;
  bits &= ~(1ULL << 52);
  bits |= static_cast<uint64_t>(real_exponent) << 52 | static_cast<uint64_t>(negative) << 63;
  std::memcpy(&out, &bits, sizeof out);
  return true;
}

// Adds the exponent of the number token at s (if it has one) to `power`; false when the
// exponent has more than `max_digits` digits (max_digits <= 8).
[[gnu::always_inline]] inline bool add_exponent(const uint8_t* s, size_t len, const Shape& sh,
                                                size_t max_digits, int64_t& power) {
  if (sh.exp == len) return true;
  const uint8_t* p = s + sh.exp + 1;
  bool negative = *p == '-';
  p += *p == '-' || *p == '+';
  size_t digits = static_cast<size_t>(s + len - p);
  if (digits > max_digits) return false;
  int64_t magnitude = digits8(p, static_cast<unsigned>(digits));
  power += negative ? -magnitude : magnitude;
  return true;
}

// simdjson's own parser (correct up to 19 significant digits), out of line: rarely needed.
[[gnu::noinline]] inline bool slow_double(const uint8_t* s, double& out) {
  return !simdjson::fallback::numberparsing::parse_double(s).get(out) && std::isfinite(out);
}

// A JSON number token as Python's float() of it, finite; false for anything else (or beyond 18
// integer digits, or a double that overflows: the reference decides those). An integer (Python
// reads it as an int, so -0 is 0.0) is converted exactly; a fraction or exponent is rounded
// correctly, by Eisel-Lemire where the significant digits fit 19, else by simdjson's parser
// (0.ddd with more than 19 significant digits: not sure, see below).
[[gnu::always_inline]] inline bool shaped_double(const uint8_t* s, size_t len, const Shape& sh,
                                                 double& out) {
  size_t int_digits = sh.int_digits();
  if (int_digits > 18) return false;
  if (sh.integer()) {
    uint64_t value = digits19(s + sh.negative, int_digits);
    out = static_cast<double>(sh.negative ? -static_cast<int64_t>(value)
                                          : static_cast<int64_t>(value));
    return true;
  }
  const uint8_t* whole = s + sh.negative;
  const uint8_t* frac = s + sh.dot + 1;
  size_t frac_digits = sh.dot < len ? sh.exp - sh.dot - 1 : 0;
  uint64_t mantissa;
  if (int_digits + frac_digits <= 19) {
    uint64_t high = int_digits == 1 ? *whole - '0' : digits19(whole, int_digits);
    mantissa = high * kPow10[frac_digits] + digits19(frac, frac_digits);
  } else if (int_digits == 1 && *whole == '0') {  // 0.000ddd: the zeros are not significant
    size_t zeros = 0;
    while (zeros < frac_digits && frac[zeros] == '0') zeros++;
    // More than 19 significant digits: not sure. (simdjson 3.0.1's parse_double misreads
    // these: after "0." it counts only the zeros towards its 19-digit overflow check, so
    // 0.11111111111111111111111111111 overflows its uint64 silently. vLLM prints at most 17.)
    if (frac_digits - zeros > 19) return false;
    mantissa = digits19(frac + zeros, frac_digits - zeros);
  } else {
    goto slow;
  }
  {
    int64_t power = -static_cast<int64_t>(frac_digits);
    if (!add_exponent(s, len, sh, 8, power)) goto slow;
    if (power < simdjson::internal::smallest_power || power > simdjson::internal::largest_power) {
      goto slow;
    }
    if (mantissa == 0) {
      out = sh.negative ? -0.0 : 0.0;
      return true;
    }
    if (eisel_lemire(power, mantissa, sh.negative, out)) return true;  // finite by construction
  }
slow:
  return slow_double(s, out);
}

#if defined(__SSE2__)
// The 16 bytes ending at `end`, with all but the last `keep` (0..16) replaced by '0'.
inline __m128i last_digits(const uint8_t* end, size_t keep) {
  alignas(16) static constexpr uint8_t kTail[32] = {
      0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,
      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  __m128i mask = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kTail + keep));
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(end - 16));
  return _mm_or_si128(_mm_and_si128(mask, v), _mm_andnot_si128(mask, _mm_set1_epi8('0')));
}
#endif

#if defined(__AVX2__)
// The 32 bytes ending at `end`, all but the last `keep` (0..32) read as '0', as two 16-digit
// numbers: one 32-byte load, then multiply-adds pair the digits into 2, 4 and 8.
inline void digits32(const uint8_t* end, size_t keep, uint64_t& high, uint64_t& low) {
  alignas(32) static constexpr uint8_t kTail[64] = {
      0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,
      0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,
      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
      0xFF, 0xFF, 0xFF, 0xFF};
  __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTail + keep));
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(end - 32));
  v = _mm256_and_si256(_mm256_sub_epi8(v, _mm256_set1_epi8('0')), mask);  // digit values
  v = _mm256_maddubs_epi16(v, _mm256_set1_epi16(0x010A));                  // 2 digits
  v = _mm256_madd_epi16(v, _mm256_set1_epi32(0x00010064));                 // 4 digits
  v = _mm256_packus_epi32(v, v);
  v = _mm256_madd_epi16(v, _mm256_set1_epi32(0x00012710));                 // 8 digits
  uint64_t h = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_castsi256_si128(v)));
  uint64_t l = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_extracti128_si256(v, 1)));
  high = (h & 0xFFFFFFFF) * 100000000ULL + (h >> 32);
  low = (l & 0xFFFFFFFF) * 100000000ULL + (l >> 32);
}
#endif

#if defined(__SSE2__)
// whole.fraction x 10^exponent, the fraction's `frac_digits` digits ending at `end` (32
// readable bytes before it), read without a branch on the digit count and rounded by
// Eisel-Lemire; false when it cannot vouch (more than 19 significant digits, a rounding it
// cannot decide): the caller takes the general path.
[[gnu::always_inline]] inline bool fraction_double(uint64_t whole, const uint8_t* end,
                                                   size_t frac_digits, int64_t exponent,
                                                   bool negative, double& out) {
  if (frac_digits > 32) return false;
#if defined(__AVX2__)
  uint64_t high, low;
  digits32(end, frac_digits, high, low);
#else
  size_t high_keep = frac_digits > 16 ? frac_digits - 16 : 0;
  uint64_t low = digits16_vec(last_digits(end, frac_digits < 16 ? frac_digits : 16));
  uint64_t high = digits16_vec(last_digits(end - 16, high_keep));
#endif
  // whole * 10^f + fraction must be the exact significand (< 10^19); one branch, taken
  // almost never (whole is 0 or not about as often: a branch on it would mispredict)
  if ((whole != 0) & (frac_digits > 18) | (whole == 0) & (high >= 1000)) return false;
  uint64_t mantissa = high * 10000000000000000ULL + low +
                      whole * kPow10[frac_digits < 19 ? frac_digits : 19];
  int64_t power = exponent - static_cast<int64_t>(frac_digits);
  if (mantissa == 0 || power < simdjson::internal::smallest_power ||
      power > simdjson::internal::largest_power) {
    return false;
  }
  return eisel_lemire(power, mantissa, negative, out);
}
#endif

// A logprob as vLLM prints them, -?d.ddd(e[+-]dd)? with a one-digit whole part (the caller
// guarantees 32 readable bytes before s): fraction_double after its shape and exponent are
// checked. False when it cannot vouch.
[[gnu::always_inline]] inline bool logprob_double(const uint8_t* s, size_t len, const Shape& sh,
                                                  double& out) {
#if defined(__SSE2__)
  if (sh.dot != static_cast<size_t>(sh.negative) + 1 || sh.dot >= len) return false;  // d.ddd
  int64_t exponent = 0;
  if (!add_exponent(s, len, sh, 3, exponent)) return false;
  return fraction_double(s[sh.negative] - '0', s + sh.exp, sh.exp - sh.dot - 1, exponent,
                         sh.negative, out);
#else
  (void)s, (void)len, (void)sh, (void)out;
  return false;
#endif
}

// A number the caller has checked has the form -?d.d+(e[+-]dd)? (the bulk checks of
// onepass_nogil/bulk.h), `exp` the offset of its 'e' or its length: read as logprob_double reads
// it, without checking the form again.
[[gnu::always_inline]] inline bool checked_logprob_double(const uint8_t* s, size_t len,
                                                          size_t exp, bool negative,
                                                          double& out) {
#if defined(__SSE2__)
  // without a branch on whether it has one (a third of vLLM's logprobs do): read the last
  // two digits and the sign three bytes before them either way, keep them only if so
  const uint8_t* last = s + len;
  int64_t magnitude = (last[-2] - '0') * 10 + (last[-1] - '0');
  int64_t exponent = last[-3] == '-' ? -magnitude : magnitude;
  exponent &= -static_cast<int64_t>(exp != len);
  return fraction_double(s[negative] - '0', s + exp, exp - negative - 2, exponent, negative,
                         out);
#else
  (void)s, (void)len, (void)exp, (void)negative, (void)out;
  return false;
#endif
}

[[gnu::always_inline]] inline bool finite_double(const uint8_t* s, size_t len, double& out) {
  Shape sh;
  return any_shape(s, len, sh) && shaped_double(s, len, sh, out);
}

}  // namespace nogil
