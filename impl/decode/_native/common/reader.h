// impl.decode's compiled decoders: the vLLM body's shape, read over a walk.
//
// `Reader<Walker>` adds to a grammar walk (`Walker`: `IndexWalker`, the index walk of
// simdjson_nogil/walk.h, or `ByteWalker`, the byte walk of onepass_nogil/walk.h) what the
// Completion keeps: the choices in index order with their `token_ids`, `token_logprobs` and
// finish reason, and the first choice's prompt logprobs with top-k rows. Every other value goes
// through `skip`.
// Anything unexpected (a wrong type, an escaped or duplicated key it reads, a length
// mismatch) answers false, and the reference decides.
#pragma once

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string_view>
#include <vector>

#include "bytes.h"
#include "packed.h"
#include "request.h"

namespace nogil {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kTopkPadLogprob = -99999.0f;

struct Choice {
  int64_t index = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  bool stop = false;
  size_t prompt_logprobs = 0;   // position of the value + 1; 0 = absent or null
  size_t prompt_token_ids = 0;  // likewise (null counts as present, as in the reference)
  // logprobs.packed_top_logprobs: seen (the key), present (not null), its shape and the bytes
  // its two base64 strings hold (checked against the token count once the choice is read)
  bool packed_seen = false, packed = false;
  int64_t packed_rows = 0, packed_k = 0;
  size_t packed_ids = 0, packed_lps = 0;
};

// What a decode found. Kept per thread and reused: its vectors keep their capacity, so a
// second decode of a large body writes into pages already there (no page faults).
struct Result {
  std::vector<Choice> choices;  // the first `n` are this decode's, in body order
  size_t n = 0;
  std::vector<size_t> order;    // their positions in `index` order (set by Reader::body)
  bool has_prompt = false;
  std::vector<float> prompt;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_lps;

  void clear() {
    n = 0;
    has_prompt = false;
  }
  Choice& add() {
    if (n == choices.size()) choices.emplace_back();
    Choice& c = choices[n++];
    c.index = 0;
    c.tokens.clear();
    c.logprobs.clear();
    c.stop = false;
    c.prompt_logprobs = c.prompt_token_ids = 0;
    c.packed_seen = c.packed = false;
    return c;
  }
};

template <typename Walker>
struct Reader : Walker {
  // What the reader uses of its walk: the position and request, peeks and literals, the three
  // container helpers (`array`, `object`, `skip`: each validates what it steps over), the kept
  // scalars (`integer`, `number`, `string`) and the walk's bulk paths for the kept arrays.
  using Walker::pos;
  using Walker::rq;
  using Walker::peek;
  using Walker::is_null;
  using Walker::take_null;
  using Walker::at_end;
  using Walker::elements_bound;
  using Walker::array;
  using Walker::object;
  using Walker::skip;
  using Walker::skip_top_logprobs;
  using Walker::integer;
  using Walker::number;
  using Walker::string;
  using Walker::bulk_int32;
  using Walker::bulk_logprobs;

  // An array of int32 (token ids) into `out`: the walker's bulk path first, then one at a time.
  bool int32_array(size_t depth, std::vector<int32_t>& out) {
    return array(depth, [&] {
      int64_t token;
      if (!bulk_int32(out) || !integer(token) || token < INT32_MIN || token > INT32_MAX) {
        return false;
      }
      out.push_back(static_cast<int32_t>(token));
      return true;
    });
  }

  bool logprobs(Choice& choice) {  // the value of "logprobs" (in a choice, itself at depth 3)
    if (take_null()) return true;
    if (peek() != '{') return false;
    bool seen = false;
    size_t tokens_at = 0, logprobs_at = 0;  // where `tokens` and `token_logprobs` start, once seen
    return object(4, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      if (key == "tokens") {
        tokens_at = pos;
        return skip(4);
      }
      if (key == "top_logprobs") return skip_top_logprobs(4, tokens_at, logprobs_at);
      if (key == "packed_top_logprobs") {
        if (choice.packed_seen) return false;
        choice.packed_seen = true;
        return take_null() || packed(choice);
      }
      if (key != "token_logprobs") return skip(4);
      if (seen) return false;
      seen = true;
      if (take_null()) return true;
      if (peek() != '[') return false;
      logprobs_at = pos;
      choice.logprobs.reserve(elements_bound());
      return array(5, [&] {
        bulk_logprobs(choice.logprobs);
        double value = 0.0;
        if (!take_null() && !number(value)) return false;
        choice.logprobs.push_back(static_cast<float>(value));  // double, then float32
        return true;
      });
    });
  }

  // The packed block (an object at depth 5): its shape, dtypes and base64 strings as
  // impl/decode/_packed.py checks them; an escaped string or anything doubtful: false.
  bool packed(Choice& choice) {
    if (peek() != '{') return false;
    static constexpr std::string_view names[] = {"shape", "token_ids_dtype", "logprobs_dtype",
                                                 "token_ids_b64", "logprobs_b64"};
    bool seen[5] = {};
    int64_t shape[2] = {0, 0};
    size_t dims = 0;
    bool ok = object(5, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      size_t which = 0;
      while (which < 5 && key != names[which]) which++;
      if (which == 5) return skip(5);
      if (seen[which]) return false;
      seen[which] = true;
      if (which == 0) {
        if (peek() != '[') return false;
        return array(6, [&] {
          int64_t value;
          if (dims == 2 || !integer(value)) return false;
          shape[dims++] = value;
          return true;
        });
      }
      const uint8_t *s, *e;
      bool esc;
      if (peek() != '"' || !string(s, e, esc) || esc) return false;
      std::string_view text(reinterpret_cast<const char*>(s), static_cast<size_t>(e - s));
      if (which == 1) return text == "<i4";
      if (which == 2) return text == "<f4";
      return base64_size(s, e, which == 3 ? choice.packed_ids : choice.packed_lps);
    });
    if (!ok || dims != 2) return false;
    for (bool member : seen) {
      if (!member) return false;
    }
    choice.packed = true;
    choice.packed_rows = shape[0];
    choice.packed_k = shape[1];
    return true;
  }

  static bool packed_fits(const Choice& c, size_t n_tokens) {
    if (c.packed_rows < 0 || static_cast<uint64_t>(c.packed_rows) != n_tokens) return false;
    if (c.packed_k < 1) return false;
    unsigned __int128 want = static_cast<unsigned __int128>(n_tokens) *
                             static_cast<uint64_t>(c.packed_k) * 4;
    return want == c.packed_ids && want == c.packed_lps;
  }

  bool choice(Choice& out) {
    if (peek() != '{') return false;
    static constexpr std::string_view names[] = {"index", "token_ids", "logprobs",
                                                 "finish_reason", "prompt_logprobs",
                                                 "prompt_token_ids"};
    bool seen[6] = {};
    bool has_index = false;
    bool ok = object(3, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      size_t which = 0;
      while (which < 6 && key != names[which]) which++;
      if (which == 6) return skip(3);
      if (seen[which]) return false;
      seen[which] = true;
      switch (which) {
        case 0:
          return has_index = integer(out.index);
        case 1:
          if (take_null()) return true;
          if (peek() != '[') return false;
          out.tokens.reserve(elements_bound());
          return int32_array(4, out.tokens);
        case 2:
          return logprobs(out);
        case 3:
          if (peek() == '"') {
            const uint8_t *s, *e;
            bool esc;
            if (!string(s, e, esc) || esc) return false;
            std::string_view finish(reinterpret_cast<const char*>(s), static_cast<size_t>(e - s));
            out.stop = finish == "stop" || finish == "stop_token";
            return true;
          }
          return skip(3);
        case 4:
          out.prompt_logprobs = is_null() ? 0 : pos + 1;
          return skip(3);
        default:
          out.prompt_token_ids = pos + 1;
          return skip(3);
      }
    });
    if (!ok || !has_index) return false;
    size_t n_tokens = out.tokens.size();
    if (out.packed && !packed_fits(out, n_tokens)) return false;
    if (out.logprobs.empty()) {
      out.logprobs.assign(n_tokens, 0.0f);  // no logprobs requested: zeros
    } else if (out.logprobs.size() != n_tokens) {
      return false;
    }
    return true;
  }

  // The whole body: root, then the choices put in `index` order (stably) and the first one's
  // prompt logprobs read.
  bool body(Result& out) {
    if (!root(out)) return false;
    out.order.resize(out.n);
    for (size_t i = 0; i < out.n; i++) out.order[i] = i;
    std::stable_sort(out.order.begin(), out.order.end(), [&](size_t a, size_t b) {
      return out.choices[a].index < out.choices[b].index;
    });
    const Choice* first = out.n ? &out.choices[out.order[0]] : nullptr;
    return first == nullptr || first->prompt_logprobs == 0 || prompt(*first, out);
  }

  bool root(Result& result) {
    if (peek() != '{') return false;
    bool seen = false;
    bool ok = object(1, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      if (key != "choices") return skip(1);
      if (seen || peek() != '[') return false;
      seen = true;
      return array(2, [&] {
        return choice(result.add());
      });
    });
    return ok && seen && at_end();
  }

  // One member of a prompt logprob entry: {"logprob": number|null, "rank": int, ...}.
  struct Item {
    bool object = false, rank_ok = false, logprob_ok = true;
    int64_t rank = 0;
    float logprob = kNaN;
  };
  bool item(Item& out) {  // a value in a prompt logprob entry (an object at depth 5)
    if (peek() != '{') return skip(5);  // not an object: only an error if it is read
    out.object = true;
    bool seen_rank = false, seen_logprob = false;
    return object(6, [&](std::string_view key, bool escaped) {
      if (escaped) return false;
      if (key == "rank") {
        if (seen_rank) return false;
        seen_rank = true;
        if (peek() == '-' || is_digit(peek())) {
          out.rank_ok = integer(out.rank);
          return out.rank_ok;
        }
        return skip(6);
      }
      if (key == "logprob") {
        if (seen_logprob) return false;
        seen_logprob = true;
        if (take_null()) return true;
        double value;
        if (peek() == '-' || is_digit(peek())) {
          if (!number(value)) return false;
          out.logprob = static_cast<float>(value);
          return true;
        }
        out.logprob_ok = false;
        return skip(6);
      }
      return skip(6);
    });
  }

  struct Ranked {
    int64_t rank;
    int32_t token;
    float logprob;
  };

  bool prompt(const Choice& first, Result& out) {
    std::vector<int64_t> own_ids;
    const int64_t* tokens = rq.prompt_tokens;
    size_t n_tokens = rq.n_prompt_tokens;
    if (tokens == nullptr) {
      if (first.prompt_token_ids == 0) return false;
      pos = first.prompt_token_ids - 1;
      if (peek() != '[') return false;
      bool ok = array(4, [&] {
        int64_t token;
        if (!integer(token)) return false;
        own_ids.push_back(token);
        return true;
      });
      if (!ok) return false;
      tokens = own_ids.data();
      n_tokens = own_ids.size();
    }
    pos = first.prompt_logprobs - 1;
    if (peek() != '[') return false;
    size_t k = rq.k > 0 ? static_cast<size_t>(rq.k) : 0;
    out.has_prompt = true;
    out.prompt.assign(n_tokens, kNaN);
    out.topk_ids.assign(n_tokens * k, 0);
    out.topk_lps.assign(n_tokens * k, kTopkPadLogprob);
    std::vector<std::string_view> keys;
    std::vector<Ranked> ranked;
    size_t row = 0;
    bool ok = array(4, [&] {
      if (row >= n_tokens) return false;
      size_t i = row++;
      if (take_null()) return true;
      if (peek() != '{') return false;
      char text[24];
      int length = std::snprintf(text, sizeof text, "%lld", static_cast<long long>(tokens[i]));
      std::string_view own_key(text, static_cast<size_t>(length));
      keys.clear();
      ranked.clear();
      bool entry_ok = object(5, [&](std::string_view key, bool escaped) {
        if (escaped) return false;
        keys.push_back(key);
        bool own = key == own_key;
        if (!own && k == 0) return skip(5);
        if (take_null()) {
          return k == 0;  // a null own value is skipped; with k > 0 a null item is an error
        }
        Item it;
        if (!item(it) || !it.object) return false;
        if (own) {
          if (!it.logprob_ok) return false;
          out.prompt[i] = it.logprob;
        }
        if (k == 0) return true;
        if (key.empty() || key.size() > 10 || !it.rank_ok) return false;
        int64_t token = 0;
        for (char c : key) {
          if (c < '0' || c > '9') return false;
          token = token * 10 + (c - '0');
        }
        if (token > INT32_MAX) return false;
        if (it.rank < 1 || static_cast<uint64_t>(it.rank) > k) return true;
        if (!it.logprob_ok) return false;
        ranked.push_back({it.rank, static_cast<int32_t>(token), it.logprob});
        return true;
      });
      if (!entry_ok) return false;
      std::sort(keys.begin(), keys.end());
      if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return false;
      std::stable_sort(ranked.begin(), ranked.end(),
                       [](const Ranked& a, const Ranked& b) { return a.rank < b.rank; });
      for (size_t j = 0; j < ranked.size() && j < k; j++) {
        out.topk_ids[i * k + j] = ranked[j].token;
        out.topk_lps[i * k + j] = ranked[j].logprob;
      }
      return true;
    });
    return ok && row == n_tokens;
  }
};

}  // namespace nogil
