// impl.decode's compiled decoders: JSON string escapes.
//
// `escape_len` checks one; the index walk checks every backslash of the body in one memchr
// sweep (`escapes_valid`: stage 1 has already found the strings, validated UTF-8 and rejected
// unescaped control characters in them, and a body has few backslashes), the byte walk each
// one its string scan meets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace nogil {

inline bool hex4(const uint8_t* p, uint32_t& out) {
  uint32_t value = 0;
  for (int i = 0; i < 4; i++) {
    uint8_t c = p[i];
    uint32_t digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
      digit = (c | 0x20) - 'a' + 10;
    } else {
      return false;
    }
    value = value << 4 | digit;
  }
  out = value;
  return true;
}

// Length of the backslash escape at p (p[0] == '\\'): 2, 6 or 12 bytes; 0 when JSON does not
// allow it (lone surrogates included, which go to the reference).
inline size_t escape_len(const uint8_t* p) {
  switch (p[1]) {
    case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
      return 2;
    case 'u':
      break;
    default:
      return 0;
  }
  uint32_t unit, low;
  if (!hex4(p + 2, unit)) return 0;
  if (unit >= 0xDC00 && unit <= 0xDFFF) return 0;
  if (unit < 0xD800 || unit > 0xDBFF) return 6;
  if (p[6] != '\\' || p[7] != 'u' || !hex4(p + 8, low) || low < 0xDC00 || low > 0xDFFF) return 0;
  return 12;
}

// Every backslash in [buf, buf + len) starts an escape JSON allows: \" \\ \/ \b \f \n \r \t or
// \uXXXX, with UTF-16 surrogates only as a high-low pair (Python also takes lone ones; those
// bodies go to the reference, as with simdjson's own string parser). Inside strings that is
// exactly the string check stage 1 leaves; a backslash outside strings sits in a scalar
// token, which the walk rejects anyway. A sequence running past the end meets the byte at
// `len` (a NUL of the bytes object, or a space of the padded copy) and fails.
inline bool escapes_valid(const uint8_t* buf, size_t len) {
  const uint8_t* p = buf;
  const uint8_t* end = buf + len;
  while (p < end) {
    p = static_cast<const uint8_t*>(std::memchr(p, '\\', static_cast<size_t>(end - p)));
    if (p == nullptr) return true;
    size_t length = escape_len(p);
    if (length == 0) return false;
    p += length;
  }
  return true;
}

}  // namespace nogil
