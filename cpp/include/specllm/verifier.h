// Verification of a draft against the target's logits for the batch [id_last, d1, ..., dk].
//   greedy:   accept while d_{i+1} == argmax(row i); emit the target's own token at the first mismatch
//             (or the bonus token after a full accept).
//   sampling, coupled (the default): the target's token at position pos0 + i is sample_keyed(p_i, seed, pos0 + i);
//             accept d while it equals that token, then emit the target's token. Every emitted token is the one
//             plain sampling emits with this seed, whatever was drafted.
//   sampling, rejection (opts.rejection): rejection sampling (Leviathan et al. 2023, Chen et al. 2023): accept d
//             with probability min(1, p(d)/q(d)); on rejection draw from norm(max(0, p - q)); after a full accept
//             draw from p. A draft without probabilities (n-gram, or a model drafting greedily) is a one-hot q.
//             Under a grammar, a draft is cut at its first token the grammar forbids (that row is then drawn from
//             p): a draft token verified was drawn from q given that the grammar allows it, so q is read restricted
//             to the tokens the grammar allows at that row and renormalized (allowed(i)); with q itself the cut
//             mass went to p instead of the residual and the output was not the target's distribution (TV 0.09).
#pragma once

#include "specllm/sampling.h"

#include <functional>

namespace specllm {

struct Verdict {
    int n_accepted = 0;     // draft tokens accepted
    llama_token next = -1;  // the token the target emits after them
};

// row(i) returns the target's logits for batch row i
using LogitsRow = std::function<const float *(int)>;

Verdict verify_greedy(const std::vector<llama_token> & draft, const LogitsRow & row, int n_vocab);

class SamplingVerifier {
  public:
    // q: the draft distribution per draft token, or empty for one-hot drafts; pos0: the sequence position of the
    // first draft token (row 0 predicts it); rng: rejection sampling's generator
    // allowed(i) (rejection sampling only): the grammar's mask for row i (-inf: forbidden), read after row(i);
    // nullptr, or no function, where every token is allowed
    Verdict verify(const std::vector<llama_token> & draft, const std::vector<Dist> & q, const LogitsRow & row,
                   int n_vocab, const SamplingOptions & opts, Rng & rng, int64_t pos0,
                   const LogitsRow & allowed = LogitsRow());

    // a deliberately wrong variant for tests. rejection: resample the rejected position from p instead of the
    // residual; coupled: a draft token unequal to the target's draw is still accepted with probability
    // min(1, p/q) (rejection sampling's test, without its residual)
    bool wrong_for_tests = false;

  private:
    Verdict verify_coupled(const std::vector<llama_token> & draft, const std::vector<Dist> & q, const LogitsRow & row,
                           int n_vocab, const SamplingOptions & opts, Rng & rng, int64_t pos0);
    Warper warper_;
    Dist p_;
    Dist residual_;
    Dist q_allowed_;
    std::vector<float> dense_;
};

} // namespace specllm
