// Reading a step's verify rows under a grammar (grammar.h): the shortcuts that check a few tokens where the whole
// vocabulary need not be masked, and what masking costs on this machine.
#include "specllm/grammar.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace specllm {

ConstrainedRows::ConstrainedRows(Grammar & grammar, const std::vector<llama_token> & draft, const LogitsRow & row,
                                 int n_vocab, const SamplingOptions & sampling, int64_t pos0, bool full_mask)
    : committed_(grammar), work_(grammar), draft_(draft), row_(row), n_vocab_(n_vocab), sampling_(sampling),
      pos0_(pos0), full_mask_(full_mask) {}

const float * ConstrainedRows::read(int i) {
    while (at_ < i) { // row i is read once drafts before it were accepted; the legal prefix keeps them allowed
        work_.accept(draft_[(size_t) at_++]);
    }
    const float * logits = row_(i);
    if (!work_.constrains()) { // a lazy grammar still waiting for its trigger allows every token
        return logits;
    }
    if (full_mask_) {
    } else if (sampling_.temperature <= 0.0f) {
        if (work_.allows(argmax(logits, n_vocab_))) {
            return logits;
        }
    } else if (!sampling_.rejection && sampling_.top_p >= 1.0f) {
        const llama_token t = keyed_draw(logits, pos0_ + i);
        if (t >= 0) {
            return only(t);
        }
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (sampling_.rejection && sampling_.temperature > 0.0f) {
        // the mask alone (the grammar's, on equal logits), kept for the verifier (allowed()), then the row through it
        zeros_.assign((size_t) n_vocab_, 0.0f);
        work_.mask(zeros_.data(), n_vocab_, allowed_);
        allowed_row_ = i;
        masked_.resize((size_t) n_vocab_);
        bool any = false;
        for (int t = 0; t < n_vocab_; ++t) {
            masked_[(size_t) t] = allowed_[(size_t) t] > -INFINITY ? logits[t] : -INFINITY;
            any = any || masked_[(size_t) t] > -INFINITY;
        }
        if (!any) { // as Grammar::mask: the end of generation when no allowed token has a finite logit
            const llama_token eos = llama_vocab_eos(work_.vocab_);
            masked_[(size_t) (eos >= 0 && eos < n_vocab_ ? eos : 0)] = 0.0f;
        }
    } else {
        work_.mask(logits, n_vocab_, masked_);
    }
    mask_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++n_masks_;
    return masked_.data();
}

const float * ConstrainedRows::only(llama_token t) {
    masked_.assign((size_t) n_vocab_, -INFINITY);
    masked_[(size_t) t] = 0.0f;
    return masked_.data();
}

namespace {

constexpr size_t max_checks = 4096; // tokens checked one by one before the whole row is masked instead

// sorts order[done..] far enough that its first n are in ascending `less` order; returns the new sorted count
template <typename Less> size_t sort_more(std::vector<llama_token> & order, size_t done, size_t n, Less less) {
    n = std::min(order.size(), std::max(n, 2 * done));
    std::partial_sort(order.begin() + (long) done, order.begin() + (long) n, order.end(), less);
    return n;
}

} // namespace

// The token sample_keyed(warp(masked row)) gives. Warping keeps the order of logits and the keyed race is an argmin
// over the kept tokens of -log(u) / p, unchanged by normalizing p: so, with temperature alone, the unmasked winner
// when allowed, else the first allowed token in race order; with top-k / min-p, the race among the highest allowed
// tokens that the warper would keep of the masked row.
llama_token ConstrainedRows::keyed_draw(const float * logits, int64_t pos) {
    const SamplingOptions & o = sampling_;
    const bool truncated = o.top_k > 0 || o.min_p > 0.0f;
    if (!truncated) {
        warper_.warp(logits, n_vocab_, o, dist_);
        const llama_token t = sample_keyed(dist_, o.seed, pos);
        if (work_.allows(t)) {
            return t; // the common case: no order needed
        }
    }
    order_.resize((size_t) n_vocab_);
    for (int t = 0; t < n_vocab_; ++t) {
        order_[(size_t) t] = t;
    }
    if (!truncated) {
        const float l_max = *std::max_element(logits, logits + n_vocab_);
        const uint64_t key = race_key(o.seed, pos);
        key_.resize((size_t) n_vocab_);
        for (int t = 0; t < n_vocab_; ++t) { // -log(u) / p, p up to a common factor
            key_[(size_t) t] = -std::log(race_uniform(key, t)) / std::exp((double) (logits[t] - l_max) / o.temperature);
        }
        auto by_race = [this](llama_token a, llama_token b) { return key_[(size_t) a] < key_[(size_t) b]; };
        size_t sorted = 0;
        for (size_t j = 0; j < std::min(order_.size(), max_checks); ++j) {
            if (j == sorted) {
                sorted = sort_more(order_, sorted, 64, by_race);
            }
            if (key_[(size_t) order_[j]] < INFINITY && work_.allows(order_[j])) {
                return order_[j];
            }
        }
        return -1;
    }
    // top-k, then min-p relative to the most likely allowed token: the candidates, highest logit first
    auto by_logit = [logits](llama_token a, llama_token b) { return logits[a] > logits[b]; };
    const size_t k = o.top_k > 0 ? (size_t) o.top_k : order_.size();
    const double v_floor = o.min_p > 0.0f ? std::log((double) o.min_p) : -INFINITY;
    dist_.ids.clear();
    size_t sorted = 0;
    float l_top = 0.0f;
    for (size_t j = 0; j < order_.size() && dist_.ids.size() < k; ++j) {
        if (j >= max_checks) {
            return -1;
        }
        if (j == sorted) {
            sorted = sort_more(order_, sorted, 64, by_logit);
        }
        const llama_token t = order_[j];
        if (!dist_.ids.empty() && (double) (logits[t] - l_top) / (o.temperature_last ? 1.0 : o.temperature) <
                                      v_floor) {
            break;
        }
        if (logits[t] > -INFINITY && work_.allows(t)) {
            if (dist_.ids.empty()) {
                l_top = logits[t];
            }
            dist_.ids.push_back(t);
        }
    }
    if (dist_.ids.empty()) {
        return -1;
    }
    dist_.probs.resize(dist_.ids.size());
    double sum = 0.0;
    for (size_t j = 0; j < dist_.ids.size(); ++j) {
        dist_.probs[j] = (float) std::exp((double) (logits[dist_.ids[j]] - l_top) / o.temperature);
        sum += dist_.probs[j];
    }
    for (float & p : dist_.probs) {
        p = (float) (p / sum);
    }
    return sample_keyed(dist_, o.seed, pos);
}

void ConstrainedRows::advance(int n_accepted, llama_token next, bool end) {
    while (at_ < n_accepted) {
        work_.accept(draft_[(size_t) at_++]);
    }
    if (!end) {
        work_.accept(next);
    }
    committed_.swap_state(work_); // the committed state becomes the work's; the old one is freed
}

void MaskCost::observe(const ConstrainedRows & rows) {
    if (rows.n_masks() > 0) {
        const double w = std::max(0.2, 1.0 / ++n_);
        ms_ = (1.0 - w) * ms_ + w * rows.mask_ms() / rows.n_masks();
    }
}

} // namespace specllm
