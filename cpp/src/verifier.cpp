#include "specllm/verifier.h"

#include <algorithm>
#include <cmath>

namespace specllm {

Verdict verify_greedy(const std::vector<llama_token> & draft, const LogitsRow & row, int n_vocab) {
    Verdict v;
    for (size_t i = 0; i <= draft.size(); ++i) {
        const llama_token t = argmax(row((int) i), n_vocab);
        if (i < draft.size() && t == draft[i]) {
            ++v.n_accepted;
            continue;
        }
        v.next = t;
        break;
    }
    return v;
}

Verdict SamplingVerifier::verify_coupled(const std::vector<llama_token> & draft, const std::vector<Dist> & q,
                                         const LogitsRow & row, int n_vocab, const SamplingOptions & opts,
                                         Rng & rng, int64_t pos0) {
    Verdict v;
    for (size_t i = 0; i <= draft.size(); ++i) {
        warper_.warp(row((int) i), n_vocab, opts, p_);
        const llama_token t = sample_keyed(p_, opts.seed, pos0 + (int64_t) i);
        if (i < draft.size()) {
            const llama_token d = draft[i];
            if (t == d) {
                ++v.n_accepted;
                continue;
            }
            const float q_d = q.empty() ? 1.0f : q[i].prob(d);
            if (wrong_for_tests && q_d > 0.0f && rng.uniform() < std::min(1.0, (double) p_.prob(d) / q_d)) {
                ++v.n_accepted;
                continue;
            }
        }
        v.next = t;
        break;
    }
    return v;
}

Verdict SamplingVerifier::verify(const std::vector<llama_token> & draft, const std::vector<Dist> & q,
                                 const LogitsRow & row, int n_vocab, const SamplingOptions & opts, Rng & rng,
                                 int64_t pos0, const LogitsRow & allowed) {
    if (!opts.rejection) {
        return verify_coupled(draft, q, row, n_vocab, opts, rng, pos0);
    }
    Verdict v;
    for (size_t i = 0; i < draft.size(); ++i) {
        warper_.warp(row((int) i), n_vocab, opts, p_);
        const llama_token d = draft[i];
        const Dist * qi = q.empty() ? nullptr : &q[i];
        if (const float * mask = qi && allowed ? allowed((int) i) : nullptr) { // q given the grammar allows it
            q_allowed_.ids.clear();
            q_allowed_.probs.clear();
            double z = 0.0;
            for (size_t j = 0; j < qi->ids.size(); ++j) {
                if (mask[qi->ids[j]] > -INFINITY) {
                    q_allowed_.ids.push_back(qi->ids[j]);
                    q_allowed_.probs.push_back(qi->probs[j]);
                    z += qi->probs[j];
                }
            }
            if (z > 0.0) { // d is allowed and was drawn from q: z >= q(d) > 0
                for (float & x : q_allowed_.probs) {
                    x = (float) (x / z);
                }
                qi = &q_allowed_;
            }
        }
        const float p_d = p_.prob(d);
        const float q_d = qi ? qi->prob(d) : 1.0f;
        // accept with probability min(1, p/q); q_d > 0 because d was drawn from q
        if (q_d > 0.0f && rng.uniform() < std::min(1.0, (double) p_d / q_d)) {
            ++v.n_accepted;
            continue;
        }
        if (wrong_for_tests) {
            v.next = sample(p_, rng);
            return v;
        }
        // residual norm(max(0, p - q)) on the union of both supports
        dense_.assign((size_t) n_vocab, 0.0f);
        for (size_t j = 0; j < p_.ids.size(); ++j) {
            dense_[p_.ids[j]] = p_.probs[j];
        }
        if (!qi) {
            dense_[d] = 0.0f;
        } else {
            for (size_t j = 0; j < qi->ids.size(); ++j) {
                dense_[qi->ids[j]] = std::max(0.0f, dense_[qi->ids[j]] - qi->probs[j]);
            }
        }
        residual_.ids.clear();
        residual_.probs.clear();
        double sum = 0.0;
        for (llama_token id : p_.ids) { // the residual's support lies inside p's
            if (dense_[id] > 0.0f) {
                residual_.ids.push_back(id);
                residual_.probs.push_back(dense_[id]);
                sum += dense_[id];
            }
        }
        if (sum <= 0.0) { // p == q up to rounding: any draw from p is exact
            v.next = sample(p_, rng);
            return v;
        }
        for (float & p : residual_.probs) {
            p = (float) (p / sum);
        }
        v.next = sample(residual_, rng);
        return v;
    }
    // full accept: the bonus token comes from p of the last row
    warper_.warp(row((int) draft.size()), n_vocab, opts, p_);
    v.next = sample(p_, rng);
    return v;
}

} // namespace specllm
