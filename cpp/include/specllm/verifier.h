// Verification of a draft against the target's logits for the batch [id_last, d1, ..., dk].
//   greedy:   accept while d_{i+1} == argmax(row i); emit the target's own token at the first mismatch
//             (or the bonus token after a full accept).
//   sampling: rejection sampling (Leviathan et al. 2023, Chen et al. 2023): accept d with probability
//             min(1, p(d)/q(d)); on rejection draw from norm(max(0, p - q)); after a full accept draw from p.
//             A draft without probabilities (n-gram, or a model drafting greedily) is a one-hot q.
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
    // q: the draft distribution per draft token, or empty for one-hot drafts
    Verdict verify(const std::vector<llama_token> & draft, const std::vector<Dist> & q, const LogitsRow & row,
                   int n_vocab, const SamplingOptions & opts, Rng & rng);

    // a deliberately wrong variant for tests: resample the rejected position from p instead of the residual
    bool wrong_resample_from_p = false;

  private:
    Warper warper_;
    Dist p_;
    Dist residual_;
    std::vector<float> dense_;
};

} // namespace specllm
