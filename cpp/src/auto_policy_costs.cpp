// AutoPolicy's cost model: the profiled T(n) (a batch padded to the cheapest measured size at least as large),
// the chunks a verify is decoded in, what the context adds to a batch's rows, and the drafters' costs. The
// acceptance estimates and the choice are in auto_policy.cpp.
#include "specllm/auto_policy.h"

#include "specllm/errors.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace specllm {

namespace {
constexpr int profile_context = 32; // the context T(n) is profiled at (Engine::profile_verify's default prefix)
constexpr double ema_shape = 0.05;  // weight of a new batch cost observation, once there are more than 1/ema_shape
constexpr double size_prior = 4.0;  // a size's own factor counts as this many observations against all sizes' ...
constexpr int size_own_max = 16;    // ... and its own observations count at most this many
constexpr double ratio_min = 0.33, ratio_max = 3.0; // one step's measured / expected (a preempted step is not a cost)
constexpr double shape_step = 1.25; // one batch moves batch_shape's EMA as if it read at most this x (or 1/this) of it
// the stale checks' level (step_level) and batch_shape judge the profile, measured at 32 tokens: steps at a longer
// context are left out. There a plain step costs more (1.3-1.55 T(1) at 2,000-3,000 tokens on a 2-core EPYC), which
// the level takes in, so it read as a faster machine and hid a profile measured busy; and what a batch's rows add
// with the context (measured apart: 0-0.012 ms per row per token in six measurements there, against 0-0.004 in grids
// of T(n) at 32-3,072 tokens; 0.004 is ~20% of a 16-row batch at 2,000 tokens) would count as a bent shape. Measuring
// the plain step's rise with the profile instead (tried 2026-11-29) read 0.000001-0.0004 per token: at 3,000 tokens,
// a level anywhere from 0.6 to 1.55 on the same machine
constexpr int shape_context_max = 512;
} // namespace

void AutoPolicy::set_verify_costs(const std::vector<double> & costs) {
    if (costs.empty() || !std::isfinite(costs[0]) || costs[0] <= 0.0) {
        throw InvalidArgument("verify costs need T(1) > 0 ms (costs[0]), got " +
                              (costs.empty() ? std::string("none") : std::to_string(costs[0])));
    }
    // the measured points (sizes with a finite cost > 0; 0 = not measured)
    std::vector<int> n_at;
    std::vector<double> t_at;
    for (int n = 1; n <= (int) costs.size() && n <= n_max + 1; ++n) {
        if (std::isfinite(costs[n - 1]) && costs[n - 1] > 0.0) {
            n_at.push_back(n);
            t_at.push_back(costs[n - 1]);
        }
    }
    // a batch is padded to the cheapest measured size at least as large (the engine decodes filler rows), so the
    // cost of n rows is the least measured cost of any size >= n: on a 2-core EPYC, T(13..15) = 151-166 ms but
    // T(16) = 135 (ggml's repacked GEMM takes rows in groups of 4, and 16 fill its tiles). A measured point that
    // is only noise (measured high) is padded past alike
    std::vector<int> pad_at(n_at);
    for (size_t i = t_at.size() - 1; i-- > 0;) {
        if (t_at[i + 1] < t_at[i]) {
            t_at[i] = t_at[i + 1];
            pad_at[i] = pad_at[i + 1];
        }
    }
    // beyond the last measured size: a least-squares line through all fitted points, slope >= 0 (one point:
    // linear in n, the pessimistic guess)
    double slope = t_at.back() / n_at.back();
    if (n_at.size() >= 2) {
        double mn = 0.0, mt = 0.0;
        for (size_t i = 0; i < n_at.size(); ++i) {
            mn += n_at[i];
            mt += t_at[i];
        }
        mn /= n_at.size();
        mt /= n_at.size();
        double cov = 0.0, var = 0.0;
        for (size_t i = 0; i < n_at.size(); ++i) {
            cov += (n_at[i] - mn) * (t_at[i] - mt);
            var += (n_at[i] - mn) * (n_at[i] - mn);
        }
        slope = std::max(0.0, var > 0.0 ? cov / var : 0.0);
    }
    plain_ratio_ = shape_ = 1.0; // batch_shape: against these costs
    n_plain_obs_ = n_shape_obs_ = 0;
    const auto before = t_verify_;
    for (int n = 1; n <= n_max + 1; ++n) {
        const auto hi = std::lower_bound(n_at.begin(), n_at.end(), n);
        const size_t i = (size_t) (hi - n_at.begin());
        pad_to_[n] = n;
        if (hi == n_at.end()) { // beyond the last measured size: the line, not padded
            t_verify_[n] = t_at.back() + slope * (n - n_at.back());
        } else { // measured, or padded to the next measured size (or a cheaper larger one)
            t_verify_[n] = t_at[i];
            pad_to_[n] = pad_at[i];
        }
    }
    // other costs than before (measured again: LLM.measure_costs): what the steps taught against the old ones is
    // void, the levels start again as at a load. The same costs set again (a drafter swapped in) keep them
    if (before[1] > 0.0 && before != t_verify_) {
        verify_scale_ = short_scale_ = batch_ratio_ = 1.0;
        n_scale_obs_ = n_short_obs_ = n_batch_obs_ = 0;
        own_ratio_.fill(0.0);
        n_own_.fill(0);
    }
}

int AutoPolicy::padded_rows(int n) const {
    return n >= 1 && n <= n_max + 1 ? pad_to_[n] : n;
}

std::vector<double> AutoPolicy::verify_costs() const {
    std::vector<double> out;
    for (int n = 1; n <= n_max + 1; ++n) {
        out.push_back(cost_verify(n));
    }
    return out;
}

double AutoPolicy::cost_verify(int n) const {
    // every cost is the profile's times the level, what the context adds included (a machine that runs slower now
    // runs its attention slower), so the choices do not depend on how fast the machine runs now: only on the
    // profile, and on the batch factors where they are learned
    return level() * (size_factor(decoded_rows(n)) * t_verify_[std::min(n, n_max + 1)] + context_extra(n));
}

double AutoPolicy::level() const {
    // a plain step, measured / profiled; before any was seen, what the batches cost against the profile (a machine
    // that runs slower now is slower at everything)
    return n_scale_obs_ > 0 ? verify_scale_ : n_batch_obs_ > 0 ? batch_ratio_ : 1.0;
}

double AutoPolicy::size_factor(int rows) const {
    // the batches' costs are kept against the profile (not against the plain step of their moment) and divided by
    // the level when used: a plain step that shows the machine 1.3 times as slow makes batches that cost 1.3 times
    // their profile cost what the profile says, at once. All sizes' factor leans on 1 (the profile) while it has
    // few observations, a size's own on all sizes'
    if (rows <= 1 || !learn_shape_) {
        return 1.0;
    }
    const double lvl = level();
    const double n_all = std::min(n_batch_obs_, size_own_max);
    const double all = (size_prior + n_all * batch_ratio_ / lvl) / (size_prior + n_all);
    const int m = std::min(rows, n_max + 1);
    const double own = std::min(n_own_[m], size_own_max);
    return (size_prior * all + own * own_ratio_[m] / lvl) / (size_prior + own);
}

void AutoPolicy::set_learn_batch_costs(bool on) {
    learn_shape_ = on;
    if (!on && draft_cost_held_) { // what the timing taught goes: the profile's cost again
        c_model_ = c_model_profiled_;
        c_catchup_ = 0.0;
    }
    own_ratio_.fill(0.0);
    n_own_.fill(0);
    batch_ratio_ = 1.0;
    n_batch_obs_ = 0;
}

void AutoPolicy::observe_cost(double verify_ms, int n_rows) {
    // the profile gives the shape of T(n) on a short context. A plain step's measured / profiled cost is the level,
    // which follows the context and the machine's speed. Where batch costs are learned, a batch's measured / profiled
    // cost (what its rows add with the context apart) against the level is its size's factor: on a 2-core EPYC a
    // profile taken at a quiet moment read T(5) = 2.7 T(1), and under load a batch of 5 cost 3.0-3.3 plain steps. A
    // step verified in chunks teaches only the factor over all sizes
    if (verify_ms <= 0.0 || n_rows <= 0) {
        return;
    }
    const double seen = std::max(0.1 * verify_ms, verify_ms - level() * context_rows(n_rows, last_first_));
    const double profiled = cost_rows(n_rows, last_first_);
    const bool short_context = n_past_ <= shape_context_max; // what the stale checks judge (step_level, the shape)
    if (short_context) {
        observe_shape(seen / profiled, n_rows);
    }
    if (n_rows == 1 || !learn_shape_) { // the profile's shape: one level from every step
        // a running mean from the first step on (the profile was measured at another moment), then an EMA
        const double w = std::max(ema_cost, 1.0 / ++n_scale_obs_);
        verify_scale_ = (1.0 - w) * verify_scale_ + w * (seen / profiled);
        if (short_context) {
            const double ws = std::max(ema_cost, 1.0 / ++n_short_obs_);
            short_scale_ = (1.0 - ws) * short_scale_ + ws * (seen / profiled);
        }
        return;
    }
    const double lvl = level(); // a step far off what it should cost (the process was preempted) is not a cost
    const double ratio = std::min(ratio_max * lvl, std::max(ratio_min * lvl, seen / profiled));
    const double wb = std::max(ema_shape, 1.0 / ++n_batch_obs_);
    batch_ratio_ = (1.0 - wb) * batch_ratio_ + wb * ratio;
    if (chunk_rows(0, n_rows, last_first_) == n_rows) { // one chunk
        const int m = std::min(decoded_rows(n_rows), n_max + 1);
        const double w = std::max(ema_shape, 1.0 / ++n_own_[m]);
        own_ratio_[m] = (1.0 - w) * own_ratio_[m] + w * ratio;
    }
}

void AutoPolicy::observe_shape(double ratio, int n_rows) {
    // a step far off its moment's plain steps (the process was preempted) counts as ratio_min or ratio_max of them
    if (n_rows == 1) {
        const double lo = ratio_min * plain_ratio_, hi = ratio_max * plain_ratio_;
        const double r = n_plain_obs_ == 0 ? ratio : std::min(hi, std::max(lo, ratio));
        const double w = std::max(ema_cost, 1.0 / ++n_plain_obs_);
        plain_ratio_ = (1.0 - w) * plain_ratio_ + w * r;
        return;
    }
    if (n_plain_obs_ == 0) { // no plain step of this moment to compare with yet
        return;
    }
    // ... and a batch far off the shape so far (preempted, or its moment's plain steps were) counts as shape_step x
    // it: one batch at 3 x cannot lift a quiet profile's 1.05 past profile.STALE_SHAPE (1.12), six in a row can
    const double r = std::min({ratio_max, shape_ * shape_step,
                               std::max({ratio_min, shape_ / shape_step, ratio / plain_ratio_})});
    const double w = std::max(ema_shape, 1.0 / ++n_shape_obs_);
    shape_ = (1.0 - w) * shape_ + w * r;
}

double AutoPolicy::context_extra(int n) const {
    return c_context_row_ * std::max(0, n - 1) * std::max(0, n_past_ - profile_context);
}

double AutoPolicy::cost_catchup(int lag) const {
    // id_last (and the last draft token) are decoded on every model step anyway: only a longer lag is extra
    const int extra = std::max(0, lag - 2);
    if (extra == 0) {
        return 0.0;
    }
    const double c = c_catchup_ > 0.0 ? c_catchup_ : 0.5 * (c_model_ > 0.0 ? c_model_ : 0.5 * t_verify_[1]);
    return level() * c * extra;
}

double AutoPolicy::cost_draft(int source, int k) const {
    if (source != 0) {
        // an n-gram lookup costs microseconds: ~0.03% of a plain step on a 2-core CPU. Relative to the step, so
        // that the choices follow the shape of the costs, not the machine's speed (a fixed 0.02 ms, the figure
        // before, weighed a draft against a tiny test model's 0.1 ms steps, and the choices moved with timing)
        return 0.0004 * k * cost_verify(1);
    }
    return level() * (c_model_ > 0.0 ? c_model_ : 0.5 * t_verify_[1]) * k;
}

int AutoPolicy::chunk_rows(int r0, int n_rows, int first) const {
    if (r0 == 0 && first > 0 && one_batch()) {
        return std::min(first, n_rows);
    }
    return one_batch() ? n_rows - r0 : std::min(verify_rows_, n_rows - r0);
}

double AutoPolicy::cost_rows(int n_rows, int first) const {
    double ms = 0.0;
    for (int r0 = 0; r0 < n_rows;) {
        const int n = chunk_rows(r0, n_rows, first);
        ms += t_verify_[std::min(n, n_max + 1)];
        r0 += n;
    }
    return ms;
}

double AutoPolicy::context_rows(int n_rows, int first) const {
    double ms = 0.0;
    for (int r0 = 0; r0 < n_rows;) {
        const int n = chunk_rows(r0, n_rows, first);
        ms += context_extra(n);
        r0 += n;
    }
    return ms;
}

} // namespace specllm
