"""llama.cpp's AMX weight buffer (CPUs with AMX, llama-cpp-python built there) crashed the process on an AMX Xeon VM
(2026-12-04; README Limits). specllm's own models load without weight repacking there (cpp/src/model.cpp); this
does the same for llama-cpp-python's `Llama`, which the tests and benchmarks use as plain llama.cpp."""
import functools
import os


@functools.lru_cache(maxsize=None)
def amx_offered() -> bool:
    """Whether llama.cpp's CPU backend was built with AMX (it then puts the weights of the types it can in AMX)."""
    import llama_cpp

    return "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode(errors="replace")


def repacking_allowed() -> bool:
    """False where llama.cpp offers AMX, unless SPECLLM_AMX=1 (the rule cpp/src/model.cpp follows)."""
    return os.environ.get("SPECLLM_AMX") == "1" or not amx_offered()


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
