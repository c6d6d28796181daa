// A monotonic clock in milliseconds, for the engine's timings (Stats) and the costs "auto" learns from them.
#pragma once

#include <chrono>

namespace specllm {

inline double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

} // namespace specllm
