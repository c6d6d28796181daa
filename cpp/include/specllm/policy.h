// Draft-length policies: how many tokens to draft in the next step (0 = a plain step).
#pragma once

#include "specllm/options.h"

#include <memory>
#include <vector>

namespace specllm {

// what one speculative step did, reported back to the policy
struct StepOutcome {
    int n_drafted = 0;      // draft tokens actually proposed (may be fewer than chosen)
    int n_accepted = 0;     // of them accepted by the target
    bool from_ngram = false;
    int n_catchup = 0;      // tokens the draft model decoded to catch up (after plain steps)
    double draft_ms = 0.0;  // time spent drafting
    double verify_ms = 0.0; // time of the target's decodes of the verify rows
    int n_verified = 0;     // verify rows decoded: n_drafted + 1, or fewer when chunks after a rejection were skipped
};

// what the policy may know before choosing
struct StepContext {
    int k_max = 0;            // hard limit (options, context room, remaining budget)
    bool has_model = false;   // a draft model is available
    bool has_ngram = false;   // an n-gram drafter is available
    int ngram_match = 0;      // length of the n-gram match available now (0 = none)
    bool ngram_doubtful = false; // that match is ambiguous (its key continues differently elsewhere) or copies
                                 // from the generated text rather than the prompt: it is accepted less often
    bool ngram_memory = false;   // that match was found in the memory of earlier generations (a source of its own)
    int model_lag = 0;        // tokens the draft model must decode before it can draft (it falls behind on
                              // plain and n-gram steps; catching up after a long prompt costs seconds)
    int hybrid_min_match = 3; // fixed policies use the n-gram proposal from this match length on
    int n_past = 0;           // tokens in the target's context before this step
    int ngram_boundary = -1;  // the first position of the n-gram proposal (up to k_max) right after the end of a
                              // sentence (boundary.h), -1 = none: a copy of prose seldom survives it
};

struct Choice {
    int k = 0;          // tokens to draft; 0 = plain step
    bool ngram = false; // draft with the n-gram drafter (else the draft model)
    int first_rows = 0; // verify the first this many rows alone and the rest only if all their drafts were
                        // accepted (0 = as the mode verifies: one batch, or exact mode's chunks)
};

class DraftPolicy {
  public:
    virtual ~DraftPolicy() = default;
    virtual Choice choose(const StepContext & ctx) = 0;
    virtual void update(const StepOutcome & outcome) = 0;
};

// which drafter a policy without a cost model uses: n-gram when it has a long enough match (or is alone)
Choice default_source(const StepContext & ctx, int k);

class FixedPolicy : public DraftPolicy {
  public:
    explicit FixedPolicy(int k) : k_(k) {}
    Choice choose(const StepContext & ctx) override { return default_source(ctx, k_); }
    void update(const StepOutcome &) override {}

  private:
    int k_;
};

// HF transformers' schedule: +2 after a fully accepted draft, -1 otherwise (at least 1)
class HeuristicPolicy : public DraftPolicy {
  public:
    explicit HeuristicPolicy(int k_start, int k_limit) : k_(k_start), k_limit_(k_limit) {}
    Choice choose(const StepContext & ctx) override { return default_source(ctx, k_); }
    void update(const StepOutcome & outcome) override;

  private:
    int k_;
    int k_limit_;
};

} // namespace specllm
