// impl.decode's compiled decoders: UTF-8 validation of a string's bytes.
//
// Valid means well-formed as Unicode defines it (its table 3-7): no overlong form, no UTF-16
// surrogate (U+D800..U+DFFF), nothing above U+10FFFF, no sequence cut short, which is what
// Python's bytes.decode("utf-8") accepts. The byte walk checks each string that has a byte >= 0x80
// (a token, a top-logprob key: a few bytes; the text: up to megabytes), so a short one is checked
// byte by byte (`utf8_valid_scalar`: no call, no set-up), a long one 16 or 32 bytes at a time by
// the lookup algorithm of Keiser and Lemire ("Validating UTF-8 in less than one instruction per
// byte", Software: Practice and Experience 51(5), 2021): three 16-entry table lookups, indexed by
// the nibbles of each byte and of the byte before it, flag every invalid pair of bytes, and two
// saturating subtractions find the bytes that must continue a 3- or 4-byte sequence
// (utf8_lookup.h). The AVX2 build runs the 32-byte form; the baseline build picks the 32-byte
// (AVX2) or 16-byte (SSSE3) form at run time, by what the CPU has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "bytes.h"

namespace nogil {

// [s, s + n) is valid UTF-8: one sequence at a time, eight ASCII bytes at a time between them.
inline bool utf8_valid_scalar(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n && (load8(s + i) & 0x8080808080808080ULL) == 0) {
      i += 8;
      continue;
    }
    uint8_t lead = s[i];
    if (lead < 0x80) {
      i++;
      continue;
    }
    // The second byte's range depends on the lead (table 3-7); the others are 0x80..0xBF.
    size_t length;
    uint8_t low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;   // overlong below U+0800
      if (lead == 0xED) high = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;   // overlong below U+10000
      if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
    } else {
      return false;  // a continuation byte, C0, C1 or F5..FF as a lead
    }
    if (n - i < length || s[i + 1] < low || s[i + 1] > high) return false;
    for (size_t k = 2; k < length; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

// The lookup algorithm's tables (utf8_lookup.h). A pair of bytes (the byte before, this byte)
// is invalid when a flag is set in all three of: the entry of the byte before's high nibble,
// of its low nibble, and of this byte's high nibble.
namespace utf8 {
constexpr uint8_t kTooShort = 1 << 0;    // a lead (11xxxxxx), then no continuation (10xxxxxx)
constexpr uint8_t kTooLong = 1 << 1;     // ASCII, then a continuation
constexpr uint8_t kOverlong3 = 1 << 2;   // E0, then 80..9F
constexpr uint8_t kTooLarge = 1 << 3;    // F4..FF, then 90..BF
constexpr uint8_t kSurrogate = 1 << 4;   // ED, then A0..BF
constexpr uint8_t kOverlong2 = 1 << 5;   // C0 or C1, then a continuation
constexpr uint8_t kTooLarge80 = 1 << 6;  // F5..FF, then 80..8F
constexpr uint8_t kOverlong4 = 1 << 6;   // F0, then 80..8F (the same bit: F0's row lacks F5's)
constexpr uint8_t kTwoConts = 1 << 7;    // two continuations: an error unless one must follow
constexpr uint8_t kAny = kTooShort | kTooLong | kTwoConts;  // whatever the low nibble

alignas(16) constexpr uint8_t kFirstHigh[16] = {
    kTooLong, kTooLong, kTooLong, kTooLong, kTooLong, kTooLong, kTooLong, kTooLong,  // ASCII
    kTwoConts, kTwoConts, kTwoConts, kTwoConts,                                      // 10xx
    kTooShort | kOverlong2,                                                          // C
    kTooShort,                                                                       // D
    kTooShort | kOverlong3 | kSurrogate,                                             // E
    kTooShort | kTooLarge | kTooLarge80 | kOverlong4,                                // F
};
alignas(16) constexpr uint8_t kFirstLow[16] = {
    kAny | kOverlong2 | kOverlong3 | kOverlong4,  // x0: C0, E0, F0
    kAny | kOverlong2,                            // x1: C1
    kAny,
    kAny,
    kAny | kTooLarge,                             // x4: F4
    kAny | kTooLarge | kTooLarge80,               // x5..xF: F5..FF
    kAny | kTooLarge | kTooLarge80,
    kAny | kTooLarge | kTooLarge80,
    kAny | kTooLarge | kTooLarge80,
    kAny | kTooLarge | kTooLarge80,
    kAny | kTooLarge | kTooLarge80,
    kAny | kTooLarge | kTooLarge80,
    kAny | kTooLarge | kTooLarge80,
    kAny | kTooLarge | kTooLarge80 | kSurrogate,  // xD: ED
    kAny | kTooLarge | kTooLarge80,
    kAny | kTooLarge | kTooLarge80,
};
alignas(16) constexpr uint8_t kSecondHigh[16] = {
    kTooShort, kTooShort, kTooShort, kTooShort, kTooShort, kTooShort, kTooShort, kTooShort,
    kTooLong | kTwoConts | kOverlong2 | kOverlong3 | kTooLarge80 | kOverlong4,  // 80..8F
    kTooLong | kTwoConts | kOverlong2 | kOverlong3 | kTooLarge,                 // 90..9F
    kTooLong | kTwoConts | kOverlong2 | kSurrogate | kTooLarge,                 // A0..AF
    kTooLong | kTwoConts | kOverlong2 | kSurrogate | kTooLarge,                 // B0..BF
    kTooShort, kTooShort, kTooShort, kTooShort,                                 // leads
};
}  // namespace utf8

}  // namespace nogil

// The lookup algorithm once per instruction set, each in its own namespace (only GCC and
// compatible compilers take the target pragmas; elsewhere the scalar check does it all).
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define HOTPATH_UTF8_LOOKUP 1

#pragma GCC push_options
#pragma GCC target("avx2")
namespace nogil::utf8_avx2 {
using Vec = __m256i;
constexpr size_t kWidth = 32;
inline Vec load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const Vec*>(p)); }
template <uint8_t C>  // from memory: see Splat (bytes.h)
inline Vec splat() { return _mm256_load_si256(reinterpret_cast<const Vec*>(Splat<C>::bytes)); }
inline Vec zero() { return _mm256_setzero_si256(); }
inline Vec table(const uint8_t (&t)[16]) {  // the same 16 entries in both 128-bit lanes
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}
inline Vec lookup(Vec t, Vec index) { return _mm256_shuffle_epi8(t, index); }
inline Vec high_nibbles(Vec v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), splat<0x0F>()); }
inline Vec low_nibbles(Vec v) { return _mm256_and_si256(v, splat<0x0F>()); }
inline Vec vand(Vec a, Vec b) { return _mm256_and_si256(a, b); }
inline Vec vor(Vec a, Vec b) { return _mm256_or_si256(a, b); }
inline Vec vxor(Vec a, Vec b) { return _mm256_xor_si256(a, b); }
inline Vec subs(Vec a, Vec b) { return _mm256_subs_epu8(a, b); }
inline bool any(Vec v) { return !_mm256_testz_si256(v, v); }
// Each byte of v replaced by the byte k (1..3) places before it, the last of `before` first.
template <int k>
inline Vec earlier(Vec v, Vec before) {
  return _mm256_alignr_epi8(v, _mm256_permute2x128_si256(before, v, 0x21), 16 - k);
}
#include "utf8_lookup.h"
}  // namespace nogil::utf8_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("ssse3")
namespace nogil::utf8_ssse3 {
using Vec = __m128i;
constexpr size_t kWidth = 16;
inline Vec load(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const Vec*>(p)); }
template <uint8_t C>  // from memory: see Splat (bytes.h)
inline Vec splat() { return _mm_load_si128(reinterpret_cast<const Vec*>(Splat<C>::bytes)); }
inline Vec zero() { return _mm_setzero_si128(); }
inline Vec table(const uint8_t (&t)[16]) { return load(t); }
inline Vec lookup(Vec t, Vec index) { return _mm_shuffle_epi8(t, index); }
inline Vec high_nibbles(Vec v) { return _mm_and_si128(_mm_srli_epi16(v, 4), splat<0x0F>()); }
inline Vec low_nibbles(Vec v) { return _mm_and_si128(v, splat<0x0F>()); }
inline Vec vand(Vec a, Vec b) { return _mm_and_si128(a, b); }
inline Vec vor(Vec a, Vec b) { return _mm_or_si128(a, b); }
inline Vec vxor(Vec a, Vec b) { return _mm_xor_si128(a, b); }
inline Vec subs(Vec a, Vec b) { return _mm_subs_epu8(a, b); }
inline bool any(Vec v) { return _mm_movemask_epi8(_mm_cmpeq_epi8(v, zero())) != 0xFFFF; }
template <int k>
inline Vec earlier(Vec v, Vec before) {
  return _mm_alignr_epi8(v, before, 16 - k);
}
#include "utf8_lookup.h"
}  // namespace nogil::utf8_ssse3
#pragma GCC pop_options
#endif

namespace nogil {

// From this many bytes on, a string is checked by the lookup algorithm (where the CPU has it).
constexpr size_t kUtf8Lookup = 32;

// [s, s + n) is valid UTF-8. Reads only those bytes.
inline bool utf8_valid(const uint8_t* s, size_t n) {
  if (n < kUtf8Lookup) return utf8_valid_scalar(s, n);
#if defined(__AVX2__)
  return utf8_avx2::valid(s, n);
#elif defined(HOTPATH_UTF8_LOOKUP)
  static const int kind = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 2 : __builtin_cpu_supports("ssse3") ? 1 : 0;
  }();
  if (kind == 2) return utf8_avx2::valid(s, n);
  if (kind == 1) return utf8_ssse3::valid(s, n);
  return utf8_valid_scalar(s, n);
#else
  return utf8_valid_scalar(s, n);
#endif
}

}  // namespace nogil
