// impl.decode's compiled decoders: the UTF-8 lookup algorithm (utf8.h) over one vector type.
//
// No include guard: utf8.h includes this file once per instruction set, inside that set's
// namespace (which defines `Vec`, `kWidth` and the operations used here) and target pragma.

// The vectors of the three tables (utf8.h), loaded once per string.
struct Tables {
  Vec first_high, first_low, second_high;
};

// Nonzero bytes where the block `in` (after the block `before`) is not valid UTF-8.
inline Vec block_errors(const Tables& t, Vec in, Vec before) {
  Vec before1 = earlier<1>(in, before);
  Vec pairs = vand(vand(lookup(t.first_high, high_nibbles(before1)),
                        lookup(t.first_low, low_nibbles(before1))),
                   lookup(t.second_high, high_nibbles(in)));
  // bit 7: this byte must continue a 3- or 4-byte sequence (the byte two before is a lead
  // >= 0xE0, or the byte three before one >= 0xF0): saturating subtractions leave >= 0x80 there
  Vec third = subs(earlier<2>(in, before), splat<0xE0 - 0x80>());
  Vec fourth = subs(earlier<3>(in, before), splat<0xF0 - 0x80>());
  Vec must_continue = vand(vor(third, fourth), splat<0x80>());
  // two continuation bytes in a row (pairs' bit 7) exactly where one must continue
  return vxor(pairs, must_continue);
}

// [s, s + n) is valid UTF-8: whole blocks, then the rest followed by zeros (ASCII, so a
// sequence cut short at the end is an error like any other). Reads only those bytes.
inline bool valid(const uint8_t* s, size_t n) {
  const Tables t{table(utf8::kFirstHigh), table(utf8::kFirstLow), table(utf8::kSecondHigh)};
  Vec before = zero(), errors = zero();
  size_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    Vec in = load(s + i);
    errors = vor(errors, block_errors(t, in, before));
    before = in;
  }
  uint8_t rest[kWidth] = {};
  std::memcpy(rest, s + i, n - i);
  errors = vor(errors, block_errors(t, load(rest), before));
  return !any(errors);
}
