// Engine's memories across generations: the drafting memory, the outputs of earlier generations kept for n-gram
// drafts (remember), and its accessors (save / load / clear / size); the prompt cache's size; a copy of what the
// "auto" policy learned across generations (policy_state).
#include "specllm/engine.h"

#include "specllm/errors.h"

#include <memory>
#include <string>

namespace specllm {

void Engine::remember() {
    if (history_.size() > (size_t) stats_.n_prompt) {
        memory_.add(history_.data() + stats_.n_prompt, history_.size() - (size_t) stats_.n_prompt);
    }
}

std::vector<llama_token> Engine::memory() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return memory_.tokens();
}

void Engine::set_memory(const std::vector<llama_token> & tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_) {
        throw InvalidArgument("the drafting memory cannot change during a generation: finish or close it first");
    }
    const int n_vocab = target_->n_vocab();
    for (llama_token t : tokens) {
        if (t >= n_vocab || t < NgramIndex::separator) {
            throw InvalidArgument("a drafting memory holds token ids below the vocabulary size " +
                                  std::to_string(n_vocab) + " (and -1 between outputs), got " + std::to_string(t) +
                                  ": was it saved by an LLM with another model?");
        }
    }
    memory_.assign(tokens);
    auto_.forget_memory();
}

void Engine::clear_memory() {
    std::lock_guard<std::mutex> lock(mutex_);
    memory_.clear();
    auto_.forget_memory();
}

void Engine::set_memory_tokens(int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n < 0) {
        throw InvalidArgument("memory_tokens must be >= 0 (0 = no drafting memory), got " + std::to_string(n));
    }
    opts_.memory_tokens = n;
    memory_.set_max_tokens((size_t) n);
}

void Engine::set_memory_ambiguous_drafts(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    memory_.set_ambiguous_drafts(on);
}

void Engine::set_sentence_boundaries(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    opts_.sentence_boundaries = on;
}

void Engine::set_prompt_cache_bytes(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    prompt_cache_.set_capacity(bytes);
}

size_t Engine::prompt_cache_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prompt_cache_.capacity();
}

size_t Engine::prompt_cache_used() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prompt_cache_.bytes();
}

void Engine::set_prompt_store(const std::string & dir, size_t max_bytes, uint64_t identity) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_) {
        throw InvalidArgument("the prompt store cannot change during a generation: finish or close it first");
    }
    prompt_cache_.set_store(nullptr); // the old one's writes finish first
    if (!dir.empty()) {
        prompt_cache_.set_store(std::make_unique<PromptStore>(dir, max_bytes, identity));
    }
}

std::string Engine::prompt_store_dir() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prompt_cache_.store() ? prompt_cache_.store()->dir() : std::string();
}

void Engine::flush_prompt_store() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (prompt_cache_.store()) {
        prompt_cache_.store()->flush();
    }
}

int Engine::prompt_store_entries() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prompt_cache_.store() ? prompt_cache_.store()->n_entries() : 0;
}

size_t Engine::prompt_store_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prompt_cache_.store() ? prompt_cache_.store()->bytes() : 0;
}

int Engine::prompt_cache_entries() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prompt_cache_.n_entries();
}

AutoPolicy Engine::policy_state() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return auto_;
}

std::pair<double, int> Engine::step_level() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {auto_.step_level(), auto_.step_level_observations()};
}

std::pair<double, int> Engine::batch_shape() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {auto_.batch_shape(), auto_.batch_shape_observations()};
}

void Engine::set_policy_state(const AutoPolicy & state) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_) {
        throw InvalidArgument("the policy's state cannot change during a generation: finish or close it first");
    }
    if (!state.same_costs(auto_)) {
        throw InvalidArgument("this policy state was taken with other verify costs or verify rows than this "
                              "engine's (another engine's, or from before set_verify_costs): take it again");
    }
    auto_ = state;
}

} // namespace specllm
