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
    return verify_scale_ * t_verify_[std::min(n, n_max + 1)] + context_extra(n);
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
    const double c = c_catchup_ > 0.0 ? c_catchup_ : 0.5 * (c_model_ > 0.0 ? c_model_ : 0.5 * cost_verify(1));
    return c * extra;
}

double AutoPolicy::cost_draft(int source, int k) const {
    if (source != 0) {
        // an n-gram lookup costs microseconds: ~0.03% of a plain step on a 2-core CPU. Relative to the step, so
        // that the choices follow the shape of the costs, not the machine's speed (a fixed 0.02 ms, the figure
        // before, weighed a draft against a tiny test model's 0.1 ms steps, and the choices moved with timing)
        return 0.0004 * k * cost_verify(1);
    }
    const double c = c_model_ > 0.0 ? c_model_ : 0.5 * t_verify_[1];
    return c * k;
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
