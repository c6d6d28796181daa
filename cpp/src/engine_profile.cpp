// Engine::profile_verify / profile_draft: the cost measurements the "auto" policy's profile is made of
// (python/specllm/profile.py caches them per model, machine and thread count).
#include "specllm/engine.h"

#include "specllm/errors.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace specllm {

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

} // namespace

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
    std::vector<double> costs((size_t) n_max, 0.0); // 0 = not measured (the policy interpolates)
    // rounds over all sizes rather than size after size, so that a burst of load elsewhere on the machine does
    // not bend the curve's shape; the minimum over rounds is kept. Round 0 only warms up the small (cheap)
    // sizes; a large one counts from round 0 and skips the last round (n_reps runs either way)
    const int n_rounds = 1 + std::max(1, n_reps);
    for (int r = 0; r < n_rounds; ++r) {
        for (int n : sizes) {
            const bool large = n > 8;
            if (n > n_max || (large && r == n_rounds - 1)) {
                continue;
            }
            const double t0 = now_ms();
            target_->decode(toks.data(), n, true);
            const double dt = now_ms() - t0;
            target_->truncate(n_prefix);
            if (r > 0 || large) {
                double & c = costs[(size_t) n - 1];
                c = c > 0.0 ? std::min(c, dt) : dt;
            }
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
