// The engine's life around its steps: the drafter it is built with (or given by set_drafter), start (checks the
// options, prefills the prompt reusing a cached prefix), finish, cancel and reset. The step itself:
// engine_step.cpp; the cost measurements: engine_profile.cpp; the memories across generations: engine_memory.cpp.
#include "specllm/engine.h"

#include "specllm/clock.h"
#include "specllm/errors.h"
#include "specllm/log.h"

#include <algorithm>

namespace specllm {

namespace {

// the drafter of `kind` (nullptr for none) and, through draft_model, its draft model (nullptr without one)
std::unique_ptr<Drafter> make_drafter(DraftKind kind, const ModelOptions & draft, const NgramOptions & ngram,
                                      const Model & target, const NgramMemory * memory, Model *& draft_model) {
    draft_model = nullptr;
    if (kind != DraftKind::none && !target.can_rollback()) {
        // a rejected draft must be cut from the target's memory, which a recurrent state cannot do: decode plainly
        log_note(3, "drafting is off: '" + target.options().path + "' (" + target.description() + ") keeps a "
                    "recurrent state that llama.cpp cannot cut back after a rejected draft, so it decodes plainly "
                    "(a new prompt that differs from the cached one is evaluated again from its start)");
        return nullptr;
    }
    if (kind == DraftKind::ngram) {
        return std::make_unique<NgramDrafter>(ngram, memory);
    }
    if (kind != DraftKind::model && kind != DraftKind::hybrid) {
        return nullptr;
    }
    ModelOptions dopts = draft;
    dopts.n_ctx = target.n_ctx();
    auto dm = std::make_unique<Model>(dopts);
    if (!dm->can_rollback()) {
        throw IncompatibleDraftError("the draft model '" + dopts.path + "' (" + dm->description() + ") keeps a "
                                     "recurrent state that llama.cpp cannot cut back after a rejected draft; use a "
                                     "transformer draft model of the same family, or draft=\"ngram\"");
    }
    check_same_vocab(target, *dm);
    draft_model = dm.get();
    if (kind == DraftKind::model) {
        return std::make_unique<ModelDrafter>(std::move(dm), target.n_vocab());
    }
    return std::make_unique<HybridDrafter>(std::move(dm), target.n_vocab(), ngram, memory);
}

} // namespace

Engine::Engine(const EngineOptions & opts) : opts_(opts), memory_(opts.ngram.n_min, opts.ngram.n_max) {
    if (opts.verify_rows < 0) {
        throw InvalidArgument("verify_rows must be >= 0 (0 = every verify batch in one decode), got " +
                              std::to_string(opts.verify_rows));
    }
    if (opts.memory_tokens < 0) {
        throw InvalidArgument("memory_tokens must be >= 0 (0 = no drafting memory), got " +
                              std::to_string(opts.memory_tokens));
    }
    memory_.set_max_tokens((size_t) opts.memory_tokens);
    auto_.set_verify_rows(opts.verify_rows);
    target_ = std::make_unique<Model>(opts.target);
    drafter_ = make_drafter(opts.draft_kind, opts.draft, opts.ngram, *target_, &memory_, draft_model_);
    if (!drafter_) {
        opts_.draft_kind = DraftKind::none; // asked for, but the target cannot roll back
    }
}

void Engine::set_drafter(DraftKind kind, const ModelOptions & draft, const NgramOptions & ngram) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_) {
        throw InvalidArgument("the drafter cannot change during a generation: finish or close it first");
    }
    Model * draft_model = nullptr;
    NgramMemory memory(ngram.n_min, ngram.n_max); // the memory, indexed with the new n-gram sizes
    memory.set_max_tokens(memory_.max_tokens());
    memory.set_ambiguous_drafts(memory_.ambiguous_drafts());
    memory.assign(memory_.tokens());
    auto drafter = make_drafter(kind, draft, ngram, *target_, &memory_, draft_model); // throws: the old one stays
    memory_ = std::move(memory);
    drafter_ = std::move(drafter);
    draft_model_ = draft_model;
    opts_.draft_kind = drafter_ ? kind : DraftKind::none;
    opts_.draft = draft;
    opts_.ngram = ngram;
    auto_.forget_draft_model();
}

Model * Engine::draft_model() {
    return draft_model_;
}

DraftPolicy & Engine::policy() {
    return gen_.policy == PolicyKind::automatic ? static_cast<DraftPolicy &>(auto_) : *fixed_;
}

void Engine::start(const std::vector<llama_token> & prompt, const GenerateOptions & opts,
                   const std::function<void()> & poll) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (opts.max_tokens < 0) {
        throw InvalidArgument("max_tokens must be >= 0 (0: process the prompt only), got " +
                              std::to_string(opts.max_tokens));
    }
    if (opts.draft_length < 0 || opts.draft_length > AutoPolicy::n_max) {
        throw InvalidArgument("draft_length must be between 0 and " + std::to_string(AutoPolicy::n_max) + ", got " +
                              std::to_string(opts.draft_length));
    }
    if (!(opts.draft_p_min >= 0.0f && opts.draft_p_min <= 1.0f)) {
        throw InvalidArgument("draft_p_min must be in [0, 1]");
    }
    check_sampling_options(opts.sampling);
    for (const auto & [id, bias] : opts.sampling.logit_bias) {
        if (id < 0 || id >= target_->n_vocab()) {
            throw InvalidArgument("logit_bias: token id " + std::to_string(id) + " is not in the model's vocabulary "
                                  "(0.." + std::to_string(target_->n_vocab() - 1) + ")");
        }
    }
    if (opts.logprobs < -1 || opts.logprobs > max_top_logprobs) {
        throw InvalidArgument("logprobs must be -1 (none) or the number of most likely tokens to list, 0.." +
                              std::to_string(max_top_logprobs) + ", got " + std::to_string(opts.logprobs));
    }
    if (opts.prompt_logprobs < -1 || opts.prompt_logprobs > max_top_logprobs) {
        throw InvalidArgument("prompt_logprobs must be -1 (none) or the number of most likely tokens to list, 0.." +
                              std::to_string(max_top_logprobs) + ", got " + std::to_string(opts.prompt_logprobs));
    }
    if (prompt.empty()) {
        throw InvalidArgument("the prompt is empty (no tokens); pass some text");
    }
    std::unique_ptr<Grammar> grammar = make_grammar(target_->vocab(), opts);
    const int n_ctx = target_->n_ctx();
    if ((long long) prompt.size() + opts.max_tokens > n_ctx) {
        throw ContextOverflowError("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                                   std::to_string(opts.max_tokens) + ") exceed the context window n_ctx=" +
                                   std::to_string(n_ctx) + "; lower max_tokens, shorten the prompt, or create the "
                                   "LLM with a larger n_ctx");
    }
    active_ = false; // until the prefill is done (it may be abandoned by poll)
    gen_ = opts;
    if (opts.policy == PolicyKind::fixed) {
        fixed_ = std::make_unique<FixedPolicy>(opts.draft_length);
    } else if (opts.policy == PolicyKind::heuristic) {
        fixed_ = std::make_unique<HeuristicPolicy>(std::min(4, std::max(1, opts.draft_length)),
                                                   std::max(1, opts.draft_length));
    } else {
        auto_.set_k_limit(opts.draft_length);
        auto_.new_generation();
    }
    grammar_ = std::move(grammar);
    grammar_text_.clear();
    auto_.set_row_read_cost(grammar_ && grammar_->constrains() ? mask_cost_.per_row_read(opts.sampling) : 0.0);
    rng_.seed(opts.sampling.seed);
    text_.reset(opts.stop);
    stats_ = Stats();
    stats_.seed = opts.sampling.seed;
    stats_.n_prompt = (int) prompt.size();
    stats_.k_hist.assign((size_t) AutoPolicy::n_max + 1, 0);
    stats_.n_drafted_at.assign((size_t) AutoPolicy::n_max, 0);
    stats_.n_accepted_at.assign((size_t) AutoPolicy::n_max, 0);

    // prefill: everything but the last prompt token, reusing the cached prefix. Between prompt batches: an
    // interrupt from another thread, then the caller's poll (Ctrl-C)
    const double t0 = now_ms();
    history_.assign(prompt.begin(), prompt.end() - 1);
    id_last_ = prompt.back();
    prompt_logprobs_.clear();
    const bool scored = opts.prompt_logprobs >= 0; // every row's logits: nothing cached can be reused
    int n_restored = 0;
    int n_keep = 0;
    if (scored) {
        prompt_cache_.set_aside(*target_); // a conversation's cache is not lost to a scoring call
        target_->clear();
    } else {
        n_restored = prompt_cache_.prepare(*target_, history_); // a saved state sharing more of it
        n_keep = target_->keep_shifted(history_, opts.cache_reuse, &stats_.n_shifted);
    }
    stats_.n_cached = n_keep;
    stats_.n_restored = n_restored > 0 ? n_keep : 0;
    stats_.restored_from_disk = n_restored > 0 && prompt_cache_.restored_from_disk();
    const std::function<void()> check = [&] {
        if (interrupt_.load()) {
            throw Cancelled("the generation was cancelled during prompt processing");
        }
        if (poll) {
            poll();
        }
    };
    if (scored) {
        prompt_logprobs_ = decode_scored(*target_, history_, id_last_, opts.prompt_logprobs, check);
    } else {
        target_->decode_polled(history_.data() + n_keep, (int) history_.size() - n_keep, check);
    }
    // the draft model is kept in step with the prompt (and then drafts or is explored) only if, with the costs
    // measured here and the acceptance estimated so far, it can beat plain decoding: otherwise this generation
    // drafts from n-grams alone and the model costs nothing, not even its prefill
    model_in_step_ = opts.max_tokens > 0 && drafter_ && drafter_->has_model() &&
                     (gen_.policy != PolicyKind::automatic || auto_.pays(0)); // pays: within the k limit
    if (model_in_step_) {
        check();
        drafter_->prefill(history_, check);
    } else if (drafter_ && drafter_->has_model() && gen_.policy == PolicyKind::automatic) {
        auto_.left_out_draft_model();
    }
    stats_.prefill_ms = now_ms() - t0;
    active_ = true;
}

void Engine::finish(const std::string & reason, StepResult & out) {
    // the KV cache must be a prefix of prompt + committed tokens
    target_->keep_common_prefix(history_);
    remember();
    prompt_cache_.persist(*target_);
    out.done = true;
    out.finish_reason = reason;
    out.text = text_.take_rest();
    active_ = false;
}

void Engine::cancel() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_) {
        target_->keep_common_prefix(history_);
        remember();
        prompt_cache_.persist(*target_);
        active_ = false;
    }
}

void Engine::reset(bool keep_memory) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!keep_memory) {
        memory_.clear();
        auto_.forget_memory();
    }
    prompt_cache_.clear();
    if (prompt_cache_.store()) {
        prompt_cache_.store()->remove_all();
    }
    target_->clear();
    if (draft_model_) {
        draft_model_->clear();
    }
    history_.clear();
    active_ = false;
}

} // namespace specllm
