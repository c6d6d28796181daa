#include "specllm/engine.h"

#include "specllm/boundary.h"

#include "specllm/errors.h"
#include "specllm/log.h"
#include "specllm/penalties.h"

#include <algorithm>
#include <chrono>

namespace specllm {

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

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

StepResult Engine::step() {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
        return step_locked();
    } catch (...) {
        // a decode or verify error in the middle of a step: the target's KV cache may hold rows past the committed
        // history; cut them and end the generation, so the engine is consistent whoever catches the error
        if (active_) {
            target_->keep_common_prefix(history_);
            active_ = false;
        }
        throw;
    }
}

StepResult Engine::step_locked() {
    StepResult out;
    if (!active_) {
        out.done = true;
        return out;
    }
    if (interrupt_.load()) {
        finish("cancelled", out);
        return out;
    }
    const double t_step = now_ms();
    const int n_past = target_->n_past();
    const int budget = gen_.max_tokens - stats_.n_generated; // >= 1 while active, but with max_tokens 0
    if (budget <= 0) {
        finish("length", out);
        return out;
    }

    // 1. draft
    StepContext sctx;
    sctx.k_max = std::max(0, std::min({gen_.draft_length, budget - 1, target_->n_ctx() - n_past - 1}));
    sctx.has_model = draft_model_ != nullptr && model_in_step_;
    sctx.has_ngram = opts_.draft_kind == DraftKind::ngram || opts_.draft_kind == DraftKind::hybrid;
    sctx.hybrid_min_match = opts_.ngram.hybrid_min_match;
    sctx.n_past = n_past;
    if (drafter_ && sctx.has_ngram && sctx.k_max > 0) {
        const NgramMatch m = drafter_->ngram_match(history_, id_last_);
        sctx.ngram_match = m.length;
        sctx.ngram_memory = m.memory;
        sctx.ngram_doubtful = !m.memory && (m.ambiguous || m.source >= (size_t) stats_.n_prompt);
        if (m.length > 0 && opts_.sentence_boundaries && gen_.policy == PolicyKind::automatic) { // only "auto" reads it
            drafter_->ngram_continuation(sctx.k_max, peek_); // the boundary stops at its first end of turn
            sctx.ngram_boundary = sentence_boundary(*target_, id_last_, peek_.data(), (int) peek_.size());
        }
    }
    if (sctx.has_model && sctx.k_max > 0 && gen_.policy == PolicyKind::automatic) { // only "auto" costs the lag
        const auto & cached = draft_model_->cached();
        const size_t n = std::min(cached.size(), history_.size());
        const size_t same = (size_t) (std::mismatch(cached.begin(), cached.begin() + (long) n, history_.begin()).first -
                                      cached.begin());
        sctx.model_lag = (int) (history_.size() + 1 - same);
    }
    const Choice choice = drafter_ && sctx.k_max > 0 ? policy().choose(sctx) : Choice();
    draft_.tokens.clear();
    draft_.q.clear();
    draft_.from_ngram = false;
    draft_.from_memory = false;
    draft_.n_catchup = 0;
    double t0 = now_ms();
    // the repetition penalties over the context, once a step: the draft model drafts under them, the verify rows
    // are read under them
    PenaltyWindow penalty_window;
    const bool penalize = PenaltyWindow::active(gen_.sampling);
    if (penalize) {
        penalty_window.reset(gen_.sampling, history_.data(), history_.size());
        penalty_window.push(id_last_);
    }
    if (choice.k > 0) {
        DraftRequest req;
        req.history = &history_;
        req.id_last = id_last_;
        req.n_max = choice.k;
        req.sampling = &gen_.sampling;
        req.p_min = gen_.draft_p_min;
        req.rng = &rng_;
        req.pos0 = n_past + 1;
        req.use_ngram = choice.ngram;
        req.penalties = penalize ? &penalty_window : nullptr;
        drafter_->propose(req, draft_);
        if (!gen_.ignore_eos && cut_after_end(*target_, draft_.tokens) < (int) draft_.q.size()) {
            draft_.q.resize(draft_.tokens.size());
        }
        if (grammar_) { // a token the grammar forbids is never accepted: not verified
            draft_.tokens.resize((size_t) grammar_->legal_prefix(draft_.tokens));
            draft_.q.resize(std::min(draft_.q.size(), draft_.tokens.size()));
        }
    }
    // nothing else drafted: the text the grammar forces next (a schema's keys and punctuation), if it pays
    Choice forced;
    if (grammar_ && grammar_drafts_ && drafter_ && draft_.tokens.empty() && sctx.k_max > 0 &&
        gen_.policy == PolicyKind::automatic) {
        std::vector<llama_token> tokens = forced_draft(*grammar_, *target_, grammar_text_, sctx.k_max);
        forced = auto_.forced_choice((int) grammar_->legal_prefix(tokens));
        if (forced.k > 0) {
            draft_.tokens.assign(tokens.begin(), tokens.begin() + forced.k);
            draft_.q.clear();
        }
    }
    const double draft_ms = now_ms() - t0;

    // 2+3. verify [id_last, d1..dk] with logits for every row and accept. With verify_rows set, the rows go to
    // the target in chunks of at most that many, each decoded only when the verifier reaches it (all drafts
    // before it accepted): small chunks keep llama.cpp on the kernels whose rows equal single-token decoding
    t0 = now_ms();
    batch_.assign(1, id_last_);
    batch_.insert(batch_.end(), draft_.tokens.begin(), draft_.tokens.end());
    const int n_rows = (int) batch_.size();
    // the rows go to the target in chunks, each decoded only when the verifier reaches it (every draft before it
    // accepted): exact mode's chunks of verify_rows; in fast mode one batch, or the first rows the policy chose
    // (first_rows: a 1-row probe costs one plain step and saves the batch when draft 1 is wrong) and then the
    // rest. A fast-mode chunk is padded with filler rows (no logits) to the size the profile found cheapest
    // (T(16) < T(13) on some CPUs); the filler leaves the KV cache right after its decode
    Model & tgt = *target_;
    const bool fast = opts_.verify_rows == 0;
    const int first_rows = forced.k > 0 ? 0 : choice.first_rows; // a forced draft: one batch (forced_choice)
    const int first = fast && first_rows > 0 && first_rows < n_rows ? first_rows : 0;
    int n_decoded = 0, chunk_start = 0, n_pad = 0;
    double verify_ms = 0.0;
    const LogitsRow row = [&](int i) {
        while (i >= n_decoded) {
            const int n = !fast ? std::min(opts_.verify_rows, n_rows - n_decoded)
                                : n_decoded == 0 && first > 0 ? first : n_rows - n_decoded;
            const int m = fast && n_rows > 1 ? auto_.padded_rows(n) : n;
            const int pad = m > n && tgt.n_past() + m <= tgt.n_ctx() && m <= tgt.n_batch() ? m - n : 0;
            const llama_token * rows = batch_.data() + n_decoded;
            if (pad > 0) {
                padded_.assign(rows, rows + n);
                padded_.resize((size_t) m, rows[n - 1]);
                rows = padded_.data();
            }
            const double t = now_ms();
            tgt.decode(rows, n + pad, true, pad);
            if (pad > 0) {
                tgt.truncate(tgt.n_past() - pad); // the logits of the decode stay readable
            }
            verify_ms += now_ms() - t;
            n_pad += pad;
            chunk_start = n_decoded;
            n_decoded += n;
        }
        return tgt.logits(i - chunk_start); // the verifiers read rows in order, so i is in the last chunk
    };
    const int n_vocab = target_->n_vocab();
    const LogitsRow target_row = gen_.logprobs < 0 ? row : logprobs_.wrap(row, draft_.tokens, n_vocab, gen_.logprobs);
    std::unique_ptr<PenalizedRows> penalized; // logprobs stay the target's own, before penalties and grammar
    if (penalize) {
        penalized = std::make_unique<PenalizedRows>(penalty_window, draft_.tokens, target_row, n_vocab);
    }
    const LogitsRow raw = penalized ? LogitsRow([&](int i) { return penalized->read(i); }) : target_row;
    const bool greedy = gen_.sampling.temperature <= 0.0f;
    std::unique_ptr<ConstrainedRows> constrained;
    if (grammar_) {
        constrained = std::make_unique<ConstrainedRows>(*grammar_, draft_.tokens, raw, n_vocab, gen_.sampling,
                                                        n_past + 1, grammar_full_mask_);
    }
    const LogitsRow read = constrained ? LogitsRow([&](int i) { return constrained->read(i); }) : raw;
    const Verdict v = greedy ? verify_greedy(draft_.tokens, read, n_vocab)
                             : verifier_.verify(draft_.tokens, draft_.q, read, n_vocab, gen_.sampling, rng_, n_past + 1);
    if (constrained) {
        constrained->advance(v.n_accepted, v.next, target_->is_eog(v.next));
        mask_cost_.observe(*constrained);
        auto_.set_row_read_cost(grammar_->constrains() ? mask_cost_.per_row_read(gen_.sampling) : 0.0);
    }
    const std::vector<TokenLogprob> emitted_lp =
        gen_.logprobs < 0 ? std::vector<TokenLogprob>() : logprobs_.emitted(draft_.tokens, v.n_accepted, v.next);
    stats_.sample_ms += now_ms() - t0 - verify_ms;

    // 4. cut the rejected tail: keep id_last and the accepted drafts
    target_->truncate(n_past + 1 + v.n_accepted);

    StepOutcome outcome;
    outcome.n_drafted = (int) draft_.tokens.size();
    outcome.n_accepted = v.n_accepted;
    outcome.from_ngram = draft_.from_ngram;
    outcome.n_catchup = draft_.n_catchup;
    outcome.draft_ms = draft_ms;
    outcome.verify_ms = verify_ms;
    outcome.n_verified = n_decoded;
    if (forced.k > 0) { // the policy's sources drafted nothing: it learns the batch's cost alone
        auto_.observe_forced(outcome.n_drafted, v.n_accepted);
        StepOutcome cost_only = outcome;
        cost_only.n_drafted = cost_only.n_accepted = 0;
        policy().update(cost_only);
        stats_.n_grammar_steps += 1;
    } else if (drafter_) {
        policy().update(outcome);
        // a free check of the n-gram proposal that was not drafted: its first token against the first token emitted,
        // on a plain step and on one the draft model drafted (its accepted first draft, else the correction; either
        // way the target's token). So a source the model outbids still learns, as the memory must across requests
        if (gen_.policy == PolicyKind::automatic && sctx.ngram_match > 0 &&
            (outcome.n_drafted == 0 || !draft_.from_ngram)) {
            const llama_token first = outcome.n_drafted > 0 && v.n_accepted > 0 ? draft_.tokens[0] : v.next;
            auto_.observe_shadow(sctx.ngram_match, sctx.ngram_doubtful, drafter_->ngram_peek() == first,
                                 sctx.ngram_memory, sctx.ngram_boundary == 0);
        }
    }
    stats_.n_steps += 1;
    stats_.n_drafted += outcome.n_drafted;
    stats_.n_accepted += v.n_accepted;
    stats_.n_ngram_steps += draft_.from_ngram && outcome.n_drafted > 0 ? 1 : 0;
    stats_.n_memory_steps += draft_.from_memory && outcome.n_drafted > 0 ? 1 : 0;
    stats_.draft_ms += draft_ms;
    stats_.verify_ms += verify_ms;
    stats_.n_verify_rows += n_decoded;
    stats_.n_pad_rows += n_pad;
    stats_.k_hist[(size_t) outcome.n_drafted] += 1;
    for (int j = 0; j < outcome.n_drafted; ++j) {
        stats_.n_drafted_at[(size_t) j] += 1;
        stats_.n_accepted_at[(size_t) j] += j < v.n_accepted ? 1 : 0;
    }
    out.n_drafted = outcome.n_drafted;
    out.n_accepted = v.n_accepted;

    // 5. commit: id_last enters the history, then the accepted drafts and the target's token, until a stop
    history_.push_back(id_last_);
    std::vector<llama_token> emitted(draft_.tokens.begin(), draft_.tokens.begin() + v.n_accepted);
    emitted.push_back(v.next);
    for (size_t i = 0; i < emitted.size(); ++i) {
        const llama_token tok = emitted[i];
        const bool last = i + 1 == emitted.size();
        if (!gen_.ignore_eos && target_->is_eog(tok)) {
            history_.push_back(tok); // kept in the cache so that a chat template's next turn can reuse it
            finish("stop", out);
            break;
        }
        out.tokens.push_back(tok);
        if (!emitted_lp.empty()) {
            out.logprobs.push_back(emitted_lp[i]);
        }
        stats_.n_generated += 1;
        const std::string piece = target_->piece(tok);
        if (grammar_) {
            grammar_text_ += piece; // what forced drafts' whitespace follows
        }
        const bool stopped = text_.push(piece);
        if (stopped) {
            history_.push_back(tok);
            finish("stop", out);
            break;
        }
        if (stats_.n_generated >= gen_.max_tokens) {
            history_.push_back(tok);
            finish("length", out);
            break;
        }
        if (last) {
            id_last_ = tok;
        } else {
            history_.push_back(tok);
        }
    }
    if (active_) {
        out.text = text_.take_ready();
    }
    const double step_ms = now_ms() - t_step;
    stats_.generate_ms += step_ms;
    stats_.n_plain_steps += out.n_drafted == 0 ? 1 : 0;
    stats_.plain_steps_ms += out.n_drafted == 0 ? step_ms : 0.0;
    return out;
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
