// llama.cpp's CPU backend offers an AMX weight buffer (Intel Xeon 4th gen on, built with -march=native there).
// In llama.cpp as pinned (llama-cpp-python 0.3.36) its matmul loads the AMX tile configuration from a local struct
// through _tile_loadconfig, which GCC before 14 declares as reading 8 bytes of it: the optimizer drops the stores to
// the other 56, ldtilecfg reads stack garbage and faults (SIGSEGV in a compute thread; seen on an AMX Xeon VM on
// 2026-12-04 with GCC 12.2, llama.cpp issue 20824 with GCC 11.2; the same source built with clang, or with the 64
// bytes declared, runs). llama.cpp has no switch for the AMX buffer alone: weight repacking (use_extra_bufts) takes
// both, so where AMX is offered and the CPU backend was built by such a GCC, repacking is off (README Limits).
#pragma once

#include <string>

namespace specllm {

// whether models may load with weight repacking: true where the CPU backend does not list its "AMX" buffer type or
// was built by a compiler that keeps the tile configuration (amx_build_sound); SPECLLM_AMX=1 forces true, =0 false
// where AMX is offered. Decided once a process (the first call logs a warning when it is false)
bool weight_repacking_allowed();

// the compiler lines of the ELF .comment section of the library that holds llama.cpp's CPU backend, one per line
// ("GCC: (Debian 12.2.0-14) 12.2.0"); "" when it cannot be read
std::string cpu_backend_compilers();

// whether a CPU backend whose .comment reads `compilers` loads the AMX tile configuration as written: built by
// clang, or only by GCC 14 or later (whose _tile_loadconfig is a builtin that reads all 64 bytes). Unknown: false
bool amx_build_sound(const std::string & compilers);

} // namespace specllm
