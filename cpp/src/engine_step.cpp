// The speculative step (Engine::step), in its stages:
//   1. look    what the drafting sources offer now (n-gram match, its sentence boundary, the draft model's lag)
//      choose  the policy's k, source and probe (auto_policy.cpp; fixed and heuristic policies in policy.cpp)
//   2. draft   the chosen source proposes k tokens (drafter.cpp), or the text a grammar forces
//   3. verify  the target decodes [id_last, d1..dk] (in chunks when asked) and the verifier accepts a prefix
//              (verifier.cpp), reading the rows under penalties and the grammar's mask
//   4. cut     the rejected tail leaves the target's KV cache
//   5. learn   the policy learns the step's acceptance and costs, and the undrafted n-gram proposal's first token
//   6. commit  the accepted drafts and the target's token enter the history, up to a stop
#include "specllm/engine.h"

#include "specllm/boundary.h"
#include "specllm/clock.h"
#include "specllm/penalties.h"

#include <algorithm>

namespace specllm {

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

    // 1. look and choose
    const StepContext sctx = look(n_past, budget);
    const Choice choice = drafter_ && sctx.k_max > 0 ? policy().choose(sctx) : Choice();

    // 2. draft. The repetition penalties over the context, once a step: the draft model drafts under them, the
    // verify rows are read under them
    const double t0 = now_ms();
    PenaltyWindow penalty_window;
    const bool penalize = PenaltyWindow::active(gen_.sampling);
    if (penalize) {
        penalty_window.reset(gen_.sampling, history_.data(), history_.size());
        penalty_window.push(id_last_);
    }
    const PenaltyWindow * penalties = penalize ? &penalty_window : nullptr;
    const Choice forced = draft(sctx, choice, penalties);
    const double draft_ms = now_ms() - t0;

    // 3. verify; a forced draft goes in one batch (forced_choice)
    const Verified vd = verify(n_past, forced.k > 0 ? 0 : choice.first_rows, penalties);

    // 4. cut the rejected tail: keep id_last and the accepted drafts
    target_->truncate(n_past + 1 + vd.verdict.n_accepted);

    // 5. learn, and count
    StepOutcome outcome;
    outcome.n_drafted = (int) draft_.tokens.size();
    outcome.n_accepted = vd.verdict.n_accepted;
    outcome.from_ngram = draft_.from_ngram;
    outcome.n_catchup = draft_.n_catchup;
    outcome.draft_ms = draft_ms;
    outcome.verify_ms = vd.verify_ms;
    outcome.n_verified = vd.n_decoded;
    learn(sctx, outcome, forced.k > 0, vd.verdict.next);
    count(outcome, vd.n_pad);
    out.n_drafted = outcome.n_drafted;
    out.n_accepted = outcome.n_accepted;

    // 6. commit
    commit(vd, out);
    const double step_ms = now_ms() - t_step;
    stats_.generate_ms += step_ms;
    stats_.n_plain_steps += out.n_drafted == 0 ? 1 : 0;
    stats_.plain_steps_ms += out.n_drafted == 0 ? step_ms : 0.0;
    return out;
}

StepContext Engine::look(int n_past, int budget) {
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
    return sctx;
}

Choice Engine::draft(const StepContext & sctx, const Choice & choice, const PenaltyWindow * penalties) {
    draft_.tokens.clear();
    draft_.q.clear();
    draft_.from_ngram = false;
    draft_.from_memory = false;
    draft_.n_catchup = 0;
    if (choice.k > 0) {
        DraftRequest req;
        req.history = &history_;
        req.id_last = id_last_;
        req.n_max = choice.k;
        req.sampling = &gen_.sampling;
        req.p_min = gen_.draft_p_min;
        req.rng = &rng_;
        req.pos0 = sctx.n_past + 1;
        req.use_ngram = choice.ngram;
        req.penalties = penalties;
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
    return forced;
}

Engine::Verified Engine::verify(int n_past, int first_rows, const PenaltyWindow * penalties) {
    // verify [id_last, d1..dk] with logits for every row and accept. The rows go to the target in chunks, each
    // decoded only when the verifier reaches it (every draft before it accepted): exact mode's chunks of
    // verify_rows (small chunks keep llama.cpp on the kernels whose rows equal single-token decoding); in fast mode
    // one batch, or the first rows the policy chose (first_rows: a 1-row probe costs one plain step and saves the
    // batch when draft 1 is wrong) and then the rest. A fast-mode chunk is padded with filler rows (no logits) to
    // the size the profile found cheapest (T(16) < T(13) on some CPUs); the filler leaves the KV cache right after
    // its decode
    Verified vd;
    const double t0 = now_ms();
    batch_.assign(1, id_last_);
    batch_.insert(batch_.end(), draft_.tokens.begin(), draft_.tokens.end());
    const int n_rows = (int) batch_.size();
    Model & tgt = *target_;
    const bool fast = opts_.verify_rows == 0;
    const int first = fast && first_rows > 0 && first_rows < n_rows ? first_rows : 0;
    int chunk_start = 0;
    const LogitsRow row = [&](int i) {
        while (i >= vd.n_decoded) {
            const int n = !fast ? std::min(opts_.verify_rows, n_rows - vd.n_decoded)
                                : vd.n_decoded == 0 && first > 0 ? first : n_rows - vd.n_decoded;
            const int m = fast && n_rows > 1 ? auto_.padded_rows(n) : n;
            const int pad = m > n && tgt.n_past() + m <= tgt.n_ctx() && m <= tgt.n_batch() ? m - n : 0;
            const llama_token * rows = batch_.data() + vd.n_decoded;
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
            vd.verify_ms += now_ms() - t;
            vd.n_pad += pad;
            chunk_start = vd.n_decoded;
            vd.n_decoded += n;
        }
        return tgt.logits(i - chunk_start); // the verifiers read rows in order, so i is in the last chunk
    };
    const int n_vocab = target_->n_vocab();
    const LogitsRow target_row = gen_.logprobs < 0 ? row : logprobs_.wrap(row, draft_.tokens, n_vocab, gen_.logprobs);
    std::unique_ptr<PenalizedRows> penalized; // logprobs stay the target's own, before penalties and grammar
    if (penalties) {
        penalized = std::make_unique<PenalizedRows>(*penalties, draft_.tokens, target_row, n_vocab);
    }
    const LogitsRow raw = penalized ? LogitsRow([&](int i) { return penalized->read(i); }) : target_row;
    const bool greedy = gen_.sampling.temperature <= 0.0f;
    std::unique_ptr<ConstrainedRows> constrained;
    if (grammar_) {
        constrained = std::make_unique<ConstrainedRows>(*grammar_, draft_.tokens, raw, n_vocab, gen_.sampling,
                                                        n_past + 1, grammar_full_mask_);
    }
    const LogitsRow read = constrained ? LogitsRow([&](int i) { return constrained->read(i); }) : raw;
    vd.verdict = greedy ? verify_greedy(draft_.tokens, read, n_vocab)
                        : verifier_.verify(draft_.tokens, draft_.q, read, n_vocab, gen_.sampling, rng_, n_past + 1,
                                           constrained ? LogitsRow([&](int i) { return constrained->allowed(i); })
                                                       : LogitsRow());
    const Verdict & v = vd.verdict;
    if (constrained) {
        constrained->advance(v.n_accepted, v.next, target_->is_eog(v.next));
        mask_cost_.observe(*constrained);
        auto_.set_row_read_cost(grammar_->constrains() ? mask_cost_.per_row_read(gen_.sampling) : 0.0);
    }
    if (gen_.logprobs >= 0) {
        vd.logprobs = logprobs_.emitted(draft_.tokens, v.n_accepted, v.next);
    }
    stats_.sample_ms += now_ms() - t0 - vd.verify_ms;
    return vd;
}

void Engine::learn(const StepContext & sctx, const StepOutcome & outcome, bool forced, llama_token next) {
    if (forced) { // the policy's sources drafted nothing: it learns the batch's cost alone
        auto_.observe_forced(outcome.n_drafted, outcome.n_accepted);
        StepOutcome cost_only = outcome;
        cost_only.n_drafted = cost_only.n_accepted = 0;
        policy().update(cost_only);
        stats_.n_grammar_steps += 1;
        return;
    }
    if (!drafter_) {
        return;
    }
    policy().update(outcome);
    // a free check of the n-gram proposal that was not drafted: its first token against the first token emitted,
    // on a plain step and on one the draft model drafted (its accepted first draft, else the correction; either
    // way the target's token). So a source the model outbids still learns, as the memory must across requests
    if (gen_.policy == PolicyKind::automatic && sctx.ngram_match > 0 &&
        (outcome.n_drafted == 0 || !draft_.from_ngram)) {
        const llama_token first = outcome.n_drafted > 0 && outcome.n_accepted > 0 ? draft_.tokens[0] : next;
        auto_.observe_shadow(sctx.ngram_match, sctx.ngram_doubtful, drafter_->ngram_peek() == first,
                             sctx.ngram_memory, sctx.ngram_boundary == 0);
    }
}

void Engine::count(const StepOutcome & outcome, int n_pad) {
    stats_.n_steps += 1;
    stats_.n_drafted += outcome.n_drafted;
    stats_.n_accepted += outcome.n_accepted;
    stats_.n_ngram_steps += draft_.from_ngram && outcome.n_drafted > 0 ? 1 : 0;
    stats_.n_memory_steps += draft_.from_memory && outcome.n_drafted > 0 ? 1 : 0;
    stats_.draft_ms += outcome.draft_ms;
    stats_.verify_ms += outcome.verify_ms;
    stats_.n_verify_rows += outcome.n_verified;
    stats_.n_pad_rows += n_pad;
    stats_.k_hist[(size_t) outcome.n_drafted] += 1;
    for (int j = 0; j < outcome.n_drafted; ++j) {
        stats_.n_drafted_at[(size_t) j] += 1;
        stats_.n_accepted_at[(size_t) j] += j < outcome.n_accepted ? 1 : 0;
    }
}

void Engine::commit(const Verified & vd, StepResult & out) {
    // id_last enters the history, then the accepted drafts and the target's token, until a stop
    history_.push_back(id_last_);
    std::vector<llama_token> emitted(draft_.tokens.begin(), draft_.tokens.begin() + vd.verdict.n_accepted);
    emitted.push_back(vd.verdict.next);
    for (size_t i = 0; i < emitted.size(); ++i) {
        const llama_token tok = emitted[i];
        const bool last = i + 1 == emitted.size();
        if (!gen_.ignore_eos && target_->is_eog(tok)) {
            history_.push_back(tok); // kept in the cache so that a chat template's next turn can reuse it
            finish("stop", out);
            break;
        }
        out.tokens.push_back(tok);
        if (!vd.logprobs.empty()) {
            out.logprobs.push_back(vd.logprobs[i]);
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
}

} // namespace specllm
