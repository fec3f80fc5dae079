// impl.decode._onepass_nogil's bulk checks: array elements checked 64 bytes at a time.
//
// Without a structural index each token's end depends on the token before (walk.h),
// a chain the CPU cannot run ahead on. Long regular arrays break it here: each 64-byte block
// becomes bit masks of byte classes (blocks.h), and the grammar of the elements is checked as
// relations between the masks. `naturals` and `plain_strings` (text_offset, token_ids; tokens)
// check windows that end at their last comma, so each holds only whole elements;
// `logprob_runs` and `flat_objects` (token_logprobs; top_logprobs) check a stream of blocks,
// each byte against the bytes before it with the previous block's masks carried in
// (`before`), so no block is cut short. Strings keep to these checks with escapes and (in the
// AVX2 build) non-ASCII text (`Strings`, blocks.h). Each answers where it stopped: the first
// byte of an element it did not check, which the walk's token-at-a-time path then decides.
//
// Reads: 64 bytes from each block start, which is at or before the array's end (a byte no
// check accepts); logprob_runs starts 32 bytes or more into the body, since the logprob
// readers load the 32 bytes before a number (common/floats.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../common/shapes.h"
#include "blocks.h"

namespace nogil {

// Elements of an array from `start` (an element's first byte) on that are natural numbers
// of at most 18 digits (no leading zero) separated by bare commas, 64 bytes at a time: each
// window ends at its last comma, so it holds only whole elements; `each(first, length)`
// sees each of them. Returns where it stopped: the first byte of an element it did not
// check (the last one, or one it doubts: the general path decides those).
template <typename F>
[[gnu::always_inline]] inline size_t naturals(const uint8_t* buf, size_t start, F&& each) {
#if defined(__SSE2__)
  while (true) {
    const uint8_t* s = buf + start;
    Block block(s);
    uint64_t digit = block.digits(), comma = block.eq<','>();
    comma &= below_first(~(digit | comma));  // the first byte of neither kind stops it
    if (comma == 0) return start;
    int last = 63 - __builtin_clzll(comma);
    uint64_t window = through(last);
    uint64_t starts = ((comma << 1) | 1) & window;
    uint64_t zero = block.eq<'0'>();
    if ((starts & comma) | (starts & zero & (digit >> 1))) return start;
    size_t first = 0;
    while (comma) {
      size_t end = static_cast<size_t>(__builtin_ctzll(comma));
      if (end - first > 18) return start + first;
      each(s + first, end - first);
      first = end + 1;
      comma &= comma - 1;
    }
    start += first;
  }
#else
  (void)each;
  return start;
#endif
}

// Elements of an array from `start` (an opening quote) on that are strings separated by bare
// commas, 64 bytes at a time: once escapes are known (Strings) the quotes pair up, so which
// bytes are inside a string is a prefix XOR of the quote mask, and each window ends at its
// last comma outside the strings before the first byte that would make a string invalid.
// Returns where it stopped: the first byte of an element it did not check.
inline size_t plain_strings(const uint8_t* buf, size_t start) {
#if defined(__SSE2__)
  while (true) {
    Block block(buf + start);
    Strings strings;  // a window starts at a quote, ends at a comma: nothing carried
    uint64_t bad;
    uint64_t quote = strings.quotes<false>(block, block.odd(), buf + start, buf + start, bad);
    uint64_t comma = block.eq<','>();
    uint64_t valid = below_first(bad);
    uint64_t inside = prefix_xor(quote);  // 1 from an opening quote up to its closing one
    uint64_t between = ~inside & ~quote & valid;  // outside every string
    uint64_t separators = between & comma;
    if (separators == 0) return start;
    int last = 63 - __builtin_clzll(separators);
    uint64_t window = through(last);
    uint64_t closes = quote & ~inside & window;
    uint64_t opens = quote & inside & window;
    // Open, close, separator, open, ...: anything else outside a string breaks the chain.
    if (((closes << 1) & window) != separators || (((separators << 1) & window) | 1) != opens) {
      return start;
    }
    start += static_cast<size_t>(last) + 1;
  }
#else
  return start;
#endif
}

// The forms vLLM (Python's repr) and orjson print logprobs in, -?w.d+(e[+-]d{1,2})? with a
// whole part w of one digit or two (the tail below -10), checked over a stream of 64-byte
// blocks as relations between byte-class masks, each byte against the bytes before it (the
// previous block's masks carried): the whole part's first digit, a second one or the '.'
// right after it (no second one after a '0'), the '.' right after a second one, and a digit
// after the '.'; an 'e' after a digit, then a sign, one digit, and a second one or the
// number's end; a '-' first or right after the 'e'. (That a digit comes before the 'e'
// follows.) The first whole digit is checked itself, not left to the '.' that must follow
// it: a block's elements are taken once the block passes, and a lone '-' or an empty element
// can end at the block's last byte (its comma, where the whole digit would be), the missing
// '.' only seen in the next block. `check` answers the bytes that break it.
//
// Most bodies print one whole digit and two exponent digits (vLLM's numbers above -10, in
// Python's repr): the narrow form (`Wide` false), a few masks fewer. The loops below check an
// array in it until a block breaks it, then check that block and the rest in the whole form
// (`Wide`): the narrow form is a part of the whole one, so which is checked never changes
// what is accepted, only what it costs.
struct LogprobForm {
  uint64_t signed_start = 0, whole = 0, dot = 0, e = 0, digit = 0;  // the previous block's

  // `bytes`: the block's 64 bytes (the byte before them readable); `next`: the masks to carry
  // into the next block.
  template <bool Wide>
  uint64_t check(const uint8_t* bytes, uint64_t starts, uint64_t digit_now, uint64_t minus,
                 uint64_t dot_now, uint64_t e_now, uint64_t plus, LogprobForm& next) const {
    uint64_t number = digit_now | minus | dot_now | e_now | plus;
    uint64_t signed_now = starts & minus;
    uint64_t whole_now = (starts & ~minus) | before(signed_now, signed_start, 1);
    uint64_t after_whole = before(whole_now, whole, 1);
    uint64_t e1 = before(e_now, e, 1), e3 = before(e_now, e, 3);
    uint64_t bad = (whole_now & ~digit_now) | (before(dot_now, dot, 1) & ~digit_now) |
                   (minus & ~(starts | e1)) | (plus & ~e1) | (e1 & ~(minus | plus)) |
                   (before(e_now, e, 2) & ~digit_now);
    if constexpr (!Wide) {
      bad |= (dot_now ^ after_whole) | (e3 & ~digit_now) | (before(e_now, e, 4) & number);
    } else {
      // the previous block's top bit of each mask below, from the masks carried
      uint64_t second_top = (whole << 1) & digit & (1ULL << 63);
      uint64_t e3_top = (e << 3) & digit & (1ULL << 63);
      uint64_t second = after_whole & digit_now;  // a second whole digit
      uint64_t e3_digit = e3 & digit_now;         // a second exponent digit
      bad |= (dot_now ^ ((after_whole & ~digit_now) | before(second, second_top, 1))) |
             (e3 & number & ~digit_now) | (before(e3_digit, e3_top, 1) & number);
      // a second whole digit is rare: the one before it is not '0'
      for (uint64_t m = second; m; m &= m - 1) {
        int at = __builtin_ctzll(m);
        bad |= uint64_t{bytes[at - 1] == '0'} << at;
      }
    }
    next = LogprobForm{signed_now, whole_now, dot_now, e_now, digit_now};
    return bad;
  }
};

// The Shape of a number of `length` bytes at s that LogprobForm passed (in its whole form
// with `Wide`).
template <bool Wide>
[[gnu::always_inline]] inline Shape logprob_shape(const uint8_t* s, size_t length) {
  bool negative = *s == '-';
  const uint8_t* end = s + length;
  if constexpr (!Wide) {  // the 'e' of e[+-]dd is 4 bytes from the end (for a shorter number
                          // that byte is the comma before it)
    size_t exp = end[-4] == 'e' ? length - 4 : length;
    return Shape{length, size_t{negative} + 1, exp, negative};
  }
  size_t dot = s[size_t{negative} + 1] == '.' ? size_t{negative} + 1 : size_t{negative} + 2;
  // an exponent is e[+-]d or e[+-]dd, so its 'e' is 3 or 4 bytes from the end (for a shorter
  // number those bytes are the comma before it, or its own digits or '.')
  size_t exp = end[-4] == 'e' ? length - 4 : end[-3] == 'e' ? length - 3 : length;
  return Shape{length, dot, exp, negative};
}

// logprob_runs' second step: `each` sees the elements that end at the commas `commas` (a mask
// a block, `blocks` blocks from `at`), the first at `first` (moved past each one taken). False
// when `each` answered false (`first` is then that element). Out of line: its registers are
// the numbers'.
template <bool Wide, typename F>
[[gnu::noinline]] bool logprob_elements(const uint8_t* buf, size_t at, const uint64_t* commas,
                                        size_t blocks, size_t& first_out, F& each) {
  size_t first = first_out;
  for (size_t b = 0; b < blocks; b++, at += 64) {
    for (uint64_t m = commas[b]; m; m &= m - 1) {
      size_t end = at + static_cast<size_t>(__builtin_ctzll(m));
      const uint8_t* s = buf + first;
      if (!each(s, logprob_shape<Wide>(s, end - first))) {
        first_out = first;
        return false;
      }
      first = end + 1;
    }
  }
  first_out = first;
  return true;
}

// Elements of an array from `start` (an element's first byte) on that are numbers in the form
// LogprobForm checks (the whole form with `Wide`, else the narrow one), separated by bare
// commas, checked 64 bytes a block as a stream; once a block passes, `each(first, shape)`
// sees each element its commas end. `each` returns false to stop there. Returns where it
// stopped: the first byte of an element it did not take (the block with the array's end, or
// anything else, leaves the elements it holds to the general path). Needs 32 readable bytes
// before `start`: the readers `each` calls load them. The caller runs the narrow form first
// and the whole one where it took nothing (walk.h): two loops, each as tight as its form
// allows.
//
// In two steps per batch of up to kBatch blocks: the blocks are checked and their comma masks
// kept, then `each` sees the elements (logprob_elements). One loop did both, and the block
// check's masks (LogprobForm's five carried ones among them) took the registers the reading
// of each number needed: it kept its own counters on the stack. The elements seen and their
// order are the same (a block's elements only once it passed; the first `each` that answers
// false ends it there), so the batches change what it costs, not what it takes.
template <bool Wide, typename F>
size_t logprob_runs(const uint8_t* buf, size_t start, F&& each) {
#if defined(__SSE2__)
  if (start < 32) return start;
  constexpr size_t kBatch = 16;
  uint64_t commas[kBatch];
  uint64_t prev_comma = 1ULL << 63;  // as if a comma came before the first element
  LogprobForm form;
  size_t first = start;  // the first element not taken yet
  size_t at = start;
  while (true) {
    size_t blocks = 0, batch_at = at;
    bool stopped = false;
    for (; blocks < kBatch; blocks++, at += 64) {
      Block block(buf + at);
      uint64_t digit = block.digits(), comma = block.eq<','>(), minus = block.eq<'-'>();
      uint64_t dot = block.eq<'.'>(), e = block.eq<'e'>(), plus = block.eq<'+'>();
      LogprobForm next;
      uint64_t bad = ~(digit | comma | minus | dot | e | plus) |
                     form.check<Wide>(buf + at, before(comma, prev_comma, 1), digit, minus, dot,
                                      e, plus, next);
      if (bad) {
        stopped = true;
        break;
      }
      form = next;
      commas[blocks] = comma;
      prev_comma = comma;
    }
    if (!logprob_elements<Wide>(buf, batch_at, commas, blocks, first, each) || stopped) {
      return first;
    }
  }
#else
  (void)each;
  return start;
#endif
}

#if defined(__SSE2__)
// flat_objects' masks carried from block to block.
struct FlatCarried {
  uint64_t number = 0, colon = 0, opens_next = 0, close = 0, outer = 1ULL << 63;
  uint64_t inside = 0, object = 0;  // all ones when the previous block ended in one
  Strings strings;
  LogprobForm form;
};

// One block of flat_objects in one form of the numbers (`Wide`), its strings' bytes checked
// (`Odd`: the block or the one before has a backslash, a control byte or a byte >= 0x80) or
// not (then the caller has seen that it has none of those bytes and carries no escape: the
// quotes are all the check needs); `odd` is the block's block.odd() with Odd (the caller's
// own test computed it), else unused. Answers the bytes that break it; when none, `prev` and
// `resume` move past it.
template <bool Wide, bool Odd>
[[gnu::always_inline]] inline uint64_t flat_block(const Block& block, uint64_t odd,
                                                  const uint8_t* buf, size_t start, size_t at,
                                                  size_t& resume, FlatCarried& prev) {
  Strings strings = prev.strings;
  uint64_t in_strings = 0;
  uint64_t quote = Odd ? strings.quotes<true>(block, odd, buf + at, buf + start, in_strings)
                       : block.eq<'"'>();
  uint64_t inside = prefix_xor(quote) ^ prev.inside;  // an opening quote and its bytes
  uint64_t out = ~(inside | quote);
  uint64_t open = block.eq<'{'>() & out, close = block.eq<'}'>() & out;
  uint64_t comma = block.eq<','>() & out, colon = block.eq<':'>() & out;
  uint64_t digit = block.digits() & out, minus = block.eq<'-'>() & out;
  uint64_t dot = block.eq<'.'>() & out, e = block.eq<'e'>() & out, plus = block.eq<'+'>() & out;
  uint64_t number = digit | minus | dot | e | plus;
  uint64_t object = prefix_xor(open | close) ^ prev.object;  // a '{' up to before its '}'
  uint64_t opens = quote & inside;
  uint64_t members = comma & object, outer = comma & ~object;
  uint64_t number1 = before(number, prev.number, 1);  // the byte before is in a number
  uint64_t starts = number & ~number1, after_number = number1 & ~number;
  // What may follow what: '{' only after a comma between objects (or first), then a key;
  // a key only after '{' or a comma between members; a number only after ':'; after a
  // number only a comma between members or '}'; after '}' only a comma between objects.
  // (That each key's closing quote is followed by ':', that braces take turns and that
  // numbers are only in objects follows from these.)
  LogprobForm form;
  uint64_t bad = in_strings | (out & ~(open | close | colon | comma | number)) |
                 (open ^ before(outer, prev.outer, 1)) |
                 (opens ^ before(open | members, prev.opens_next, 1)) |
                 (starts ^ before(colon, prev.colon, 1)) | ((members | close) ^ after_number) |
                 (outer ^ before(close, prev.close, 1)) |
                 prev.form.check<Wide>(buf + at, starts, digit, minus, dot, e, plus, form);
  if (bad) return bad;
  if (outer) resume = at + 64 - static_cast<size_t>(__builtin_clzll(outer));
  prev = FlatCarried{number, colon, open | members, close, outer, 0 - (inside >> 63),
                     0 - (object >> 63), strings, form};
  return 0;
}

// flat_block with its strings' bytes checked (escapes, UTF-8) from the block at `at` on: true
// at a block after the first with plain strings (ASCII, no backslash, nothing carried: `at`
// is that block, for flat_plain_blocks), false at a block it cannot pass (`at` is that block,
// `prev` and `resume` as before it). Out of line, with no call in its loop.
template <bool Wide>
[[gnu::noinline]] bool flat_odd_blocks(const uint8_t* buf, size_t start, size_t& at,
                                       size_t& resume, FlatCarried& prev) {
  FlatCarried here = prev;
  size_t block_at = at, resume_at = resume;
  bool plain = false;
  while (true) {
    Block block(buf + block_at);
    uint64_t odd = block.odd();
    if (block_at != at && (odd | here.strings.carry) == 0) {
      plain = true;
      break;
    }
    if (flat_block<Wide, true>(block, odd, buf, start, block_at, resume_at, here)) break;
    block_at += 64;
  }
  prev = here;
  at = block_at;
  resume = resume_at;
  return plain;
}

// flat_block's common case from the block at `at` on, until a block with odd bytes (a
// backslash, a control byte, a byte >= 0x80, or an escape carried in: flat_odd_blocks checks
// it) or one it cannot pass (`at` is then that block, `prev` and `resume` as before it). The
// odd bytes are looked for first, anywhere in the block: outside strings they break the
// block in either path, so which path checks it changes what it costs, not what passes; a
// block with them is not checked here first only to be checked again there. Out of line,
// with no call in its loop and its state in locals: its registers stay on the blocks.
template <bool Wide>
[[gnu::noinline]] void flat_plain_blocks(const uint8_t* buf, size_t start, size_t& at,
                                         size_t& resume, FlatCarried& prev) {
  FlatCarried here = prev;
  size_t block_at = at, resume_at = resume;
  while (true) {
    Block block(buf + block_at);
    if ((block.odd() | here.strings.carry) != 0 ||
        flat_block<Wide, false>(block, 0, buf, start, block_at, resume_at, here)) {
      break;
    }
    block_at += 64;
  }
  prev = here;
  at = block_at;
  resume = resume_at;
}
#endif

// Elements of an array from `start` (an opening brace) on that are flat objects the way
// vLLM prints top_logprobs, {"key":number,...}: keys strings (their escapes and UTF-8 checked
// by Strings), values numbers in the logprob form, no whitespace. Checked 64 bytes a block as
// a stream: which bytes are in strings is a prefix XOR of the quotes, which are in objects
// one of the braces (each carried into the next block), and the grammar is relations between
// the class masks, each byte against the bytes before it (`before` shifts a mask by k bytes,
// the previous block's top bits carried in). Blocks whose strings are plain (ASCII, no
// backslash) go through the common path; the others, and the rest of an array once a number
// needs LogprobForm's whole form, are checked again by the fuller path. Returns where it
// stopped: the first byte of the element after the last comma between objects in the blocks
// it passed (an element it did not check, left to the general path).
inline size_t flat_objects(const uint8_t* buf, size_t start) {
#if defined(__SSE2__)
  FlatCarried prev;
  size_t resume = start, at = start;
  bool wide = false;
  while (true) {
    if (wide) {
      flat_plain_blocks<true>(buf, start, at, resume, prev);
      if (!flat_odd_blocks<true>(buf, start, at, resume, prev)) return resume;
    } else {
      flat_plain_blocks<false>(buf, start, at, resume, prev);
      // a block with plain strings broke the narrow form (or is the array's end): straight to
      // the whole form; else its strings first
      bool plain = (Block(buf + at).odd() | prev.strings.carry) == 0;
      if (plain || !flat_odd_blocks<false>(buf, start, at, resume, prev)) {
        wide = true;  // the block at `at` again, in the whole form
        if (!flat_odd_blocks<true>(buf, start, at, resume, prev)) return resume;
      }
    }
  }
#else
  return start;
#endif
}

}  // namespace nogil
