"""llama.cpp's AMX weight buffer, as built by GCC before 14, crashes the process (cpp/include/specllm/amx.h; README
Limits). specllm's own models load without weight repacking there (cpp/src/amx.cpp); this does the same for
llama-cpp-python's `Llama`, which the tests and benchmarks use as plain llama.cpp."""
from . import _core


def repacking_allowed() -> bool:
    """False where llama.cpp offers AMX from a build that would crash (SPECLLM_AMX=1/0 decide instead): the rule
    specllm's models load by (once a process)."""
    return _core.weight_repacking_allowed()


def guard_llama_cpp_python() -> None:
    """Make llama-cpp-python's `Llama` load without weight repacking where specllm does (idempotent)."""
    import llama_cpp.llama_cpp as raw  # the ctypes module llama_cpp.Llama calls at load

    if repacking_allowed() or getattr(raw, "_specllm_amx_guard", False):
        return
    defaults = raw.llama_model_default_params

    def without_repacking():
        params = defaults()
        params.use_extra_bufts = False
        return params

    raw.llama_model_default_params = without_repacking
    raw._specllm_amx_guard = True
