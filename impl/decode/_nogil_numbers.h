// impl.decode's compiled decoders: JSON numbers and string escapes, checked and read without
// a branch per byte.
//
// A number is checked once its length is known (the index walk: the next structural index,
// less whitespace; the byte walk: the first byte that can end one): a short natural number
// (text_offset, token ids) in one 8-byte word; the usual forms from the 32-byte digit mask of
// two SSE2 loads and the few non-digits it points at (`quick_shape`); anything else by a mask
// per character class (`shape`) or, past 32 bytes, byte by byte. A kept logprob as vLLM prints
// it (d.ddd, maybe with an exponent) is read without a branch on its digit count
// (`logprob_double`: its fraction's digits from two 16-byte loads that end where it ends,
// sixteen at a time by SSE2 multiply-adds) and rounded correctly by the Eisel-Lemire step of
// simdjson's `compute_float_64` (its table, without its Clinger shortcut); any other form goes
// the general way (`shaped_double`); what Eisel-Lemire cannot decide goes to simdjson's own
// `parse_double`, and more than 19 significant digits to the reference.
//
// Escapes: `escape_len` checks one; the index walk checks every backslash of the body in one
// memchr sweep (`escapes_valid`: stage 1 has already found the strings, validated UTF-8 and
// rejected unescaped control characters in them, and a body has few backslashes), the byte
// walk each one its string scan meets.
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

namespace nogil {

// JSON whitespace (space, \t, \n, \r) as one shift and test.
inline bool is_ws(uint8_t c) {
  constexpr uint64_t kWs = 1ULL << ' ' | 1ULL << '\t' | 1ULL << '\n' | 1ULL << '\r';
  return c <= ' ' && (kWs >> c & 1);
}
inline bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

inline uint64_t load8(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

constexpr uint64_t kPow10[20] = {
    1ULL,         10ULL,         100ULL,         1000ULL,         10000ULL,
    100000ULL,    1000000ULL,    10000000ULL,    100000000ULL,    1000000000ULL,
    10ULL * 1000000000ULL,        100ULL * 1000000000ULL,        1000ULL * 1000000000ULL,
    10000ULL * 1000000000ULL,     100000ULL * 1000000000ULL,     1000000ULL * 1000000000ULL,
    10000000ULL * 1000000000ULL,  100000000ULL * 1000000000ULL,  1000000000ULL * 1000000000ULL,
    10ULL * 1000000000ULL * 1000000000ULL};

// The k (0..8) ASCII digits at p as a number (bytes after them are read, then shifted out).
inline uint32_t digits8(const uint8_t* p, unsigned k) {
  if (k == 0) return 0;
  uint64_t v = (load8(p) & 0x0F0F0F0F0F0F0F0FULL) << (8 * (8 - k));  // leading zero digits
  v = v * 10 + (v >> 8);
  v = (((v & 0x000000FF000000FFULL) * 0x000F424000000064ULL) +
       (((v >> 16) & 0x000000FF000000FFULL) * 0x0000271000000001ULL)) >>
      32;
  return static_cast<uint32_t>(v);
}

#if defined(__SSE2__)
// 16 ASCII digits (as loaded) as a number: SSE2 multiply-adds pair them into 2, 4, then 8
// digits.
[[gnu::always_inline]] inline uint64_t digits16_vec(__m128i ascii) {
  __m128i zero = _mm_setzero_si128();
  __m128i v = _mm_sub_epi8(ascii, _mm_set1_epi8('0'));
  __m128i tens = _mm_set_epi16(1, 10, 1, 10, 1, 10, 1, 10);
  __m128i pairs = _mm_packs_epi32(_mm_madd_epi16(_mm_unpacklo_epi8(v, zero), tens),
                                  _mm_madd_epi16(_mm_unpackhi_epi8(v, zero), tens));
  __m128i quads = _mm_madd_epi16(pairs, _mm_set_epi16(1, 100, 1, 100, 1, 100, 1, 100));
  quads = _mm_packs_epi32(quads, quads);
  __m128i eights = _mm_madd_epi16(quads, _mm_set_epi16(1, 10000, 1, 10000, 1, 10000, 1, 10000));
  uint64_t high = static_cast<uint32_t>(_mm_cvtsi128_si32(eights));
  uint64_t low = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_srli_si128(eights, 4)));
  return high * 100000000ULL + low;
}
#endif

// The 16 ASCII digits at p as a number.
inline uint64_t digits16(const uint8_t* p) {
#if defined(__SSE2__)
  return digits16_vec(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  return uint64_t{digits8(p, 8)} * 100000000ULL + digits8(p + 8, 8);
#endif
}

// The k (0..19) ASCII digits at p as a number.
inline uint64_t digits19(const uint8_t* p, size_t k) {
  if (k >= 16) {
    return digits16(p) * kPow10[k - 16] + digits8(p + 16, static_cast<unsigned>(k - 16));
  }
  if (k > 8) {
    return uint64_t{digits8(p, 8)} * kPow10[k - 8] + digits8(p + 8, static_cast<unsigned>(k - 8));
  }
  return digits8(p, static_cast<unsigned>(k));
}

// The first byte at or after p that is not an ASCII digit, eight bytes at a time (reading up
// to seven bytes past it stays within the body's readable padding).
inline const uint8_t* skip_digits(const uint8_t* p) {
  while (true) {
    uint64_t v = load8(p);
    // A byte is a digit iff its high nibble is 3 and adding 6 keeps it there; a carry out of a
    // non-digit byte only disturbs the bytes after it.
    uint64_t high = (v & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL;
    uint64_t over = ((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL;
    uint64_t bad = high | over;
    if (bad) return p + (__builtin_ctzll(bad) >> 3);
    p += 8;
  }
}

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
// _onepass_bulk.h), `exp` the offset of its 'e' or its length: read as logprob_double reads
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

inline bool hex4(const uint8_t* p, uint32_t& out) {
  uint32_t value = 0;
  for (int i = 0; i < 4; i++) {
    uint8_t c = p[i];
    uint32_t digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
      digit = (c | 0x20) - 'a' + 10;
    } else {
      return false;
    }
    value = value << 4 | digit;
  }
  out = value;
  return true;
}

// Length of the backslash escape at p (p[0] == '\\'): 2, 6 or 12 bytes; 0 when JSON does not
// allow it (lone surrogates included, which go to the reference).
inline size_t escape_len(const uint8_t* p) {
  switch (p[1]) {
    case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
      return 2;
    case 'u':
      break;
    default:
      return 0;
  }
  uint32_t unit, low;
  if (!hex4(p + 2, unit)) return 0;
  if (unit >= 0xDC00 && unit <= 0xDFFF) return 0;
  if (unit < 0xD800 || unit > 0xDBFF) return 6;
  if (p[6] != '\\' || p[7] != 'u' || !hex4(p + 8, low) || low < 0xDC00 || low > 0xDFFF) return 0;
  return 12;
}

// Every backslash in [buf, buf + len) starts an escape JSON allows: \" \\ \/ \b \f \n \r \t or
// \uXXXX, with UTF-16 surrogates only as a high-low pair (Python also takes lone ones; those
// bodies go to the reference, as with simdjson's own string parser). Inside strings that is
// exactly the string check stage 1 leaves; a backslash outside strings sits in a scalar
// token, which the walk rejects anyway. A sequence running past the end meets the byte at
// `len` (a NUL of the bytes object, or a space of the padded copy) and fails.
inline bool escapes_valid(const uint8_t* buf, size_t len) {
  const uint8_t* p = buf;
  const uint8_t* end = buf + len;
  while (p < end) {
    p = static_cast<const uint8_t*>(std::memchr(p, '\\', static_cast<size_t>(end - p)));
    if (p == nullptr) return true;
    size_t length = escape_len(p);
    if (length == 0) return false;
    p += length;
  }
  return true;
}

}  // namespace nogil
