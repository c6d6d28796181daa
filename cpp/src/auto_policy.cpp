#include "specllm/auto_policy.h"

#include <algorithm>
#include <cmath>

namespace specllm {

namespace {
constexpr double ema = 0.15;         // weight of a new observation
constexpr int explore_every = 16;    // steps without drafting after which a source is tried with k = 1
constexpr double alpha_prior_model = 0.6;
constexpr double alpha_prior_ngram[3] = {0.3, 0.5, 0.7}; // by match bucket
} // namespace

AutoPolicy::AutoPolicy() {
    for (int n = 0; n < n_max + 2; ++n) {
        t_verify_[n] = n == 0 ? 0.0 : 1.0 * n; // placeholder: linear (no speedup) until profiled
    }
    for (int s = 0; s < n_sources; ++s) {
        const double prior = s == 0 ? alpha_prior_model : alpha_prior_ngram[s - 1];
        alpha_[s].fill(prior);
    }
}

int AutoPolicy::source_of(bool ngram, int match) {
    if (!ngram) {
        return 0;
    }
    return match <= 2 ? 1 : (match == 3 ? 2 : 3);
}

void AutoPolicy::set_verify_costs(const std::vector<double> & costs) {
    if (costs.empty()) {
        return;
    }
    // known points, then linear interpolation / extrapolation with the last slope
    std::vector<int> known;
    for (int n = 1; n <= (int) costs.size() && n <= n_max + 1; ++n) {
        if (costs[n - 1] > 0.0) {
            t_verify_[n] = costs[n - 1];
            known.push_back(n);
        }
    }
    if (known.empty()) {
        return;
    }
    for (int n = 1; n <= n_max + 1; ++n) {
        auto hi = std::lower_bound(known.begin(), known.end(), n);
        if (hi != known.end() && *hi == n) {
            continue;
        }
        if (hi == known.begin()) {
            t_verify_[n] = t_verify_[known.front()];
        } else if (hi == known.end()) {
            const int a = known.size() >= 2 ? known[known.size() - 2] : known.back();
            const int b = known.back();
            const double slope = b > a ? (t_verify_[b] - t_verify_[a]) / (b - a) : t_verify_[b] / b;
            t_verify_[n] = t_verify_[b] + slope * (n - b);
        } else {
            const int a = *(hi - 1), b = *hi;
            t_verify_[n] = t_verify_[a] + (t_verify_[b] - t_verify_[a]) * (n - a) / (double) (b - a);
        }
    }
}

std::vector<double> AutoPolicy::verify_costs() const {
    return std::vector<double>(t_verify_.begin() + 1, t_verify_.end());
}

double AutoPolicy::cost_verify(int n) const {
    return t_verify_[std::min(n, n_max + 1)];
}

double AutoPolicy::cost_draft(int source, int k) const {
    if (source != 0) {
        return 0.02 * k; // an n-gram lookup costs microseconds
    }
    const double c = c_model_ > 0.0 ? c_model_ : 0.5 * t_verify_[1];
    return c * k;
}

double AutoPolicy::expected_rate(int source, int k, double c_draft_ms) const {
    double e = 1.0, run = 1.0;
    for (int j = 0; j < k; ++j) {
        run *= alpha_[source][j];
        e += run;
    }
    return e / (c_draft_ms + cost_verify(k + 1));
}

Choice AutoPolicy::choose(const StepContext & ctx) {
    Choice best;
    double best_rate = 1.0 / cost_verify(1);
    const int k_cap = std::min({ctx.k_max, k_limit_, n_max});
    int explore = -1;
    for (int s = 0; s < n_sources; ++s) {
        const bool usable = s == 0 ? ctx.has_model : (ctx.has_ngram && source_of(true, ctx.ngram_match) == s &&
                                                      ctx.ngram_match > 0);
        if (!usable) {
            continue;
        }
        for (int k = 1; k <= k_cap; ++k) {
            const double rate = expected_rate(s, k, cost_draft(s, k));
            if (rate > best_rate) {
                best_rate = rate;
                best.k = k;
                best.ngram = s != 0;
            }
        }
        if (++since_tried_[s] > explore_every && k_cap > 0) {
            explore = s;
        }
    }
    if (best.k == 0 && explore >= 0) {
        best.k = 1;
        best.ngram = explore != 0;
    }
    last_source_ = source_of(best.ngram, ctx.ngram_match);
    last_k_ = best.k;
    if (best.k > 0) {
        since_tried_[last_source_] = 0;
    }
    return best;
}

void AutoPolicy::update(const StepOutcome & o) {
    const int n = o.n_drafted + 1;
    if (n <= n_max + 1 && o.verify_ms > 0.0) {
        t_verify_[n] = (1.0 - ema) * t_verify_[n] + ema * o.verify_ms;
    }
    if (o.n_drafted == 0) {
        return;
    }
    const int s = o.from_ngram ? last_source_ : 0;
    if (s == 0 && o.draft_ms > 0.0) {
        const double per_token = o.draft_ms / o.n_drafted;
        c_model_ = c_model_ > 0.0 ? (1.0 - ema) * c_model_ + ema * per_token : per_token;
    }
    for (int j = 0; j < o.n_drafted && j <= o.n_accepted; ++j) {
        const double seen = j < o.n_accepted ? 1.0 : 0.0;
        alpha_[s][j] = (1.0 - ema) * alpha_[s][j] + ema * seen;
    }
}

} // namespace specllm
