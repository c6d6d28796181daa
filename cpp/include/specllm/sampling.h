// Token distributions: argmax, the warped distribution (temperature, top-k, top-p, min-p) that both the target
// (p) and the draft (q) use, and drawing from it with a portable, seedable generator.
#pragma once

#include "specllm/options.h"

#include "llama.h"

#include <cstdint>
#include <vector>

namespace specllm {

// a distribution over a subset of the vocabulary; probs sum to 1; ids[0] is the most likely token (the rest are
// sorted by descending probability only when top-p needed it)
struct Dist {
    std::vector<llama_token> ids;
    std::vector<float> probs;
    float prob(llama_token id) const; // 0 for tokens outside the support
};

// splitmix64: identical sequences on every platform and compiler (std:: distributions are not)
class Rng {
  public:
    explicit Rng(uint64_t seed = 0) : state_(seed) {}
    void seed(uint64_t seed) { state_ = seed; }
    uint64_t next();
    double uniform(); // [0, 1)

  private:
    uint64_t state_;
};

llama_token argmax(const float * logits, int n_vocab);
float top_prob(const float * logits, int n_vocab); // softmax probability of the argmax

// Warps logits into a distribution. Order (as in HF transformers): temperature, top-k, top-p (over the top-k
// candidates), then min-p (relative to the most likely token, which always stays).
// Avoids sorting the whole vocabulary: top-k selects with nth_element, top-p sorts growing prefixes.
class Warper {
  public:
    void warp(const float * logits, int n_vocab, const SamplingOptions & opts, Dist & out);

  private:
    std::vector<llama_token> ids_;
    std::vector<float> vals_;
};

llama_token sample(const Dist & dist, Rng & rng);

// A draw from dist keyed by (seed, pos), the same for every caller: each token id gets its own uniform u from a
// hash of seed, position and id, and the token with the smallest -log(u) / p wins (the exponential race, i.e.
// Gumbel-max: argmax log p + Gumbel). It follows dist exactly; two distributions drawn with one key pick the same
// token with probability at least (1 - tv) / (1 + tv) (tv: their total variation distance). The target's token at
// a position is this draw, whatever drafted before it: a seed names one text.
llama_token sample_keyed(const Dist & dist, uint64_t seed, int64_t pos);
uint64_t race_key(uint64_t seed, int64_t pos);   // the key of that draw ...
double race_uniform(uint64_t key, llama_token id); // ... and the u it gives token id

// validate sampling options; throws InvalidArgument with the allowed range
void check_sampling_options(const SamplingOptions & opts);

} // namespace specllm
