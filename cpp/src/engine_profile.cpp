// Engine::profile_verify / profile_draft: the cost measurements the "auto" policy's profile is made of
// (python/specllm/profile.py caches them per model, machine and thread count).
#include "specllm/engine.h"

#include "specllm/clock.h"
#include "specllm/errors.h"

#include <algorithm>
#include <string>

namespace specllm {

std::vector<double> Engine::profile_verify(const std::vector<int> & sizes, int n_reps, int n_prefix) {
    std::lock_guard<std::mutex> lock(mutex_);
    active_ = false;
    target_->clear();
    if (n_prefix < 1) {
        throw InvalidArgument("profile context must be >= 1 token, got " + std::to_string(n_prefix));
    }
    int n_max = 0;
    for (int n : sizes) {
        if (n < 1) {
            throw InvalidArgument("profile batch sizes must be >= 1, got " + std::to_string(n));
        }
        if (n + n_prefix <= target_->n_ctx()) {
            n_max = std::max(n_max, n);
        }
    }
    std::vector<llama_token> toks((size_t) n_max + n_prefix,
                                  llama_vocab_bos(target_->vocab()) >= 0 ? llama_vocab_bos(target_->vocab()) : 0);
    target_->decode(toks.data(), n_prefix, false);
    auto time_rows = [&](int n) {
        const double t0 = now_ms();
        target_->decode(toks.data(), n, true);
        const double dt = now_ms() - t0;
        target_->truncate(n_prefix);
        return dt;
    };
    // each size n > 1 is timed right after a 1-row step and kept as T(n) / T(1) of that pair (median over the
    // rounds), times the least T(1) of all pairs: the least of 2 tries read T(1) ~20% dear on a 2-core EPYC (86-96
    // ms against 70-76 from ~44), so batches looked cheaper against a plain step than they are; pairing also keeps
    // a drift of the machine's speed between sizes out of the ratios. Rounds go over all sizes, so that a burst of
    // load reaches one round of each; round 0 warms up the small sizes only, a large one (> 8 rows) counts from
    // round 0 and skips the last round (n_reps rounds of each either way)
    std::vector<std::vector<double>> ratios((size_t) n_max);
    double t1_min = 0.0;
    const int n_rounds = 1 + std::max(1, n_reps);
    for (int r = 0; r < n_rounds; ++r) {
        for (int n : sizes) {
            const bool large = n > 8;
            if (n > n_max || (large && r == n_rounds - 1)) {
                continue;
            }
            if (interrupt_.load()) { // from another thread (a server's request came): the old costs stay
                target_->clear();
                history_.clear();
                throw Cancelled("the cost measurement was interrupted");
            }
            const double t1 = time_rows(1);
            const double tn = n > 1 ? time_rows(n) : t1;
            if (r > 0 || large) {
                t1_min = t1_min > 0.0 ? std::min(t1_min, t1) : t1;
                if (n > 1) {
                    ratios[(size_t) n - 1].push_back(tn / t1);
                }
            }
        }
    }
    std::vector<double> costs((size_t) n_max, 0.0); // 0 = not measured (the policy interpolates)
    if (n_max > 0) {
        costs[0] = t1_min; // timed with every size, asked for or not
    }
    for (int n = 2; n <= n_max; ++n) {
        std::vector<double> & rs = ratios[(size_t) n - 1];
        if (!rs.empty()) {
            std::sort(rs.begin(), rs.end());
            const size_t m = rs.size() / 2;
            costs[(size_t) n - 1] = t1_min * (rs.size() % 2 ? rs[m] : 0.5 * (rs[m - 1] + rs[m]));
        }
    }
    target_->clear();
    history_.clear();
    return costs;
}

double Engine::profile_draft(int n_reps) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!draft_model_) {
        return 0.0;
    }
    draft_model_->clear();
    std::vector<llama_token> toks(33, 0);
    draft_model_->decode(toks.data(), 32, false);
    double best = 1e30;
    for (int r = 0; r < n_reps + 1; ++r) {
        const double t0 = now_ms();
        draft_model_->decode(toks.data(), 1, false);
        const double dt = now_ms() - t0;
        draft_model_->truncate(32);
        if (r > 0) {
            best = std::min(best, dt);
        }
    }
    draft_model_->clear();
    return best;
}

} // namespace specllm
