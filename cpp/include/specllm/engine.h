// The engine: prefill (reusing the cached KV prefix), then one speculative step at a time:
// draft k tokens, verify [id_last, d1..dk] in one batch, commit the accepted prefix plus the target's token,
// cut the rejected tail from the KV caches. Stop conditions and statistics live here too.
#pragma once

#include "specllm/auto_policy.h"
#include "specllm/drafter.h"
#include "specllm/grammar.h"
#include "specllm/logprobs.h"
#include "specllm/model.h"
#include "specllm/options.h"
#include "specllm/prompt_cache.h"
#include "specllm/text.h"
#include "specllm/verifier.h"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace specllm {

struct EngineOptions {
    ModelOptions target;                // the model whose output is produced
    ModelOptions draft;                 // the draft model (draft_kind model or hybrid)
    DraftKind draft_kind = DraftKind::none;
    NgramOptions ngram;                 // n-gram drafter settings (draft_kind ngram or hybrid)
    int verify_rows = 0;                // most rows per verify decode, 0 = all in one; exact mode on a CPU uses
                                        // exact_verify_rows
    int memory_tokens = 0;              // the drafting memory: earlier generations' outputs the n-gram drafter
                                        // looks up (at most this many tokens, oldest dropped first); 0 = off
    bool sentence_boundaries = true;    // tell "auto" where an n-gram proposal crosses the end of a sentence
                                        // (boundary.h); false: as before 2026-11-25 (bench's hybrid-noboundary)
};

// llama.cpp's CPU backend (ggml-cpu of llama-cpp-python 0.3.36) sends the rows of a batch through other kernels
// than a single-token step's once there are enough of them: repacked weights (Q4_K/Q4_0/IQ4_NL on AVX2 and NEON)
// go to a GEMM in groups of 4 rows, other K-quant matmuls to tiled kernels from 8 rows, and those rows round
// differently (measured: up to 0.65 in a logit). A verify batch of at most 3 rows takes the single-row kernels
// everywhere, so exact mode keeps the repacked weights (plain decoding's speed) and greedy speculative output
// equals plain decoding's.
constexpr int exact_verify_rows = 3;

struct Stats {
    int n_prompt = 0;        // prompt tokens
    int n_cached = 0;        // of them reused from the KV cache of an earlier call
    int n_restored = 0;      // of those, from a state the prompt cache had saved (0: the live cache, or none)
    int n_shifted = 0;       // of those, moved from later in the cache (GenerateOptions::cache_reuse)
    bool restored_from_disk = false; // that state was read from the prompt store's directory
    int n_generated = 0;     // tokens generated
    int n_steps = 0;         // target verify calls (one per step)
    int n_drafted = 0;       // draft tokens proposed
    int n_accepted = 0;      // draft tokens accepted
    int n_ngram_steps = 0;   // steps drafted by the n-gram drafter
    int n_memory_steps = 0;  // of them, drafted from the memory of earlier generations
    int n_grammar_steps = 0; // steps that drafted the text a grammar forces (grammar_draft.cpp)
    int n_verify_rows = 0;   // rows the target decoded to verify (chunks after a rejection are skipped)
    int n_pad_rows = 0;      // filler rows decoded beside them (a batch padded to a cheaper size)
    double prefill_ms = 0.0; // prompt processing (target and draft)
    double draft_ms = 0.0;   // drafting
    double verify_ms = 0.0;  // target batched decode
    double sample_ms = 0.0;  // verification arithmetic (argmax / rejection sampling)
    double generate_ms = 0.0; // wall time of all steps
    int n_plain_steps = 0;   // steps that drafted nothing (a plain decoding step, timed in this generation) ...
    double plain_steps_ms = 0.0; // ... and their wall time: what plain decoding costs per token now, for comparison
    uint64_t seed = 0;       // the seed used for sampling
    std::vector<int> k_hist;        // k_hist[k]: steps that drafted k tokens
    std::vector<int> n_drafted_at;  // per draft position: times drafted
    std::vector<int> n_accepted_at; // per draft position: times accepted
};

struct StepResult {
    std::string text;                 // newly released text (complete UTF-8, stop strings cut)
    std::vector<llama_token> tokens;  // newly committed tokens
    std::vector<TokenLogprob> logprobs; // one per token of `tokens` when GenerateOptions::logprobs >= 0
    bool done = false;
    std::string finish_reason;        // "stop", "length" or "cancelled" (interrupt()) when done
    int n_drafted = 0;
    int n_accepted = 0;
};

class Engine {
  public:
    explicit Engine(const EngineOptions & opts);

    Model & target() { return *target_; }
    Model * draft_model();             // nullptr without a draft model
    DraftKind draft_kind() const { return opts_.draft_kind; }
    AutoPolicy & auto_policy() { return auto_; }

    // prefill the prompt and get ready to step. `poll` runs between the prompt's decode batches and may throw
    // to abandon a long prefill (the Python bindings run the interpreter's signal handlers there, so Ctrl-C
    // interrupts it); the part already decoded stays cached and the next start reuses it
    void start(const std::vector<llama_token> & prompt, const GenerateOptions & opts,
               const std::function<void()> & poll = {});
    StepResult step(); // on an error (DecodeError, ...) the generation ends with the KV cache cut to the history
    bool active() const { return active_; }
    // from any thread, without waiting: a prefill in progress throws Cancelled before its next prompt batch
    // (target or draft), and the next step() ends the generation with finish_reason "cancelled". The request
    // stays until clear_interrupt()
    void interrupt() { interrupt_.store(true); }
    void clear_interrupt() { interrupt_.store(false); }
    bool interrupted() const { return interrupt_.load(); }
    // another drafter (kind none, ngram, model or hybrid; draft: the draft model's options for model and
    // hybrid), keeping the target and its KV cache. The new one is loaded before the old one is freed: if it
    // cannot be (a typed error), the old one stays. Not during a generation
    void set_drafter(DraftKind kind, const ModelOptions & draft, const NgramOptions & ngram);
    void cancel();              // end the generation now (the KV cache stays consistent)
    // forget every cached prefix and, unless keep_memory, the drafting memory with what "auto" learned of it
    void reset(bool keep_memory = false);
    // the drafting memory: earlier outputs, separated by -1 (what a saved memory holds); set_memory replaces it.
    // Replacing or clearing it sends the memory's acceptance estimates back to their priors (AutoPolicy::forget_memory)
    std::vector<llama_token> memory() const;
    void set_memory(const std::vector<llama_token> & tokens);
    void clear_memory();
    void set_memory_tokens(int n); // its size in tokens (0 = off; a smaller size drops the oldest outputs)
    int memory_tokens() const { return opts_.memory_tokens; }
    void set_memory_ambiguous_drafts(bool on); // NgramMemory::set_ambiguous_drafts (default: off)
    bool memory_ambiguous_drafts() const { return memory_.ambiguous_drafts(); }
    // a copy of what "auto" has learned so far (acceptance estimates, costs, level); set_policy_state puts one back,
    // so that a prompt run again (a benchmark's rounds) starts where its first run started. Not during a generation;
    // a state with other verify costs or verify rows than this engine's (another engine's, or from before
    // set_verify_costs) is refused
    AutoPolicy policy_state() const;
    void set_policy_state(const AutoPolicy & state);
    // "auto"'s level (plain steps' measured / profiled cost) and how many steps taught it, without copying the state
    std::pair<double, int> step_level() const;
    std::pair<double, int> batch_shape() const; // AutoPolicy::batch_shape and its observations
    // saved KV states of earlier prompts (prompt_cache.h): at most `bytes` (0 = off; reset() empties it)
    void set_prompt_cache_bytes(size_t bytes);
    size_t prompt_cache_bytes() const;
    size_t prompt_cache_used() const;   // bytes held now
    int prompt_cache_entries() const;
    // prompt states on disk across processes (prompt_store.h): dir "" = none. identity: prompt_store_identity's.
    // Written after each generation by a thread of the store's; reset() removes this model's
    void set_prompt_store(const std::string & dir, size_t max_bytes, uint64_t identity);
    std::string prompt_store_dir() const;
    void flush_prompt_store();          // wait for the states queued to be written
    int prompt_store_entries() const;
    size_t prompt_store_bytes() const;
    void set_sentence_boundaries(bool on);
    bool sentence_boundaries() const { return opts_.sentence_boundaries; }
    const Stats & stats() const { return stats_; }
    // GenerateOptions::prompt_logprobs: after start(), entry i for prompt token i + 1 (the first has no context
    // to be scored in); empty when not asked for
    const std::vector<TokenLogprob> & prompt_logprobs() const { return prompt_logprobs_; }

    // measure the target's decode time (ms, best of n_reps) for batches of the given sizes: costs[n-1] for each
    // size n that fits the context after n_prefix tokens, 0 for sizes not measured; and the draft model's per-token
    // time. Clears the KV caches. interrupt() from another thread ends profile_verify within one timed pair
    // (throws Cancelled; the interrupt stays until clear_interrupt)
    std::vector<double> profile_verify(const std::vector<int> & sizes, int n_reps, int n_prefix = 32);
    double profile_draft(int n_reps);

    // a deliberately wrong sampling verifier, for tests that must be able to fail
    void set_wrong_sampling_for_tests(bool on) { verifier_.wrong_for_tests = on; }
    void set_grammar_full_mask_for_tests(bool on) { grammar_full_mask_ = on; } // no shortcuts (grammar.h)
    // drafts of the text a grammar forces (grammar_draft.cpp): on by default; off to measure what they gain
    void set_grammar_drafts(bool on) { grammar_drafts_ = on; }

  private:
    StepResult step_locked(); // step() under the lock; step() restores a consistent cache when this throws
    // the stages of a step (engine_step.cpp)
    struct Verified {
        Verdict verdict;
        std::vector<TokenLogprob> logprobs; // of the emitted tokens, when asked for
        double verify_ms = 0.0;             // the target's decodes
        int n_decoded = 0;                  // verify rows decoded (chunks after a rejection are not)
        int n_pad = 0;                      // filler rows decoded beside them
    };
    StepContext look(int n_past, int budget); // what the drafting sources offer now
    // fills draft_ with the choice's draft, else the text the grammar forces: that choice (k 0: none)
    Choice draft(const StepContext & sctx, const Choice & choice, const PenaltyWindow * penalties);
    Verified verify(int n_past, int first_rows, const PenaltyWindow * penalties);
    void learn(const StepContext & sctx, const StepOutcome & outcome, bool forced, llama_token next);
    void count(const StepOutcome & outcome, int n_pad); // into stats_
    void commit(const Verified & vd, StepResult & out);  // the emitted tokens, up to a stop
    void finish(const std::string & reason, StepResult & out);
    void remember(); // the generation's output goes into the drafting memory
    DraftPolicy & policy();

    EngineOptions opts_;
    std::unique_ptr<Model> target_;
    NgramMemory memory_;                 // before the drafter, which points to it
    std::unique_ptr<Drafter> drafter_;
    Model * draft_model_ = nullptr;

    GenerateOptions gen_;
    std::unique_ptr<DraftPolicy> fixed_; // fixed or heuristic policy of the current generation
    AutoPolicy auto_;                    // keeps what it learned across generations
    SamplingVerifier verifier_;
    Rng rng_;
    TextAssembler text_;
    Draft draft_;
    std::vector<llama_token> history_;   // prompt + committed tokens before id_last
    std::vector<llama_token> batch_;
    std::vector<llama_token> padded_;    // a verify chunk with its filler rows
    std::vector<llama_token> peek_;      // the n-gram proposal the policy looks at before choosing
    LogprobRecorder logprobs_;           // the step's verify rows, when logprobs are asked for
    std::vector<TokenLogprob> prompt_logprobs_; // the prompt's, when asked for
    std::unique_ptr<Grammar> grammar_;   // the generation's grammar, at the committed text (none: unconstrained)
    std::string grammar_text_;           // ... and the text it has read
    bool grammar_full_mask_ = false;
    bool grammar_drafts_ = true;
    MaskCost mask_cost_;                 // what a whole-row grammar mask costs here, for "auto"
    PromptCache prompt_cache_;           // the target's KV states of earlier prompts
    llama_token id_last_ = -1;
    bool active_ = false;
    bool model_in_step_ = false; // the draft model was prefilled for this generation (see start())
    std::atomic<bool> interrupt_{false};
    Stats stats_;
    mutable std::mutex mutex_;
};

} // namespace specllm
