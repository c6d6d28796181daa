#include "specllm/penalties.h"

namespace specllm {

void PenaltyWindow::reset(const SamplingOptions & s, const llama_token * seq, size_t n) {
    s_ = &s;
    penalize_ = penalizes(s);
    window_.clear();
    counts_.clear();
    if (!penalize_) {
        return;
    }
    cap_ = s.penalty_last_n < 0 ? 0 : (size_t) s.penalty_last_n;
    const size_t from = cap_ > 0 && n > cap_ ? n - cap_ : 0;
    for (size_t i = from; i < n; ++i) {
        push(seq[i]);
    }
}

void PenaltyWindow::push(llama_token t) {
    if (!penalize_) {
        return;
    }
    if (cap_ > 0 && window_.size() == cap_) {
        const llama_token old = window_.front();
        window_.pop_front();
        if (--counts_[old] == 0) {
            counts_.erase(old);
        }
    }
    window_.push_back(t);
    counts_[t] += 1;
}

const float * PenaltyWindow::apply(const float * logits, int n_vocab, std::vector<float> & out) const {
    out.assign(logits, logits + n_vocab);
    for (const auto & [id, count] : counts_) {
        if (id < 0 || id >= n_vocab) {
            continue;
        }
        float & l = out[(size_t) id];
        l = l <= 0.0f ? l * s_->repeat_penalty : l / s_->repeat_penalty;
        l -= (float) count * s_->frequency_penalty + s_->presence_penalty;
    }
    for (const auto & [id, bias] : s_->logit_bias) {
        if (id >= 0 && id < n_vocab) {
            out[(size_t) id] += bias;
        }
    }
    return out.data();
}

PenalizedRows::PenalizedRows(const PenaltyWindow & context, const std::vector<llama_token> & draft,
                             const LogitsRow & row, int n_vocab)
    : draft_(draft), row_(row), n_vocab_(n_vocab), base_(context), window_(context) {}

const float * PenalizedRows::read(int i) {
    if (i < at_) { // the verifiers read in order; a reader going back starts again from row 0
        window_ = base_;
        at_ = 0;
    }
    for (; at_ < i; ++at_) {
        window_.push(draft_[(size_t) at_]);
    }
    return window_.apply(row_(i), n_vocab_, buf_);
}

} // namespace specllm
