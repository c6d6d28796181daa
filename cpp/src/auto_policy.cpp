#include "specllm/auto_policy.h"

#include "specllm/errors.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace specllm {

namespace {
constexpr double ema_alpha = 0.05;   // weight of a new acceptance observation
constexpr int explore_first = 16;    // plain steps after which an unused draft model is tried with k = 1 ...
constexpr int explore_last = 512;    // ... doubling after each try, up to this
constexpr double alpha_viable = 0.95; // a source that cannot beat plain even at this acceptance is never tried
constexpr double margin = 1.03;        // a draft must beat plain decoding by this factor (estimates are noisy)
// standard deviations an n-gram estimate is planned below its value (step_alpha): the text's sources by their
// posterior's (prior worth text_prior_weight), the memory's as before 2026-12-07 (half of one, count + 2)
constexpr double caution_text = 1.0;
constexpr double caution_memory = 0.5;
constexpr double alpha_prior_model = 0.6;
// an outcome on a text source (a free check of position 0, observe_shadow, or a drafted position on a match below 16
// tokens, update) moves its estimate as a running mean in which the prior counts as this many outcomes (the memory's
// sources: as one, beside the record they carry from earlier requests; the draft model, and drafts on a 16+ match, a
// copy in progress: as one). Counted as one, a single right check lifted a 1-2-token match from 0.73 to 0.86, where
// on a CPU with dear short batches a 3-token draft pays on paper; drafted just after such lifts, these drafts failed
// at their first token far more often than the estimate said (bench/README, 2026-12-06). Drafted outcomes counted the
// prior as one until 2026-12-07: two accepted 2-token drafts lifted positions 0-1 from 0.81 to 0.94, the positions
// never drafted carry the deepest one's estimate, and the third draft was 15 tokens long; on RAG answers (a document's
// phrases quoted for 3-8 tokens) such drafts failed at their first tokens (bench/README, "The text's prior as four
// outcomes")
constexpr double text_prior_weight = 4.0;
constexpr double text_pseudo = 2.0; // the text's factor starts as this many position-0 outcomes that met the priors
// by match bucket (1-2, 3, 4-7, 8-15, 16+ tokens), clean, doubtful, then memory. A new prompt starts the text's
// sources from these, so they are what was measured (`python -m bench.calibrate`): how often the proposal's next token
// was the answer's, over the plain answers of the dev set's runs (bench/results default-vs-fixed-k,
// copy-heavy-12-prompts, never-slower-*: 56 prompts, 3,300 positions with a match). Memory: measured alike on the
// plain answers of bench.multicall's json-records, tool-calls, docstrings and chat-retry-ts sequences (each request's
// earlier answers as the memory; 525 positions with a memory match: 0.67, 0.80, 0.72, 0.76, 0.83, the middle two
// pooled so that a longer match never starts lower). Before: guesses (0.2-0.7) that kept a memory silent until
// its shadow checks had outvoted them
constexpr double alpha_prior_ngram[AutoPolicy::n_sources - 1] = {0.73, 0.81, 0.89, 0.94, 0.98,  // clean
                                                                 0.40, 0.50, 0.50, 0.81, 0.94,  // doubtful
                                                                 0.67, 0.74, 0.74, 0.76, 0.83}; // memory

// a clean or doubtful n-gram match in the text itself (not the drafting memory's, not the draft model)
bool text_source(int s) {
    return s >= 1 && s <= 2 * AutoPolicy::n_buckets;
}

// an n-gram match below 16 tokens (a 16+ match is a copy in progress: planned and learned as estimated)
bool below_copy(int s) {
    return s >= 1 && (s - 1) % AutoPolicy::n_buckets < AutoPolicy::n_buckets - 1;
}
} // namespace

AutoPolicy::AutoPolicy() {
    for (int n = 0; n < n_max + 2; ++n) {
        t_verify_[n] = n == 0 ? 0.0 : 1.0 * n; // placeholder: linear (no speedup) until profiled
        pad_to_[n] = n;
    }
    for (int s = 0; s < n_sources; ++s) {
        const double prior = s == 0 ? alpha_prior_model : alpha_prior_ngram[s - 1];
        alpha_[s].fill(prior);
    }
    model_explore_after_ = explore_first;
}

double AutoPolicy::learn_rate(int s, int j, double prior_weight) {
    // a running mean while observations are few (the prior counts as prior_weight), then an EMA that can follow change
    const int n = ++n_obs_[s][j];
    return std::max(ema_alpha, 1.0 / (n + prior_weight));
}

void AutoPolicy::new_generation(int carry, double keep, int text_carry, double text_keep) {
    // the next observations weigh 1/(carry+2), 1/(carry+3), ... until the EMA, and the n-gram estimates start from
    // `keep` of the way between their prior and what was learned
    keep = std::min(1.0, std::max(0.0, keep));
    text_keep = std::min(1.0, std::max(0.0, text_keep));
    drafted_.fill(false);
    text_hits_ = text_expected_ = 0.0;
    alpha_boundary_ = alpha_prior_boundary;
    n_boundary_obs_ = 0;
    alpha_forced_ = alpha_prior_forced; // how a reply lays out its text (whitespace) is its own
    n_forced_obs_ = 0;
    for (int s = 0; s < n_sources; ++s) {
        const bool text = text_source(s);
        for (int j = 0; j < n_max; ++j) {
            n_obs_[s][j] = std::min(n_obs_[s][j], std::max(0, text ? text_carry : carry));
            if (s != 0) {
                const double prior = alpha_prior_ngram[s - 1];
                alpha_[s][j] = prior + (text ? text_keep : keep) * (alpha_[s][j] - prior);
            }
        }
    }
}

void AutoPolicy::left_out_draft_model(double keep) {
    keep = std::min(1.0, std::max(0.0, keep));
    for (double & a : alpha_[0]) {
        a = alpha_prior_model + keep * (a - alpha_prior_model);
    }
}

void AutoPolicy::forget_draft_model() {
    alpha_[0].fill(alpha_prior_model);
    n_obs_[0].fill(0);
    model_idle_ = 0;
    model_explore_after_ = explore_first;
    c_model_ = 0.0;
    c_catchup_ = 0.0;
    draft_cost_held_ = false;
}

void AutoPolicy::forget_memory() {
    for (int s = source_of(true, 1, false, true); s < n_sources; ++s) { // the memory's sources come last
        alpha_[s].fill(alpha_prior_ngram[s - 1]);
        n_obs_[s].fill(0);
        drafted_[s] = false;
    }
}

bool AutoPolicy::beats_plain(int source, const double * alpha) const {
    const double plain = margin / (cost_verify(1) + c_row_read_);
    int first = 0;
    for (int k = 1; k <= std::min(k_limit_, n_max); ++k) {
        if (best_rate(alpha, k, cost_draft(source, k), &first) > plain) {
            return true;
        }
    }
    return false;
}

bool AutoPolicy::viable(int source) const {
    std::array<double, n_max> alpha;
    alpha.fill(alpha_viable);
    return beats_plain(source, alpha.data());
}

bool AutoPolicy::pays(int source) const {
    return beats_plain(source, planning_alpha(source).data());
}

int AutoPolicy::source_of(bool ngram, int match, bool doubtful, bool memory) {
    if (!ngram) {
        return 0;
    }
    const int bucket = match <= 2 ? 0 : match == 3 ? 1 : match < 8 ? 2 : match < 16 ? 3 : 4;
    return 1 + bucket + (memory ? 2 * n_buckets : doubtful ? n_buckets : 0);
}

std::array<double, AutoPolicy::n_max> AutoPolicy::planning_alpha(int source) const {
    // a position never observed counts with the acceptance of the deepest one observed before it: optimism
    // that lets a long copy try longer drafts (with chunked verification a wrong guess costs one skipped chunk)
    std::array<double, n_max> a = alpha_[source];
    double moved = a[0];
    if (text_source(source)) {
        // the text's factor moves the prior's share of the position-0 estimate (1 / (observations + 1) while
        // the estimate is a running mean): what the other sources saw of this text tells this one. Lowered, the
        // unobserved positions below follow it; raised, position 0 alone: carried into them, it made a 2-token
        // match in a text of many hits look like a copy, and 31 tokens were drafted that all failed (holdout
        // RAG-1 on a 2-core EPYC: one 0.93 s step, an eighth of the answer's time)
        const double prior = alpha_prior_ngram[source - 1];
        const double f = (text_hits_ + text_pseudo) / (text_expected_ + text_pseudo);
        moved = a[0] + (prior * f - prior) / (n_obs_[source][0] + 1.0);
        moved = std::min(std::max(a[0], 0.99), std::max(std::min(a[0], 0.01), moved));
        a[0] = std::min(a[0], moved);
    }
    for (int j = 1; j < n_max; ++j) {
        if (n_obs_[source][j] == 0 && n_obs_[source][j - 1] > 0) {
            a[j] = a[j - 1];
        } else if (n_obs_[source][j] == 0 && n_obs_[source][0] > 0) {
            a[j] = std::max(a[j], a[j - 1]);
        }
    }
    a[0] = moved;
    return a;
}

std::array<double, AutoPolicy::n_max> AutoPolicy::step_alpha(int source, int boundary) const {
    auto a = planning_alpha(source);
    if (below_copy(source)) {
        // an n-gram estimate counts as its lower bound: some standard deviations below, times what a row adds to a
        // plain step (T(2) / T(1) - 1, at most 1). A text source's estimate is the mean of a Beta posterior whose
        // prior weighs text_prior_weight outcomes: planned one of its standard deviations below (caution_text); the
        // memory's half of one, counting its observations and 2. Few observations (a new prompt's priors) and dear
        // rows make a long draft on a match of unknown worth wait until the text has shown that it copies: a failed
        // 16-row draft cost 5-6 plain steps on a 2-core EPYC, 5% of a 96-token answer, and each of holdout9's two tasks
        // below 0.97 lost on one or two. A match of 16+ tokens is a copy in progress (right 0.99 of the time on
        // holdout8-9's answers): planned as estimated. Replayed (`bench.simulate --fast --one-policy --memory`, a
        // 2-core EPYC's profile; bench/README, "Caution where rows are dear" and "The text's prior as four outcomes"):
        // half a deviation with the count + 2 for every source (2026-12-06) took holdout8-10's 96 plain answers below
        // 0.97 from 22 to 5; this one (with the prior as four outcomes) 12 -> 5 over holdout8-11's 128, 8 -> 4 over
        // holdout3-7 and fresh's 140, 4 -> 2 over the dev runs' 56, the geometric mean 1.2055 -> 1.2043 over all
        // 324 (code edits 1.518 -> 1.491, RAG 1.060 -> 1.063); with T(n) nearly flat 1.767 -> 1.773
        const double row = std::min(1.0, std::max(0.0, t_verify_[2] / t_verify_[1] - 1.0));
        const bool text = text_source(source);
        // the count in the spread: a Beta posterior's (observations + the prior's weight + 1) for the text's sources
        const double counted = text ? text_prior_weight + 1.0 : 2.0;
        const double sds = text ? caution_text : caution_memory;
        int n = 0; // a position never drafted carries the estimate of the deepest one before it, and its count: a
        for (int j = 0; j < n_max; ++j) { // copy's next untried length is no less known than the last tried one
            n = n_obs_[source][j] > 0 || j == 0 ? n_obs_[source][j] : n;
            const double spread = std::sqrt(a[j] * (1.0 - a[j]) / (n + counted));
            a[j] = std::max(0.0, a[j] - sds * row * spread);
        }
    }
    if (source != 0 && boundary >= 0 && boundary < n_max) {
        a[boundary] = alpha_boundary_;
    }
    return a;
}

void AutoPolicy::observe_boundary(bool accepted) {
    // a running mean with the prior worth two observations, then an EMA
    const double w = std::max(ema_alpha, 1.0 / (++n_boundary_obs_ + 2.0));
    alpha_boundary_ = (1.0 - w) * alpha_boundary_ + w * (accepted ? 1.0 : 0.0);
}

double AutoPolicy::rate(const double * alpha, int k, double c_draft_ms, int first) const {
    double e = 1.0, run = 1.0, ms = c_draft_ms, reach = 1.0;
    for (int r0 = 0; r0 <= k;) { // rows r0.. verify draft positions r0..
        const int n = chunk_rows(r0, k + 1, first);
        ms += reach * cost_verify(n);
        for (int j = r0; j < std::min(r0 + n, k); ++j) {
            run *= alpha[j];
            e += run;
        }
        reach = run; // the next chunk is decoded only if every draft so far was accepted
        r0 += n;
    }
    return e / (ms + c_row_read_ * e); // row j is read iff drafts 1..j were accepted: e rows expected
}

double AutoPolicy::best_rate(const double * alpha, int k, double c_draft_ms, int * first) const {
    double best = rate(alpha, k, c_draft_ms);
    *first = 0;
    if (!one_batch()) {
        return best;
    }
    for (int f : first_chunks) {
        if (f > k) { // the rest would be empty (f = k + 1) or the chunk not a split at all
            break;
        }
        const double r = rate(alpha, k, c_draft_ms, f);
        if (r > best) {
            best = r;
            *first = f;
        }
    }
    return best;
}

Choice AutoPolicy::choose(const StepContext & ctx) {
    Choice best;
    n_past_ = ctx.n_past;
    double best_rate = margin / (cost_verify(1) + c_row_read_);
    exploring_ = false;
    const int k_cap = std::min({ctx.k_max, k_limit_, n_max});
    int explore = -1;
    for (int s = 0; s < n_sources; ++s) {
        const bool usable = s == 0 ? ctx.has_model
                                   : (ctx.has_ngram && ctx.ngram_match > 0 &&
                                      source_of(true, ctx.ngram_match, ctx.ngram_doubtful, ctx.ngram_memory) == s);
        if (!usable) {
            continue;
        }
        const double catchup = s == 0 ? cost_catchup(ctx.model_lag) : 0.0;
        const auto alpha = step_alpha(s, ctx.ngram_boundary);
        for (int k = 1; k <= k_cap; ++k) {
            int first = 0;
            const double rate = this->best_rate(alpha.data(), k, cost_draft(s, k) + catchup, &first);
            if (rate > best_rate) {
                best_rate = rate;
                best.k = k;
                best.ngram = s != 0;
                best.first_rows = first;
            }
        }
        // only the draft model is explored: an n-gram source's first proposal is checked for free on every step
        // it does not draft (Engine::learn's shadow check), which is all a paid try with k = 1 would teach
        if (s == 0 && ++model_idle_ > model_explore_after_ && k_cap > 0 && catchup <= 2.0 * cost_verify(1) &&
            viable(s)) {
            explore = s;
        }
    }
    if (best.k == 0 && explore >= 0) {
        best.k = 1;
        best.ngram = explore != 0;
        best.first_rows = 0;
        exploring_ = true;
    }
    last_source_ = source_of(best.ngram, ctx.ngram_match, ctx.ngram_doubtful, ctx.ngram_memory);
    last_boundary_ = best.ngram ? ctx.ngram_boundary : -1;
    if (one_batch() && best.k >= probe_k_min && best.first_rows == 0 && !drafted_[last_source_]) {
        const auto alpha = step_alpha(last_source_, last_boundary_);
        const double c = cost_draft(last_source_, best.k) + (best.ngram ? 0.0 : cost_catchup(ctx.model_lag));
        if (rate(alpha.data(), best.k, c, 1) >= probe_keep * rate(alpha.data(), best.k, c)) {
            best.first_rows = 1;
        }
    }
    last_first_ = best.first_rows;
    if (best.k > 0 && last_source_ == 0) {
        model_idle_ = 0;
        if (!exploring_) {
            model_explore_after_ = explore_first;
        }
    }
    return best;
}

Choice AutoPolicy::forced_choice(int m) {
    Choice best;
    last_first_ = 0;
    double best_rate = margin / (cost_verify(1) + c_row_read_);
    std::array<double, n_max> alpha{};
    alpha.fill(alpha_forced_);
    for (int k = 1; k <= std::min({m, k_limit_, n_max}); ++k) { // one batch: no probe (and the cost the step
        const double rate = this->rate(alpha.data(), k, cost_draft(1, k)); // teaches is that of one batch)
        if (rate > best_rate) {
            best_rate = rate;
            best.k = k;
        }
    }
    return best;
}

void AutoPolicy::observe_forced(int n_drafted, int n_accepted) {
    // per position reached: accepted ones, and the first rejected one (positions after it were never tried)
    for (int j = 0; j < std::min(n_drafted, n_accepted + 1); ++j) { // the prior worth 4 observations
        const double w = std::max(ema_alpha, 1.0 / (++n_forced_obs_ + 4.0));
        alpha_forced_ = (1.0 - w) * alpha_forced_ + w * (j < n_accepted ? 1.0 : 0.0);
    }
}

void AutoPolicy::update(const StepOutcome & o) {
    observe_cost(o.verify_ms, o.n_verified > 0 ? o.n_verified : o.n_drafted + 1);
    if (o.n_drafted == 0) {
        return;
    }
    const int s = o.from_ngram ? last_source_ : 0;
    const int b = s != 0 ? last_boundary_ : -1; // the boundary's outcome is its own, not the source's
    drafted_[s] = true;
    if (b >= 0 && b < o.n_drafted && o.n_accepted >= b) {
        observe_boundary(o.n_accepted > b);
    }
    if (b != 0) {
        observe_text(s, o.n_accepted > 0);
    }
    if (exploring_) { // a failed try makes the next one come later, a successful one sooner
        int & after = model_explore_after_; // only the draft model is explored
        after = o.n_accepted == o.n_drafted ? std::max(explore_first, after / 2) : std::min(2 * after, explore_last);
    }
    // the draft model's costs are kept over the level, as T(n) is: a machine that runs slower now drafts slower too.
    // A profiled cost is held unless batch costs are learned: learned from the draft's timing, the same prompt
    // drafted differently in two processes (a reviewer: 1 run in 6, 3 in 8 under load)
    const bool learn_draft = s == 0 && o.draft_ms > 0.0 && (learn_shape_ || !draft_cost_held_);
    if (learn_draft && o.n_catchup <= 1) { // a catch-up after plain steps is not the per-token cost
        const double per_token = o.draft_ms / o.n_drafted / level();
        c_model_ = c_model_ > 0.0 ? (1.0 - ema_cost) * c_model_ + ema_cost * per_token : per_token;
    } else if (learn_draft && o.n_catchup > 2 && c_model_ > 0.0) {
        const double per_token = std::max(0.0, o.draft_ms / level() - c_model_ * o.n_drafted) / o.n_catchup;
        c_catchup_ = c_catchup_ > 0.0 ? (1.0 - ema_cost) * c_catchup_ + ema_cost * per_token : per_token;
    }
    const int j_last = std::min(o.n_accepted, o.n_drafted - 1); // the last position with an outcome
    // a clean or doubtful match of the text below 16 tokens (16+: a copy in progress, learned at full speed)
    const bool text = text_source(s) && below_copy(s);
    const auto carried = text ? planning_alpha(s) : alpha_[s]; // only the text's sources start from it
    for (int j = 0; j <= j_last; ++j) {
        if (j == b) {
            continue;
        }
        if (text && j >= 1 && n_obs_[s][j] == 0) {
            // drafted for the first time: from the estimate the plan carried into it (the deepest drafted
            // position's), not from the prior it was left near. From the prior, at four outcomes' weight, an
            // accepted draft lowered its deeper positions' planning estimates and stopped the next draft
            alpha_[s][j] = carried[j];
        }
        const double seen = j < o.n_accepted ? 1.0 : 0.0;
        const double w = learn_rate(s, j, text ? text_prior_weight : 1.0);
        alpha_[s][j] = (1.0 - w) * alpha_[s][j] + w * seen;
    }
    // positions past the last outcome were not observed: let them drift toward the last estimate, so that
    // a draft length that was never tried can become attractive (and a bad one unattractive)
    for (int j = j_last + 1; j < n_max; ++j) {
        alpha_[s][j] = (1.0 - 0.5 * ema_alpha) * alpha_[s][j] + 0.5 * ema_alpha * alpha_[s][j_last];
    }
    if (s != 0 && o.n_accepted == o.n_drafted && o.n_drafted < n_max) {
        // a copy that ran to the end of its draft, where the next position has failed once at most: that one
        // outcome is doubted, and the next position moves toward this one's estimate (not an outcome: its count
        // stays). An n-gram proposal's next token is at least as likely right as this one once this one was
        // (measured on the dev answers' plain text: 0.73, 0.81, 0.85, 0.88, 0.90 ... by depth for a 1-2-token
        // match). Without it one long draft that failed at its second token kept a copy at k = 1 for 12 of 16
        // drafts, all accepted, in one of four processes (bench.spread); a second failure is believed
        const int j = o.n_drafted;
        if (n_obs_[s][j] <= 1) {
            alpha_[s][j] += std::max(0.0, alpha_[s][j - 1] - alpha_[s][j]) / (n_obs_[s][j] + 2.0);
        }
    }
}

void AutoPolicy::observe_shadow(int ngram_match, bool doubtful, bool would_accept, bool memory, bool boundary) {
    // a plain step whose emitted token was compared with the n-gram drafter's first proposal: a free sample
    // of position 0's acceptance (P(match) equals p(d), the one-hot acceptance probability, when sampling too)
    if (ngram_match <= 0) {
        return;
    }
    if (boundary) {
        observe_boundary(would_accept);
        return;
    }
    const int s = source_of(true, ngram_match, doubtful, memory);
    observe_text(s, would_accept);
    const bool text = text_source(s); // the memory's sources carry their record instead (new_generation's carry)
    const double w = learn_rate(s, 0, text ? text_prior_weight : 1.0);
    alpha_[s][0] = (1.0 - w) * alpha_[s][0] + w * (would_accept ? 1.0 : 0.0);
    for (int j = 1; j < n_max; ++j) {
        alpha_[s][j] = (1.0 - 0.5 * ema_alpha) * alpha_[s][j] + 0.5 * ema_alpha * alpha_[s][0];
    }
}

void AutoPolicy::observe_text(int source, bool accepted) {
    if (text_source(source)) {
        text_hits_ += accepted ? 1.0 : 0.0;
        text_expected_ += alpha_prior_ngram[source - 1];
    }
}

} // namespace specllm
