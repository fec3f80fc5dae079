// impl.decode's compiled decoders (_simdjson_nogil, _onepass_nogil): what a decode is asked for,
// and the body made readable past its end.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

// Built with AddressSanitizer (GCC defines __SANITIZE_ADDRESS__, clang has the feature): the
// body is then always copied into a buffer of exactly its size and the padding (below).
#if defined(__SANITIZE_ADDRESS__)
#define HOTPATH_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOTPATH_SANITIZED 1
#endif
#endif

namespace nogil {

#if defined(HOTPATH_SANITIZED)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// Bytes the walks (and simdjson's stage 1) may read past a position at or before the end.
constexpr size_t kPadding = 64;

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

inline size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// The body with kPadding readable bytes past its end: the body itself when they stay within
// its last page (reading them is then safe whatever they hold; the byte at `len` of a bytes
// object is a NUL), else a copy in `copy` with `fill` after it. Built with a sanitizer, always
// a fresh copy of exactly that size, so that any read past it is the error it would be
// elsewhere (a read past the bytes object is safe here, but the sanitizer cannot know).
inline const uint8_t* readable_body(const Request& rq, uint8_t fill, std::vector<uint8_t>& copy) {
  if (kSanitized) {
    std::vector<uint8_t>(rq.len + kPadding, fill).swap(copy);
    std::memcpy(copy.data(), rq.body, rq.len);
    return copy.data();
  }
  uintptr_t last = reinterpret_cast<uintptr_t>(rq.body + rq.len - 1);
  if (last % page_size() + kPadding < page_size()) return rq.body;
  copy.assign(rq.body, rq.body + rq.len);
  copy.resize(rq.len + kPadding, fill);
  return copy.data();
}

}  // namespace nogil
