// llama.cpp's CPU backend offers an AMX weight buffer (Intel Xeon 4th gen on, built with -march=native there).
// In llama.cpp as pinned (llama-cpp-python 0.3.36) its matmul loads the AMX tile configuration from a local struct
// through _tile_loadconfig, which GCC before 14 declares as reading 8 bytes of it: the optimizer drops the stores to
// the other 56, ldtilecfg reads stack garbage and faults (SIGSEGV in a compute thread; seen on an AMX Xeon VM on
// 2026-12-04 with GCC 12.2, llama.cpp issue 20824 with GCC 11.2; the same source built with clang, or with the 64
// bytes declared, runs). llama.cpp has no switch for the AMX buffer alone (use_extra_bufts takes AMX and the CPU
// repacking together), so where AMX is offered and the CPU backend was built by such a GCC, specllm takes AMX out of
// the CPU backend's list of extra buffer types, which llama.cpp reads at every model load: weights go to the CPU
// repacking buffer (its AVX-512 kernels) instead, for every model of the process (README Limits).
#pragma once

#include <string>

namespace specllm {

// whether llama.cpp's CPU backend offers its "AMX" weight buffer (read before amx_rule takes it out)
bool amx_offered();

// applies the rule once a process, before any model loads (load_model calls it; so does specllm.amx for
// llama-cpp-python's Llama): where AMX is offered and its build is not sound (amx_build_sound), or SPECLLM_AMX=0,
// AMX is taken out of the extra buffer types (a warning on the first call unless SPECLLM_AMX=0 asked for it);
// SPECLLM_AMX=1 keeps it. Returns whether AMX stays in use (false where it is not offered)
bool amx_rule();

// removes every buffer type called `name` from the null-terminated list the CPU backend gives llama.cpp
// (ggml_backend_dev_get_extra_bufts), in place; the number removed. Models loaded before keep their buffers
int drop_extra_buffer_type(const std::string & name);

// the compiler lines of the ELF .comment section of the library that holds llama.cpp's CPU backend, one per line
// ("GCC: (Debian 12.2.0-14) 12.2.0"); "" when it cannot be read
std::string cpu_backend_compilers();

// whether a CPU backend whose .comment reads `compilers` loads the AMX tile configuration as written: built by
// clang, or only by GCC 14 or later (whose _tile_loadconfig is a builtin that reads all 64 bytes). Unknown: false
bool amx_build_sound(const std::string & compilers);

} // namespace specllm
