// llama.cpp's AMX weight buffer and the rule that keeps specllm's models out of it (specllm/amx.h).
#include "specllm/amx.h"

#include "specllm/log.h"

#include "llama.h"

#include <cstdlib>
#include <cstring>

namespace specllm {

namespace {

// whether the CPU backend lists llama.cpp's AMX buffer among its extra weight buffer types
bool cpu_offers_amx() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) {
        return false;
    }
    using get_extra_bufts_t = ggml_backend_buffer_type_t * (*)(ggml_backend_dev_t);
    auto get = (get_extra_bufts_t) ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu),
                                                                      "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get ? get(cpu) : nullptr; b && *b; ++b) {
        if (std::strcmp(ggml_backend_buft_name(*b), "AMX") == 0) {
            return true;
        }
    }
    return false;
}

} // namespace

bool weight_repacking_allowed() {
    static const bool allowed = [] {
        if (!cpu_offers_amx()) {
            return true;
        }
        const char * env = std::getenv("SPECLLM_AMX");
        if (env && std::strcmp(env, "1") == 0) {
            return true;
        }
        log_note(3, "weight repacking is off: llama.cpp would put the weights in its AMX buffer, whose matmul crashed "
                    "on an AMX Xeon (llama-cpp-python 0.3.36); SPECLLM_AMX=1 turns it on again");
        return false;
    }();
    return allowed;
}

} // namespace specllm
