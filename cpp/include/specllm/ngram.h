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
    bool memory = false;    // found in the memory of earlier generations, not in the current text
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
    // the same for the suffix of another sequence (q[0..n_q)): where in this index does it occur?
    NgramMatch lookup(const llama_token * q, size_t n_q, int n_draft, std::vector<llama_token> & out) const;
    // up to n_draft tokens from `source` on (a match's continuation), ending at a separator
    void continuation(size_t source, int n_draft, std::vector<llama_token> & out) const;

    static constexpr llama_token separator = -1; // between documents: never part of a match or a continuation

  private:
    uint64_t hash_of(const llama_token * end, int n) const; // hash of the n tokens before end
    uint64_t hash(size_t end, int n) const; // hash of tokens_[end - n, end)

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

// The drafting memory: a bounded n-gram index over the outputs of earlier generations (separated, so that no
// match spans two of them). When it outgrows max_tokens, the oldest half is dropped.
class NgramMemory {
  public:
    NgramMemory(int n_min, int n_max) : index_(n_min, n_max) {}
    void set_max_tokens(size_t n);
    size_t max_tokens() const { return max_tokens_; }
    void add(const llama_token * tokens, size_t n); // one generation's output
    void clear() { index_.clear(); }
    bool empty() const { return index_.tokens().empty(); }
    const std::vector<llama_token> & tokens() const { return index_.tokens(); } // outputs and separators
    void assign(const std::vector<llama_token> & tokens); // what tokens() returned (a saved memory)
    const NgramIndex & index() const { return index_; }
    // draft from a match whose key the memory continues in more than one way (default: no, the text's match, if
    // any, stands instead). Over three multi-call runs' answers such a match proposed the right next token 0-21%
    // of the time in 11 of 14 groups by run and match length (227 matches), an unambiguous one 67-95%: the value
    // after a JSON key, the name after a tool's argument, which differ from one earlier output to the next
    void set_ambiguous_drafts(bool on) { ambiguous_drafts_ = on; }
    bool ambiguous_drafts() const { return ambiguous_drafts_; }

  private:
    // keep at most the newest n tokens, from a document boundary; with keep_part, the newest part of the newest
    // document when it alone is longer than n (a memory loaded into a smaller one)
    void shrink_to(size_t n, bool keep_part);
    static size_t first_kept(const std::vector<llama_token> & all, size_t n, bool keep_part); // where shrink_to cuts
    NgramIndex index_;
    size_t max_tokens_ = 0; // 0 = off
    bool ambiguous_drafts_ = false;
};

} // namespace specllm
