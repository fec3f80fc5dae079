// impl.decode's compiled decoders (_simdjson_nogil, _onepass_nogil): what a decode is asked for.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nogil {

// The body (with readable padding past its end: see each module's decode) and the limits; the
// prompt and k are read by reader.h.
struct Request {
  const uint8_t* body;
  size_t len;
  const int64_t* prompt_tokens;  // nullptr: take the first choice's prompt_token_ids
  size_t n_prompt_tokens;
  int64_t k;
  size_t max_depth;
  size_t max_int_digits;
};

}  // namespace nogil
