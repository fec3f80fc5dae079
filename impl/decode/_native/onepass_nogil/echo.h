// impl.decode._onepass_nogil's byte helpers for top_logprobs objects that repeat what the walk
// has checked already (ByteWalker::echoed_objects, echo_walk.h).
//
// vLLM writes, for each position i of a completion, `tokens[i]`, `token_logprobs[i]` and the
// first member of `top_logprobs[i]` from one Logprob, through one function and one JSON
// encoder: the sampled token comes first in its top_logprobs object (vLLM V1's
// LogprobsProcessor puts it before the top-k ids; the OpenAI serving layer keeps that order),
// so that member's bytes are `tokens[i]`'s string, a ':', and `token_logprobs[i]`'s text, byte
// for byte. Whether a JSON string or scalar is valid depends only on its own bytes, so a
// member that repeats a string and a value the walk has checked is valid without checking its
// bytes again: finding where the two checked elements end and comparing is the whole check.
//
// Reads: 16 bytes (32 in the spans' AVX2 path) from each position a helper is given, within the
// body's readable padding for any position at or before its end.
#pragma once

#include <cstdint>
#include <cstring>

#include "blocks.h"

namespace nogil {

#if defined(__SSE2__)
// Bit i: byte i of the 16 at p is a or b.
inline uint32_t either(const uint8_t* p, char a, char b) {
  __m128i v = load16(p);
  return static_cast<uint32_t>(_mm_movemask_epi8(
      _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(a)), _mm_cmpeq_epi8(v, _mm_set1_epi8(b)))));
}
#endif

// One past the closing quote of the string whose opening quote is at s, a string the walk has
// checked (so every backslash starts a valid escape): the first quote no backslash escapes.
inline const uint8_t* checked_string_end(const uint8_t* s) {
  const uint8_t* q = s + 1;
  while (true) {
#if defined(__SSE2__)
    uint32_t m = either(q, '"', '\\');
    if (m == 0) {
      q += 16;
      continue;
    }
    q += __builtin_ctz(m);
#else
    while (*q != '"' && *q != '\\') q++;
#endif
    if (*q == '"') return q + 1;
    q += 2;  // a backslash and the byte it escapes (a \u escape's hex digits hold neither)
  }
}

// The end of the element at s of an array the walk has checked whose elements are numbers or
// null (token_logprobs): the first ',' or ']'. The element's text is the bytes before it, any
// whitespace around the value included.
inline const uint8_t* scalar_end(const uint8_t* s) {
#if defined(__SSE2__)
  while (true) {
    uint32_t m = either(s, ',', ']');
    if (m != 0) return s + __builtin_ctz(m);
    s += 16;
  }
#else
  while (*s != ',' && *s != ']') s++;
  return s;
#endif
}

// Whether the n bytes at a and at b are the same (16 bytes readable past the last of each).
inline bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) {
#if defined(__SSE2__)
  for (; n >= 16; a += 16, b += 16, n -= 16) {
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(load16(a), load16(b))) != 0xFFFF) return false;
  }
  uint32_t differ = ~static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(load16(a), load16(b))));
  return (differ & ((1u << n) - 1)) == 0;
#else
  return std::memcmp(a, b, n) == 0;
#endif
}

// A checked element of `tokens` or `token_logprobs` beside the bytes its top_logprobs member
// should repeat: its length, and whether those bytes are the same.
struct Span {
  size_t length;
  bool same;
};

#if defined(__AVX2__)
// The 32 bytes at a and at b: bit i of `stops` set where byte i of a is x or y, of `differ`
// where the two differ.
struct Bytes32 {
  uint32_t stops, differ;
};
inline Bytes32 bytes32(const uint8_t* a, const uint8_t* b, char x, char y) {
  __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  __m256i stop = _mm256_or_si256(_mm256_cmpeq_epi8(va, _mm256_set1_epi8(x)),
                                 _mm256_cmpeq_epi8(va, _mm256_set1_epi8(y)));
  return Bytes32{static_cast<uint32_t>(_mm256_movemask_epi8(stop)),
                 ~static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(va, vb)))};
}
#endif

// The string at t (its opening quote; checked) through its closing quote, beside the bytes at k
// (before `end`, the body's end). In the AVX2 build a string of up to 31 bytes after its
// opening quote with no backslash (nearly every token) is found and compared from one 32-byte
// load at each; the others, and the baseline build, take checked_string_end and same_bytes.
inline Span string_span(const uint8_t* t, const uint8_t* k, const uint8_t* end) {
#if defined(__AVX2__)
  Bytes32 b = bytes32(t, k, '"', '\\');
  uint32_t stops = b.stops & ~1u;  // not the opening quote
  if (stops != 0) {
    unsigned at = static_cast<unsigned>(__builtin_ctz(stops));
    if (t[at] == '"') {
      uint32_t bytes = at == 31 ? ~0u : (2u << at) - 1;  // through the closing quote
      return Span{at + size_t{1}, (b.differ & bytes) == 0};
    }
  }
#endif
  size_t length = static_cast<size_t>(checked_string_end(t) - t);
  return Span{length, k + length < end && same_bytes(k, t, length)};
}

// The element at u of `token_logprobs` (a number or null; checked) up to the ',' or ']' after
// it, beside the bytes at v (before `end`). In the AVX2 build an element of up to 31 bytes is
// found and compared from one 32-byte load at each; the others take scalar_end and same_bytes.
inline Span scalar_span(const uint8_t* u, const uint8_t* v, const uint8_t* end) {
#if defined(__AVX2__)
  Bytes32 b = bytes32(u, v, ',', ']');
  if (b.stops != 0) {
    unsigned at = static_cast<unsigned>(__builtin_ctz(b.stops));
    return Span{at, (b.differ & ((1u << at) - 1)) == 0};  // at <= 31
  }
#endif
  size_t length = static_cast<size_t>(scalar_end(u) - u);
  return Span{length, v + length < end && same_bytes(v, u, length)};
}

}  // namespace nogil
