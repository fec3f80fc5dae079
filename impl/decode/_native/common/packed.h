// impl.decode's compiled check of vLLM's packed candidates (`logprobs.packed_top_logprobs`),
// the rule of impl/decode/_packed.py: the base64 half here, the block's members in reader.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nogil {

// How many bytes the base64 text [s, e) holds (standard alphabet, length a multiple of 4, at
// most two '=' only at the end); false when it is not that. One branch-free pass the compiler
// vectorises (kept out of line: inlined into the walk it was not): the candidate arrays are
// most of a packed body's bytes beside the sampled ones.
[[gnu::noinline]] inline bool base64_size(const uint8_t* s, const uint8_t* e, size_t& out) {
  size_t length = static_cast<size_t>(e - s);
  if (length % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && pad < length && s[length - 1 - pad] == '=') pad++;
  size_t body = length - pad;
  uint8_t bad = 0;  // bitwise, not short-circuit: one vector compare chain per 16/32 bytes
  for (size_t i = 0; i < body; i++) {
    uint8_t c = s[i];
    uint8_t letter = static_cast<uint8_t>((c | 0x20) - 'a');
    uint8_t digit = static_cast<uint8_t>(c - '0');
    bad |= static_cast<uint8_t>((letter >= 26) & (digit >= 10) & (c != '+') & (c != '/'));
  }
  if (bad) return false;  // a third '=' (or one inside) is not in the alphabet either
  out = length / 4 * 3 - pad;
  return true;
}

}  // namespace nogil
