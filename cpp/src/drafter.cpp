#include "specllm/drafter.h"

#include <algorithm>

namespace specllm {

void ModelDrafter::to_draft_ids(std::vector<llama_token> & seq) const {
    // a padded target vocabulary has ids the draft lacks: the draft reads them as id 0 (llama.h has no unknown
    // token query; what it drafts after them is a guess like any other, verification keeps the target's output)
    const int n_draft = model_->n_vocab();
    for (llama_token & t : seq) {
        if (t >= n_draft) {
            t = 0;
        }
    }
}

void ModelDrafter::prefill(const std::vector<llama_token> & history, const std::function<void()> & poll) {
    seq_.assign(history.begin(), history.end());
    to_draft_ids(seq_);
    const int n_keep = model_->keep_common_prefix(seq_);
    model_->decode_polled(seq_.data() + n_keep, (int) seq_.size() - n_keep, poll);
}

void ModelDrafter::propose(const DraftRequest & req, Draft & out) {
    out.tokens.clear();
    out.q.clear();
    out.from_ngram = false;
    out.from_memory = false;
    out.n_catchup = 0;
    if (req.n_max <= 0) {
        return;
    }
    // bring the draft cache to history + id_last: keep the shared prefix, decode the rest in one batch
    seq_.assign(req.history->begin(), req.history->end());
    seq_.push_back(req.id_last);
    to_draft_ids(seq_);
    int n_keep = model_->keep_common_prefix(seq_);
    if (n_keep == (int) seq_.size()) { // everything cached: re-decode the last token to get its logits
        model_->truncate(--n_keep);
    }
    // the draft cache must leave room for the draft itself
    if (model_->n_past() + (int) seq_.size() - n_keep + req.n_max > model_->n_ctx()) {
        return;
    }
    out.n_catchup = (int) seq_.size() - n_keep - 1;
    model_->decode(seq_.data() + n_keep, (int) seq_.size() - n_keep, false);

    const bool greedy = req.sampling->temperature <= 0.0f;
    const int n_vocab = n_shared_; // the logits of ids the target lacks (a padded draft vocabulary) are ignored
    const bool penalize = req.penalties != nullptr; // over the target's ids; apply skips ids past n_vocab
    if (penalize) {
        penalties_ = *req.penalties;
    }
    for (int i = 0; i < req.n_max; ++i) {
        const float * logits = model_->logits(-1);
        if (penalize) {
            logits = penalties_.apply(logits, n_vocab, penalized_);
        }
        llama_token tok;
        if (greedy) {
            if (req.p_min > 0.0f && i > 0 && top_prob(logits, n_vocab) < req.p_min) {
                break;
            }
            tok = argmax(logits, n_vocab);
        } else {
            out.q.emplace_back();
            warper_.warp(logits, n_vocab, *req.sampling, out.q.back());
            if (req.p_min > 0.0f && i > 0 && out.q.back().probs[0] < req.p_min) {
                out.q.pop_back();
                break;
            }
            tok = req.sampling->rejection ? sample(out.q.back(), *req.rng)
                                          : sample_keyed(out.q.back(), req.sampling->seed, req.pos0 + i);
        }
        out.tokens.push_back(tok);
        if (penalize) {
            penalties_.push(tok);
        }
        if (i + 1 < req.n_max) {
            model_->decode(&tok, 1, false);
        }
    }
}

bool NgramDrafter::sync(const std::vector<llama_token> & history, llama_token id_last) {
    // the index follows history + id_last; a diverging history (a new prompt) is re-indexed from the fork
    const auto & have = index_.tokens();
    const size_t size_before = have.size();
    size_t n = 0;
    const size_t n_max = std::min(have.size(), history.size() + 1);
    while (n < n_max && have[n] == (n < history.size() ? history[n] : id_last)) {
        ++n;
    }
    index_.truncate(n);
    for (size_t i = n; i < history.size(); ++i) {
        index_.push(history[i]);
    }
    if (n <= history.size()) {
        index_.push(id_last);
    }
    return n != size_before || index_.tokens().size() != size_before;
}

NgramMatch NgramDrafter::find(int n_draft, std::vector<llama_token> & out) {
    match_ = index_.lookup(n_draft, out);
    if (memory_ != nullptr && !memory_->empty()) {
        const auto & text = index_.tokens();
        NgramMatch m = memory_->index().lookup(text.data(), text.size(), n_draft, memory_seq_);
        if (m.length > match_.length && (!m.ambiguous || memory_->ambiguous_drafts())) {
            m.memory = true;
            match_ = m;
            out.swap(memory_seq_);
        }
    }
    match_valid_ = true;
    return match_;
}

NgramMatch NgramDrafter::ngram_match(const std::vector<llama_token> & history, llama_token id_last) {
    sync(history, id_last);
    return find(1, seq_);
}

void NgramDrafter::ngram_continuation(int n, std::vector<llama_token> & out) const {
    out.clear();
    if (match_valid_ && match_.length > 0) {
        (match_.memory ? memory_->index() : index_).continuation(match_.source, n, out);
    }
}

void NgramDrafter::propose(const DraftRequest & req, Draft & out) {
    out.q.clear();
    out.from_ngram = true;
    out.n_catchup = 0;
    if (sync(*req.history, req.id_last) || !match_valid_) {
        find(req.n_max, out.tokens);
    } else if (match_.length > 0) { // the step's ngram_match() already searched the occurrences
        (match_.memory ? memory_->index() : index_).continuation(match_.source, req.n_max, out.tokens);
    } else {
        out.tokens.clear();
    }
    out.from_memory = match_.memory && !out.tokens.empty();
}

void HybridDrafter::propose(const DraftRequest & req, Draft & out) {
    if (req.use_ngram) {
        ngram_.propose(req, out);
        if (!out.tokens.empty()) {
            return;
        }
    }
    model_.propose(req, out);
}

} // namespace specllm
