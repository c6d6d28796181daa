#include "specllm/prompt_cache.h"

#include "specllm/log.h"
#include "specllm/model.h"

#include <algorithm>
#include <string>

namespace specllm {

void PromptCache::set_capacity(size_t bytes) {
    capacity_ = bytes;
    evict_to(bytes);
}

void PromptCache::clear() {
    entries_.clear();
    bytes_ = 0;
}

void PromptCache::evict_to(size_t bytes) {
    while (bytes_ > bytes && !entries_.empty()) {
        bytes_ -= entries_.back().state.size();
        entries_.pop_back();
    }
}

void PromptCache::save(Model & model) {
    // a state whose tokens the live cache holds whole (the live one went on from it) is replaced by the live one
    const auto & live = model.cached();
    for (auto it = entries_.begin(); it != entries_.end();) {
        if (common_prefix(it->tokens, live) == it->tokens.size()) {
            bytes_ -= it->state.size();
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
    const size_t size = model.state_size();
    if (size == 0 || size > capacity_) {
        return; // larger than the whole cache: not kept
    }
    Entry e{live, model.state()};
    evict_to(capacity_ - e.state.size());
    bytes_ += e.state.size();
    entries_.push_front(std::move(e));
}

int PromptCache::prepare(Model & model, const std::vector<llama_token> & seq) {
    from_disk_ = false;
    if ((capacity_ == 0 && !store_) || !model.can_rollback()) {
        return 0;
    }
    const auto & live = model.cached();
    const size_t keep = common_prefix(live, seq);
    auto best = entries_.end();
    size_t best_n = keep;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        const size_t n = common_prefix(it->tokens, seq);
        if (n >= best_n + (size_t) min_tokens) {
            best = it;
            best_n = n;
        }
    }
    // a state on disk, if it shares more again (reading it costs more than copying one in RAM)
    Entry chosen;
    std::string file;
    if (store_ && store_->best(seq, chosen.tokens, file) >= best_n + (size_t) min_tokens &&
        chosen.tokens.size() <= (size_t) model.n_ctx()) {
        best_n = common_prefix(chosen.tokens, seq);
        best = entries_.end();
        from_disk_ = true;
    } else {
        if (!chosen.tokens.empty() && chosen.tokens.size() > (size_t) model.n_ctx()) {
            store_->set_aside(file); // an LLM with a larger context wrote it: restoring it here failed, after the
        }                            // live cache was cleared for it, at every prompt that shared it
        chosen.tokens.clear();
    }
    // taken out first: saving the live state below may evict the least recently used. Not put back: the live
    // cache holds it from now on, and is saved when a later prompt cuts it
    if (best != entries_.end()) {
        chosen = std::move(*best);
        bytes_ -= chosen.state.size();
        entries_.erase(best);
    }
    if (live.size() >= keep + (size_t) min_tokens) {
        save(model); // the prompt cuts much of the live cache away: kept for a later prompt
    }
    if (chosen.tokens.empty()) {
        return 0;
    }
    if (from_disk_ && !store_->read(file, chosen.tokens, chosen.state)) {
        from_disk_ = false;
        return 0; // logged by the store; the prompt is decoded
    }
    if (!model.set_state(chosen.state, chosen.tokens)) {
        log_note(2, "a saved prompt state of " + std::to_string(chosen.tokens.size()) +
                        " tokens could not be restored; the prompt is decoded instead");
        if (from_disk_) {
            store_->set_aside(file); // not tried again at every prompt that shares it
        }
        from_disk_ = false;
        return 0;
    }
    return (int) best_n;
}

void PromptCache::persist(Model & model) {
    if (!store_ || !model.can_rollback() || model.cached().size() < (size_t) min_tokens ||
        store_->covers(model.cached(), (size_t) min_tokens)) {
        return;
    }
    store_->write(model.cached(), model.state());
}

} // namespace specllm
