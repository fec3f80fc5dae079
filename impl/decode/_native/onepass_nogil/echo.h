// impl.decode._onepass_nogil's byte helpers for top_logprobs objects that repeat what the walk
// has checked already (ByteWalker::echoed_objects, walk.h).
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
// Reads: 16 bytes from each position a helper is given (within the body's readable padding
// for any position at or before its end).
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

}  // namespace nogil
