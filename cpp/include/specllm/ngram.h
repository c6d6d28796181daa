// N-gram index for prompt-lookup drafting: for every n in [n_min, n_max], the most recent position that
// followed each n-gram of the sequence. Appending a token updates it in O(n_max); a lookup is O(n_max).
#pragma once

#include "llama.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace specllm {

class NgramIndex {
  public:
    NgramIndex(int n_min, int n_max);

    void clear();
    void push(llama_token token);          // append one token to the indexed sequence
    void truncate(size_t n);               // drop everything past n tokens (rebuilds the index)
    const std::vector<llama_token> & tokens() const { return tokens_; }

    static constexpr int max_match = 64;

    // continuation of the most recent earlier occurrence of the longest suffix (n_max down to n_min) that
    // occurred before; fills out with up to n_draft tokens and returns the match length (0 = none): the key
    // length extended backwards as far as the two occurrences agree, up to max_match
    int lookup(int n_draft, std::vector<llama_token> & out) const;

  private:
    uint64_t hash(size_t end, int n) const; // hash of tokens_[end - n, end)
    bool same(size_t end_a, size_t end_b, int n) const;

    int n_min_;
    int n_max_;
    std::vector<llama_token> tokens_;
    // per n: hash of an n-gram -> index of the token that followed its most recent occurrence
    std::vector<std::unordered_map<uint64_t, uint32_t>> maps_;
};

} // namespace specllm
