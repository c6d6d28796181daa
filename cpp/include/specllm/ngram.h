// N-gram index for prompt-lookup drafting: for every n in [n_min, n_max], the positions that followed each
// n-gram of the sequence (the most recent one, chained to the earlier ones). Appending a token updates it in
// O(n_max); a lookup compares at most max_candidates earlier occurrences of the longest key that occurred.
#pragma once

#include "llama.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace specllm {

struct NgramMatch {
    int length = 0;         // key length extended backwards as far as the two occurrences agree (0 = none)
    bool ambiguous = false; // earlier occurrences of the key continue with different tokens
    size_t source = 0;      // index of the first proposed token in the indexed sequence
};

class NgramIndex {
  public:
    NgramIndex(int n_min, int n_max);

    void clear();
    void push(llama_token token);          // append one token to the indexed sequence
    void truncate(size_t n);               // drop everything past n tokens (rebuilds the index)
    const std::vector<llama_token> & tokens() const { return tokens_; }

    static constexpr int max_match = 64;
    static constexpr int max_candidates = 256;

    // continuation of the earlier occurrence of the longest key (n_max down to n_min) that agrees furthest
    // back with the current text (up to max_match tokens; ties: the most recent), i.e. the place a copy in
    // progress is copying from. Fills out with up to n_draft tokens.
    NgramMatch lookup(int n_draft, std::vector<llama_token> & out) const;
    // up to n_draft tokens from `source` on (a match's continuation)
    void continuation(size_t source, int n_draft, std::vector<llama_token> & out) const;

  private:
    uint64_t hash(size_t end, int n) const; // hash of tokens_[end - n, end)
    bool same(size_t end_a, size_t end_b, int n) const;

    int n_min_;
    int n_max_;
    std::vector<llama_token> tokens_;
    // per n: hash of an n-gram -> index of the token that followed its most recent occurrence
    std::vector<std::unordered_map<uint64_t, uint32_t>> maps_;
    // per n: prev_[n][i] = the position that followed the previous occurrence of the n-gram ending at i
    // (no_prev if none): the chain of earlier occurrences
    std::vector<std::vector<uint32_t>> prev_;
    static constexpr uint32_t no_prev = UINT32_MAX;
};

} // namespace specllm
