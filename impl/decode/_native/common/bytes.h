// impl.decode's compiled decoders: byte classes, and ASCII digits read several at a time
// (one 8-byte word, or 16 digits by SSE2 multiply-adds) without a branch per byte.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace nogil {

// JSON whitespace (space, \t, \n, \r) as one shift and test.
inline bool is_ws(uint8_t c) {
  constexpr uint64_t kWs = 1ULL << ' ' | 1ULL << '\t' | 1ULL << '\n' | 1ULL << '\r';
  return c <= ' ' && (kWs >> c & 1);
}
inline bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

// 32 bytes of `C` in memory, for a vector constant (the first 16 for an SSE2 one). GCC builds
// a byte splat it can see from an immediate in three instructions (mov, vmovd, vpbroadcastb)
// wherever it needs it, and in the bulk loops, which use more vector constants than there
// are registers, it did so in every block for every byte class; this array is not const, so
// GCC cannot fold it into an immediate, and the vector comes from one load that the compare
// (or subtraction) takes as its memory operand. Nothing writes to it.
template <uint8_t C>
struct Splat {
  alignas(32) static inline uint8_t bytes[32] = {C, C, C, C, C, C, C, C, C, C, C, C, C, C, C, C,
                                                 C, C, C, C, C, C, C, C, C, C, C, C, C, C, C, C};
};

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

}  // namespace nogil
