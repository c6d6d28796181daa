// llama.cpp's CPU backend offers an AMX weight buffer (Intel Xeon 4th gen on, built with -march=native there).
// Its matmul crashed the process on the AMX Xeon VM of 2026-12-04 (SIGSEGV at ldtilecfg in a compute thread, plain
// llama-cpp-python 0.3.36 too, real and tiny models), while AMX itself worked there in a C test. llama.cpp has no
// switch for it alone: weight repacking (use_extra_bufts) takes both, so where AMX is offered repacking is off
// unless SPECLLM_AMX=1 asks for it (README Limits).
#pragma once

namespace specllm {

// whether models may load with weight repacking: false where the CPU backend lists its "AMX" buffer type, unless
// SPECLLM_AMX=1. Decided once a process (the first call logs a warning when it is false)
bool weight_repacking_allowed();

} // namespace specllm
