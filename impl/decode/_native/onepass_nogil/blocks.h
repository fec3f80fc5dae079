// impl.decode._onepass_nogil's 64-byte blocks: what the bulk checks (bulk.h) see of the bytes.
//
// `Block`: 64 bytes loaded once (two AVX2 or four SSE2 vectors) and bit masks of byte classes
// over them (bit i: byte i is of the class); the mask arithmetic the checks relate them with
// (`prefix_xor`, `before`, ...); and `Strings`, what a stream of blocks says about strings: which
// bytes a backslash escapes (`escaped_bytes`, found from the backslash mask first, the way
// simdjson's stage 1 does it), only then which quotes delimit strings, and which bytes would
// make a string invalid: a control byte, an escaped byte that is not a short escape (a \u
// escape, rare in vLLM's and orjson's output, is left to the walk, which checks its hex digits
// and surrogates), and in the AVX2 build invalid UTF-8, validated over the same blocks by the
// lookup algorithm of common/utf8.h with the previous block carried in (`Block::utf8_errors`).
// The baseline build leaves a string with a byte >= 0x80 to the walk.
//
// Reads: the 64 bytes of each block (and, for a block with a byte >= 0x80, the 64 before it).
#pragma once

#include <cstdint>

#include "../common/bytes.h"
#include "../common/utf8.h"
#if defined(__AVX2__) || defined(__PCLMUL__)
#include <immintrin.h>
#endif

namespace nogil {

#if defined(__SSE2__)
inline __m128i load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The 64 bytes at s, loaded once, and masks of byte classes over them (bit i: byte i is of
// the class): two AVX2 vectors where the build targets AVX2, else four SSE2 ones.
class Block {
 public:
  explicit Block(const uint8_t* s) {
    for (int i = 0; i < kVectors; i++) v_[i] = load(s + i * kWidth);
  }
  Block() {  // 64 zero bytes (ASCII): what comes before the first block
    for (int i = 0; i < kVectors; i++) v_[i] = zero();
  }
  template <char C>
  uint64_t eq() const {
    return mask([](Vec x) { return cmpeq(x, splat<C>()); });
  }
  uint64_t digits() const {  // '0'..'9': x - '0' is at most 9, unsigned
    return mask([](Vec x) {
      Vec d = sub(x, splat<'0'>());
      return cmpeq(min_u(d, splat<9>()), d);
    });
  }
  uint64_t odd() const {  // a backslash, a control byte or a byte >= 0x80 (signed < 0x20)
    return mask([](Vec x) { return bor(cmpeq(x, splat<'\\'>()), cmpgt(splat<0x20>(), x)); });
  }
  uint64_t control() const {  // a byte < 0x20: x is at most 0x1F, unsigned
    return mask([](Vec x) { return cmpeq(min_u(x, splat<0x1F>()), x); });
  }
  uint64_t high() const {  // a byte >= 0x80
    return mask([](Vec x) { return x; });
  }
  // The bytes JSON allows after a backslash but for 'u': " \ / b f n r t.
  uint64_t short_escapes() const {
    return mask([](Vec x) {
      return bor(bor(bor(cmpeq(x, splat<'"'>()), cmpeq(x, splat<'\\'>())),
                     bor(cmpeq(x, splat<'/'>()), cmpeq(x, splat<'b'>()))),
                 bor(bor(cmpeq(x, splat<'f'>()), cmpeq(x, splat<'n'>())),
                     bor(cmpeq(x, splat<'r'>()), cmpeq(x, splat<'t'>()))));
    });
  }
#if defined(__AVX2__)
  // The bytes where these 64 bytes, after the 64 of `prev`, stop being valid UTF-8 (each
  // error shows at or after the bytes that cause it: a sequence cut short, at the byte that
  // should have continued it). common/utf8.h's lookup algorithm, 32 bytes a step.
  uint64_t utf8_errors(const Block& prev) const {
    using namespace utf8_avx2;
    const Tables t{table(utf8::kFirstHigh), table(utf8::kFirstLow), table(utf8::kSecondHigh)};
    Vec low = block_errors(t, v_[0], prev.v_[1]), high = block_errors(t, v_[1], v_[0]);
    return ~(bits(cmpeq(low, zero())) | bits(cmpeq(high, zero())) << 32);
  }
#endif

 private:
#if defined(__AVX2__)
  using Vec = __m256i;
  static constexpr int kWidth = 32;
  static Vec load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const Vec*>(p)); }
  template <char C>
  static Vec splat() {
    return _mm256_load_si256(reinterpret_cast<const Vec*>(Splat<uint8_t(C)>::bytes));
  }
  static Vec zero() { return _mm256_setzero_si256(); }
  static Vec cmpeq(Vec a, Vec b) { return _mm256_cmpeq_epi8(a, b); }
  static Vec cmpgt(Vec a, Vec b) { return _mm256_cmpgt_epi8(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_epi8(a, b); }
  static Vec min_u(Vec a, Vec b) { return _mm256_min_epu8(a, b); }
  static Vec bor(Vec a, Vec b) { return _mm256_or_si256(a, b); }
  static uint64_t bits(Vec a) { return static_cast<uint32_t>(_mm256_movemask_epi8(a)); }
#else
  using Vec = __m128i;
  static constexpr int kWidth = 16;
  static Vec load(const uint8_t* p) { return load16(p); }
  template <char C>
  static Vec splat() {
    return _mm_load_si128(reinterpret_cast<const Vec*>(Splat<uint8_t(C)>::bytes));
  }
  static Vec zero() { return _mm_setzero_si128(); }
  static Vec cmpeq(Vec a, Vec b) { return _mm_cmpeq_epi8(a, b); }
  static Vec cmpgt(Vec a, Vec b) { return _mm_cmpgt_epi8(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm_sub_epi8(a, b); }
  static Vec min_u(Vec a, Vec b) { return _mm_min_epu8(a, b); }
  static Vec bor(Vec a, Vec b) { return _mm_or_si128(a, b); }
  static uint64_t bits(Vec a) { return static_cast<uint32_t>(_mm_movemask_epi8(a)); }
#endif
  static constexpr int kVectors = 64 / kWidth;
  template <typename Test>
  uint64_t mask(Test&& test) const {
    uint64_t out = 0;
    for (int i = 0; i < kVectors; i++) out |= bits(test(v_[i])) << (i * kWidth);
    return out;
  }
  Vec v_[kVectors];
};
#endif

// Bit i: the XOR of bits 0..i of x (one carry-less multiply where the build has PCLMUL).
inline uint64_t prefix_xor(uint64_t x) {
#if defined(__PCLMUL__)
  return static_cast<uint64_t>(_mm_cvtsi128_si64(
      _mm_clmulepi64_si128(_mm_cvtsi64_si128(static_cast<int64_t>(x)), _mm_set1_epi8(-1), 0)));
#else
  x ^= x << 1;
  x ^= x << 2;
  x ^= x << 4;
  x ^= x << 8;
  x ^= x << 16;
  return x ^ (x << 32);
#endif
}
// x moved k (1..63) bytes on: bit i is bit i - k of x, the low k bits the top k of `carried`
// (the same mask of the block before).
inline uint64_t before(uint64_t x, uint64_t carried, int k) {
  return (x << k) | (carried >> (64 - k));
}
// The bits below the lowest set bit of x (all 64 when x is 0).
inline uint64_t below_first(uint64_t x) { return x ? (x & (0 - x)) - 1 : ~0ULL; }
// The bits up to and including bit `last`.
inline uint64_t through(int last) { return last == 63 ? ~0ULL : (2ULL << last) - 1; }

// The bytes a backslash escapes (bit i + 1 for a backslash at i; a backslash escaped by the one
// before it escapes nothing), one step per backslash: a body has few. `carry` in: the block's
// first byte is escaped (the previous block ended in an escaping backslash); out: the next's is.
inline uint64_t escaped_bytes(uint64_t backslash, uint64_t& carry) {
  uint64_t escaped = carry;
  backslash &= ~carry;
  carry = 0;
  while (backslash) {
    int at = __builtin_ctzll(backslash);
    if (at == 63) {
      carry = 1;
      break;
    }
    escaped |= 2ULL << at;
    backslash &= ~(3ULL << at);
  }
  return escaped;
}

#if defined(__SSE2__)
// What the strings of a stream of blocks say, once escapes are known: `quote` the quotes that
// open or close a string, `bad` the bytes that would make one invalid (a control byte; a byte
// a backslash escapes that is not a short escape; a byte >= 0x80 where UTF-8 breaks, or in
// the baseline build any); only bytes inside strings decide (a backslash or a byte >= 0x80
// outside one is not a byte of any class the checks accept). Carried from block to block: an
// escape the previous block's last backslash started, and whether it had a byte >= 0x80 (its
// UTF-8 may continue here).
struct Strings {
  uint64_t carry = 0;  // bit 0: escaped; bit 1: the previous block had a byte >= 0x80

  // The quotes of `block` (the 64 bytes at `block_at`; `odd` its block.odd(), which the
  // caller has computed for its own test), and its bad bytes into `bad`; the 64 bytes before
  // the block are at `block_at - 64` unless `block_at` is `first` (then zeros). `Inline`: the
  // check of a block with odd bytes is inlined (for a loop that expects them), else a call
  // (the loop keeps its registers for the common block).
  template <bool Inline>
  [[gnu::always_inline]] uint64_t quotes(const Block& block, uint64_t odd_bytes,
                                         const uint8_t* block_at, const uint8_t* first,
                                         uint64_t& bad) {
    uint64_t quote = block.eq<'"'>();
    bad = 0;
    // one mask for the common block (ASCII, no backslash, no control byte): nothing to do
    if ((odd_bytes | carry) == 0) return quote;
    const uint8_t* prev = block_at == first ? nullptr : block_at - 64;
    Odd odd = Inline ? check(block, prev, quote, carry) : check_call(block_at, prev, quote, carry);
    carry = odd.carry;
    bad = odd.bad;
    return odd.quote;
  }

 private:
  struct Odd {
    uint64_t quote, bad, carry;
  };
  [[gnu::always_inline]] static Odd check(const Block& block, const uint8_t* prev,
                                          uint64_t quote, uint64_t carried) {
    uint64_t bad = block.control();
    uint64_t backslash = block.eq<'\\'>();
    uint64_t carry = carried & 1;
    bool prev_high = carried & 2;
    if (backslash | carry) {
      uint64_t escaped = escaped_bytes(backslash, carry);
      quote &= ~escaped;
      bad |= escaped & ~block.short_escapes();
    }
    uint64_t high = block.high();
#if defined(__AVX2__)
    if (high | prev_high) bad |= block.utf8_errors(prev ? Block(prev) : Block());
#else
    (void)prev;
    (void)prev_high;
    bad |= high;
#endif
    return Odd{quote, bad, carry | uint64_t{high != 0} << 1};
  }
  // Out of line, from the bytes again and by value.
  [[gnu::noinline]] static Odd check_call(const uint8_t* bytes, const uint8_t* prev,
                                          uint64_t quote, uint64_t carried) {
    return check(Block(bytes), prev, quote, carried);
  }
};
#endif

}  // namespace nogil
