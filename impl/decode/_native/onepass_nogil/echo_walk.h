// impl.decode._onepass_nogil's walk over top_logprobs objects that repeat what it has checked
// already (echo.h says why that is a check): ByteWalker's methods for it, defined once the
// struct is whole (walk.h includes this file at its end).
#pragma once

#include "walk.h"

namespace nogil {

// The top_logprobs value at pos, in the logprobs object at `depth`, checked as skip(depth)
// checks it; where the `tokens` and `token_logprobs` arrays came before it in that object
// (their opening brackets at tokens_at and logprobs_at, else 0) its objects are tried first
// by echoed_objects. The same bytes pass or fail either way: echoed_objects takes only what
// the rest of the walk would, and leaves anything else to it.
inline bool ByteWalker::skip_top_logprobs(size_t depth, size_t tokens_at,
                                          size_t logprobs_at) {
  // an object in the array is at depth + 2; echoed values are the reader's numbers (at most
  // 18 integer digits) or null, which skip_scalar takes when integers may have that many
  if (peek() == '[' && tokens_at != 0 && logprobs_at != 0 && buf[tokens_at] == '[' &&
      buf[logprobs_at] == '[' && depth + 2 <= rq.max_depth && rq.max_int_digits >= 18) {
    echo = Echo{tokens_at + 1, logprobs_at + 1, depth + 1};
  }
  bool ok = skip(depth);
  echo = Echo{};
  return ok;
}

// Elements of the top_logprobs array from pos (an opening brace) on, the i-th beside the
// i-th `tokens` string and `token_logprobs` element: a first member that repeats them byte
// for byte (echo.h) is taken as it is, the members after it (vLLM's top-k alternatives) and
// any element that does not repeat them are checked as skip checks them. Returns the first
// byte of the first element it did not take: the array's last one (followed by ']', left to
// the walk), the first after `tokens` or `token_logprobs` ended, one that is not an object,
// the ninth in a row that does not repeat its token, or one that fails (the walk decides it);
// echo then ends for this array. Compares only bytes before the body's end (`after` < len).
inline size_t ByteWalker::echoed_objects() {
  const size_t start = pos;
  const uint8_t* end = buf + len;
  size_t at = pos, taken = pos, t = echo.tokens, u = echo.logprobs;
  // elements in a row that did not repeat theirs: past a few, the array is not vLLM's layout
  // and the block checks (flat_objects) take the rest faster than one object at a time
  constexpr unsigned kMisses = 8;
  unsigned misses = 0;
  // t at a string (an element of a checked array), u at a number or null
  while (buf[at] == '{' && buf[t] == '"' && (buf[u] == '-' || is_digit(buf[u]) || buf[u] == 'n')) {
    Span key = string_span(buf + t, buf + at + 1, end);
    size_t v = at + 2 + key.length;  // where the first member's value would start
    Span value = v < len ? scalar_span(buf + u, buf + v, end)
                         : Span{static_cast<size_t>(scalar_end(buf + u) - (buf + u)), false};
    size_t after = v + value.length;  // the byte after the first member
    if (key.same && buf[v - 1] == ':' && value.same && after < len) {
      if (buf[after] == ',') {  // the alternatives
        pos = after;
        if (!more_members(echo.depth + 1)) break;
        after = pos;
      }
      if (buf[after] != '}') break;
      after++;
      misses = 0;
    } else {  // an element that does not repeat them: checked as skip checks it
      if (++misses > kMisses) break;
      pos = at;
      if (!skip(echo.depth)) break;
      after = pos;
    }
    if (buf[after] != ',') break;  // the last element (or whitespace) goes to the walk
    at = after + 1;
    taken = at;
    if (buf[t + key.length] != ',' || buf[u + value.length] != ',') break;  // one of them ended
    t += key.length + 1;
    u += value.length + 1;
  }
  echo.depth = 0;
  pos = start;
  return taken;
}

// The members after the first of an object at `depth` (pos at the ',' after the first), each
// checked as skip checks it; true with pos at the closing brace.
inline bool ByteWalker::more_members(size_t depth) {
  // vLLM's own layout first, `,"key":number` with no whitespace: the string and the number
  // checked by what skip_string and skip_scalar call, without their steps over whitespace (the
  // number check written out: as a helper both share, string_at stopped being inlined here);
  // from a member it doubts, the loop below (which decides) takes over
  size_t p = pos;
  while (buf[p] == ',' && buf[p + 1] == '"') {
    size_t end, length;
    bool escaped;
    Shape sh;
    if (!string_at(p + 1, end, escaped) || buf[end] != ':' ||
        !number_token(buf + end + 1, length, sh) ||
        (sh.integer() && sh.int_digits() > rq.max_int_digits)) {  // skip_scalar's number check
      break;
    }
    p = end + 1 + length;
  }
  go(p);
  while (peek() == ',') {
    step();
    if (peek() != '"' || !skip_string() || peek() != ':') return false;
    step();
    uint8_t c = peek();  // a number (skip's own path for it, without its container loop)
    if (c == '-' || is_digit(c) ? !skip_scalar() : !skip(depth)) return false;
  }
  return peek() == '}';
}

}  // namespace nogil
