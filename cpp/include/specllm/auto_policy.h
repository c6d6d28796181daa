// The cost-model draft-length policy ("auto"), the differentiator of specllm.
//
// Plain decoding costs T(1) per token. A step that drafts k tokens costs draft(k) + verify(k+1) and yields
// E(k) = sum_{i=0..k} prod_{j<i} alpha_j tokens (alpha_j: probability that draft position j is accepted given
// the ones before it were). Each step picks argmax_k E(k) / (draft(k) + verify(k+1)) over k = 0..k_max,
// separately for each draft source (the draft model; n-gram proposals bucketed by match length, where a long
// match means a copy in progress, and by kind: clean, doubtful (an ambiguous key or a copy from the generated
// text), or from the memory of earlier generations) and takes the best: a source that does not pay is not used. verify(n) is T(n) for one batch, or, when verification
// runs in chunks (exact mode), the chunks' costs weighted by the probability that each is reached.
// T(n) comes from a profile at load (cached per machine), times one level learned online (the context length and the
// machine's speed), which scales every cost alike, so the n-gram choices depend on the profile and the text, never on
// the clock; optionally a factor per batch size, learned from the verify batches, follows how a batch costs against a
// plain step now (set_learn_batch_costs). The draft model's costs (per token and per catch-up token, over the level)
// and alpha_j are tracked online. An untried draft position counts with the
// acceptance of the deepest tried one, so a reliable copy grows its drafts. An n-gram draft position right after
// the end of a sentence, or at the last token of a copied message (boundary.h), counts with an estimate of its own
// (prior 0.54, learned in each generation): prose copies seldom survive it, so a copy drafts up to a sentence end or
// verifies up to it in a first chunk. An n-gram source plans with its estimates lowered by their uncertainty (few
// observations) times what a verify row costs against a plain step (step_alpha): where rows are dear, a long draft
// on a match of unknown worth waits until the text has shown that it copies. The draft model, while not used, is
// explored with k = 1 now and then, so that its estimates recover when the text changes; an n-gram source needs no
// paid try: its first proposal is checked for free on every step it does not draft (observe_shadow).
#pragma once

#include "specllm/policy.h"

#include <array>
#include <vector>

namespace specllm {

class AutoPolicy : public DraftPolicy {
  public:
    static constexpr int n_max = 48;        // largest draft considered (a copy in progress can pay this on a CPU)
    static constexpr int n_buckets = 5;     // n-gram match lengths 1-2, 3, 4-7, 8-15, 16+
    static constexpr int n_sources = 1 + 3 * n_buckets; // draft model; n-gram buckets, clean, doubtful, memory

    AutoPolicy();

    // verify costs: costs[n-1] = ms for a batch of n tokens (n = 1..size; 0 = not measured). A batch of n rows
    // costs the least measured cost of any size >= n, since the engine pads it to that size (padded_rows): an
    // unmeasured size, or one dearer than a larger one (T(13) > T(16) on some CPUs), is decoded as the larger.
    // Sizes beyond the last measured follow a least-squares line through all points with slope >= 0, unpadded.
    // Throws InvalidArgument unless T(1) > 0
    void set_verify_costs(const std::vector<double> & costs);
    std::vector<double> verify_costs() const;
    int padded_rows(int n) const; // the rows to decode for a verify batch of n (>= n; n if not padded)
    // what a batch of n rows costs now against the profile's shape (1 = as profiled; plain steps are 1 by definition)
    double batch_factor(int n) const { return size_factor(decoded_rows(n)); }
    // learn those factors from the verify batches' timing (default: off). Off, every cost is the profile's times one
    // level learned from every step, so the choices do not depend on the timing at all: separate processes with the
    // same cached profile draft alike and, in fast mode, write the same text (bench.spread, 3 processes over the
    // holdout set: the same steps and text on all 18 (prompt, turn)s; learning them: the same steps on 1, the text on
    // 12), and on this 2-core EPYC the factors bought nothing timed (bench/README, "What a batch costs now"). On, a
    // profile measured at another moment (a laptop on battery, a busy machine) is corrected as the batches show it.
    // Either way forgets what was learned
    void set_learn_batch_costs(bool on);
    bool learn_batch_costs() const { return learn_shape_; }
    // ms per token drafted by the draft model, at the profile's moment (scaled by the level, as T(n) is)
    // the profile's cost of a draft-model token: held (not learned from the steps' timing, unless batch costs are
    // learned), so that the choices never read the clock
    void set_draft_token_cost(double ms) {
        c_model_ = c_model_profiled_ = ms;
        draft_cost_held_ = ms > 0.0;
    }
    // ms that each verify row after the first adds per token of context beyond the profile's: a batch's rows
    // each attend to the whole context, so long batches grow with it faster than a plain step (measured on a
    // 2-core EPYC: T(16) = 5.16 T(1) at 32 tokens, 5.81 T(1) at 900), which the one online scale cannot follow
    void set_context_row_cost(double ms) { c_context_row_ = ms; }
    double context_row_cost() const { return c_context_row_; }
    // ms each verify row the verifier reads costs beyond T(n) in this generation (a grammar that masks every row
    // whole: grammar.h). Rows are read up to the first rejected draft, one per emitted token, so a step that emits
    // e tokens pays e of them and a plain step one
    void set_row_read_cost(double ms) { c_row_read_ = ms; }
    void forget_draft_model(); // another draft model: its acceptance and costs start over (n-gram ones stay)
    // the drafting memory was emptied or replaced (reset, clear_memory, a loaded memory): its sources' estimates go
    // back to their priors, as in a new process, since what they learned was about other text
    void forget_memory();
    // a generation without the draft model (it did not pay): its acceptance moves back toward its prior, keeping
    // `keep`, so a model left out after poor prompts is tried again a few prompts later where its prior pays
    void left_out_draft_model(double keep = default_keep);
    void set_k_limit(int k) { k_limit_ = k; }
    void set_verify_rows(int n) { verify_rows_ = n; } // verify in chunks of at most n rows (0 = one batch)
    int verify_rows() const { return verify_rows_; }
    // the same profile (verify costs as set, before any learned level) and verify rows: a state of one can stand in
    // for the other's (Engine::set_policy_state)
    bool same_costs(const AutoPolicy & other) const {
        return t_verify_ == other.t_verify_ && verify_rows_ == other.verify_rows_;
    }
    // first chunks a one-batch (fast mode) step may verify alone before the rest: on a CPU a 1-row probe costs
    // one plain step and, if draft 1 is wrong, saves the whole batch (a failed 16-row draft costs 4.5 plain
    // steps on a 2-core EPYC); if it is right, the rest costs T(k) instead of T(k+1) - T(1)
    static constexpr int first_chunks[] = {1, 2, 4};
    // the first draft of a source in a generation (k >= probe_k_min, made on its priors, which are over-confident at
    // position 0 on unseen text) is verified behind a 1-row probe whenever that keeps at least probe_keep of the
    // one-batch rate the estimates promise: cheap insurance on a CPU, never taken where T(n) is flat
    static constexpr int probe_k_min = 4;
    static constexpr double probe_keep = 0.9;
    int first_rows() const { return last_first_; } // the first chunk of the last choice (0 = none)
    // what the steps cost now against the profile (measured / profiled; a running mean, then an EMA) and how many
    // steps taught it (0 = none yet: level 1). Far below 1 after many steps, the profile was measured while the
    // machine ran slower than it does now (busy, or on battery): profile.py then has it measured again at the next
    // load, since a slowdown measured into a profile bends its shape as well as its level. Learned from the steps at
    // a context of at most 512 tokens only, alike but apart from the level the costs are scaled by: that one takes
    // the context in too (a plain step at 2,000-3,000 tokens costs 1.3-1.55 T(1) on a 2-core EPYC), and read as the
    // machine's speed it hid a busy profile on long prompts and kept the batches' shape from being judged there
    double step_level() const { return n_short_obs_ > 0 ? short_scale_ : 1.0; }
    int step_level_observations() const { return n_short_obs_; }
    // what the verify batches (2+ rows) cost against the plain steps of their moment, each measured / profiled (1 =
    // the profile's shape; an EMA), and how many batches taught it since the costs were set; tracked whether or not
    // batch costs are learned. The level cannot show a profile whose shape is wrong: it learns from every step. Well
    // above 1, the profile was measured while other work slowed a 1-row step more than a batch (a 2-core Xeon VM's
    // pair profile read T(1) = 100, T(8) = 253 ms; quiet, the steps ran at 86 and 299), and the policy drafts as if
    // batches were cheaper than they are: profile.py then has it measured again at the next load. Only steps at a
    // context of at most 512 tokens teach it, as step_level (the profile's T(n) was measured at 32;
    // auto_policy_costs.cpp)
    double batch_shape() const { return n_shape_obs_ > 0 ? shape_ : 1.0; }
    int batch_shape_observations() const { return n_shape_obs_; }

    // a new prompt. The n-gram sources over the text start again from their priors: what one text copied says little
    // about the next, and carrying it over made a prompt's speed depend on the prompts before it. Replaying the fresh
    // set's 64 answers (bench/results/fresh-lockstep-8) in five orders (`bench.simulate --fast --orders 5`): now a
    // prompt's speed-up does not move; keeping 0.75 of what was learned (--text-carry 4 --text-keep 0.75) it moves by
    // up to 0.18 (p90 0.13) for a 1% higher mean, and with the priors of before (guesses, 0.2-0.9) by up to 0.36. The
    // priors are measured (bench.calibrate). The drafting memory's sources and the draft model keep what was learned
    // -- the memory exists to carry earlier requests over, and a model pair's acceptance belongs to the pair -- as a
    // prior worth at most `carry` observations per source and position. `keep` < 1 moves the memory's estimates back
    // toward their priors (keeping that share); by default they stay as learned. The priors were measured on
    // multi-call work (0.67-0.83 at position 0), where the memory pays; on single requests a 2-token memory match is
    // right 0.36 of the time (212 dev and holdout answers, each run's earlier answers as the memory), and pulled a
    // quarter of the way back to 0.67 at every request, its estimate sat near 0.5, where a 7-token draft behind a
    // 4-row first chunk still pays on paper, and such drafts failed at their first token on short answers (holdout4's
    // translation-7: 5 drafts, 0 accepted, 0.93x). Replayed (`bench.simulate --fast --one-policy --memory`, 8 runs,
    // three machines' profiles): answers below 0.97x 8 -> 5, 27 -> 23, 14 -> 8, multi-call requests 3+ within 0.02,
    // also after a Spec-Bench run on the same policy. A memory that learned low recovers through its shadow checks
    // (observe_shadow, on plain steps and on steps the draft model drafted; not on a grammar's forced drafts, and not
    // at a sentence end, whose checks go to the boundary's estimate).
    void new_generation(int carry = default_carry, double keep = memory_keep, int text_carry = 0,
                        double text_keep = 0.0);
    static constexpr int default_carry = 4;
    static constexpr double memory_keep = 1.0;  // see new_generation
    static constexpr double default_keep = 0.75; // left_out_draft_model's

    Choice choose(const StepContext & ctx) override;
    void update(const StepOutcome & outcome) override;
    // a step that could have used an n-gram proposal and did not (a plain step, or one the draft model drafted):
    // would its first token have been accepted?
    // `boundary`: that first token follows the end of a sentence (StepContext::ngram_boundary == 0): the sample
    // goes to the boundary's estimate instead of the source's
    void observe_shadow(int ngram_match, bool doubtful, bool would_accept, bool memory = false, bool boundary = false);
    // an n-gram draft position right after the end of a sentence (boundary.h) counts with this acceptance instead of
    // its source's: measured on the dev runs' plain answers, 0.55 of 490 positions inside a draft and 0.43 of 49 at
    // the first (pooled: 0.54; anywhere else 0.96). Learned in each generation afresh, as the text's sources are
    static constexpr double alpha_prior_boundary = 0.54;
    // a draft the grammar forces (grammar_draft.cpp) of m tokens: how many to verify and how, with their own
    // acceptance estimate (the same at every position: a forced text is tokenized right or not), k = 0 when none
    // beats a plain step; and what became of one. It replaces the step's choice: its batch is one chunk, so the cost
    // the step teaches is not split at the first_rows choose() gave for a draft its sources did not make
    Choice forced_choice(int m);
    void observe_forced(int n_drafted, int n_accepted);
    static constexpr double alpha_prior_forced = 0.9;
    double forced_acceptance() const { return alpha_forced_; }
    double boundary_acceptance() const { return alpha_boundary_; }

    // introspection (stats, tests)
    const std::array<double, n_max> & acceptance(int source) const { return alpha_[source]; }
    std::array<double, n_max> planning_alpha(int source) const;    // acceptance per position used to choose
    static int source_of(bool ngram, int match, bool doubtful = false, bool memory = false);
    // could this source beat plain decoding at all (at 95% acceptance) with the measured costs?
    bool viable(int source) const;
    // does it beat plain decoding with the acceptance estimated now (the prior before any outcome)? The engine
    // keeps the draft model in step with the prompt only when it does: its prefill costs ~1/3 of the target's
    // (0.5B vs 1.5B), 6-8 s of TTFT on a long prompt on a 2-core CPU, where the model does not pay
    bool pays(int source) const;

  private:
    static constexpr double ema_cost = 0.1; // weight of a new cost observation (scale, draft costs)
    double cost_verify(int n) const;
    int decoded_rows(int n) const { return one_batch() && n > 1 ? padded_rows(n) : n; }
    bool one_batch() const { return verify_rows_ == 0 || verify_rows_ > n_max; } // not exact mode's chunks
    bool beats_plain(int source, const double * alpha) const; // some k in 1..k_limit beats plain by the margin
    double learn_rate(int source, int pos, double prior_weight = 1.0);
    double cost_draft(int source, int k) const;
    double cost_catchup(int lag) const; // ms for the draft model to decode `lag` tokens before drafting
    // profiled ms to decode n_rows verify rows in chunks (unscaled), the first chunk of `first` rows if > 0
    double cost_rows(int n_rows, int first = 0) const;
    double context_rows(int n_rows, int first = 0) const; // what the context adds to those chunks
    int chunk_rows(int r0, int n_rows, int first) const;   // rows of the chunk starting at row r0
    // expected tokens per ms of a k-token draft with per-position acceptance alpha (chunks after a rejection
    // are not decoded, so later chunks count with the probability that they are reached); first > 0: the first
    // `first` rows alone, then the rest in one batch
    double rate(const double * alpha, int k, double c_draft_ms, int first = 0) const;
    // the best of rate() over one batch and the first chunks tried (fast mode); *first gets the chunk
    double best_rate(const double * alpha, int k, double c_draft_ms, int * first) const;

    std::array<double, n_max + 2> t_verify_{};                // t_verify_[n]: ms for n tokens (profiled shape)
    std::array<int, n_max + 2> pad_to_{};                     // pad_to_[n]: rows decoded for a batch of n
    double verify_scale_ = 1.0;                                // a plain step, measured / profiled: grows with the context
    int n_scale_obs_ = 0; // steps that taught it (plain ones; every step where batch costs are not learned)
    double short_scale_ = 1.0; // verify_scale_ from the steps at a context of at most 512 tokens (step_level) ...
    int n_short_obs_ = 0;      // ... and how many taught it
    double level() const; // what the choices scale T(n) by: verify_scale_, or the batches' own before a plain step
    // a batch of m decoded rows costs size_factor(m) * level() * T(m): what batches cost against their profile
    // (measured / profiled), per size (own_ratio_, n_own_) and over all batch sizes (batch_ratio_, n_batch_obs_),
    // divided by the level when used
    std::array<double, n_max + 2> own_ratio_{};
    std::array<int, n_max + 2> n_own_{};
    double batch_ratio_ = 1.0;
    int n_batch_obs_ = 0;
    bool learn_shape_ = false;
    double size_factor(int rows) const; // rows: the rows a batch decodes (padded)
    void observe_cost(double seen_ms, int n_rows);
    double plain_ratio_ = 1.0; // plain steps' measured / profiled cost (an EMA), for batch_shape
    int n_plain_obs_ = 0;
    double shape_ = 1.0; // see batch_shape
    int n_shape_obs_ = 0;
    void observe_shape(double ratio, int n_rows); // a step's measured / profiled cost
    double c_context_row_ = 0.0;                               // see set_context_row_cost
    double c_row_read_ = 0.0;                                  // see set_row_read_cost
    int n_past_ = 0;                                           // the context of the last choice
    double context_extra(int n) const;                         // ms the context adds to a batch of n rows
    std::array<std::array<double, n_max>, n_sources> alpha_{}; // per source and draft position
    std::array<std::array<int, n_max>, n_sources> n_obs_{};    // observations per source and position
    int model_idle_ = 0;                                       // steps since the draft model last drafted
    double alpha_boundary_ = alpha_prior_boundary;             // see alpha_prior_boundary
    double alpha_forced_ = alpha_prior_forced;                 // see forced_choice
    int n_forced_obs_ = 0;
    int n_boundary_obs_ = 0;
    int last_boundary_ = -1; // the boundary position of the last choice's n-gram draft (-1 = none or the model)
    // planning_alpha with the boundary's estimate at position `boundary` of an n-gram source
    std::array<double, n_max> step_alpha(int source, int boundary) const;
    void observe_boundary(bool accepted);
    int model_explore_after_ = 0;                              // its plain steps before the next exploration
    bool exploring_ = false;
    double c_model_ = 0.0;   // ms per draft-model token over the level (0 = unknown yet)
    double c_catchup_ = 0.0; // ms per token of a catch-up batch over the level (0 = unknown)
    bool draft_cost_held_ = false; // c_model_ is the profile's: learned from timing only with learn_shape_
    double c_model_profiled_ = 0.0;
    int k_limit_ = n_max;
    int verify_rows_ = 0;
    int last_source_ = 0;
    int last_first_ = 0; // the first chunk of the last choice
    std::array<bool, n_sources> drafted_{}; // the source has drafted in this generation
    // how this generation's text copies: position-0 outcomes of its n-gram sources (drafts and free shadow
    // observations) against what their priors expected. Every text source's position-0 estimate leans on the
    // ratio while it has few observations of its own, so a text that does not copy stops all of its sources
    // after a few misses, not each after its own (15 sources start from priors in a new generation)
    double text_hits_ = 0.0, text_expected_ = 0.0;
    void observe_text(int source, bool accepted);
};

} // namespace specllm
