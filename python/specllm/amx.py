"""llama.cpp's AMX weight buffer, as built by GCC before 14, crashes the process (cpp/include/specllm/amx.h; README
Limits). Where it would, specllm takes AMX out of the CPU backend's extra buffer types before its first model loads
(cpp/src/amx.cpp): every model of the process, llama-cpp-python's `Llama` too (the tests' and benchmarks' plain
llama.cpp), then loads with llama.cpp's other weight repacking and without AMX."""
from . import _core


def in_use() -> bool:
    """Whether models load into llama.cpp's AMX buffer: it is offered and its build is sound, or SPECLLM_AMX=1.
    Applies the rule (once a process) if no model has yet."""
    return _core.amx_rule()


def left_out() -> bool:
    """Whether llama.cpp offers AMX and the rule (or SPECLLM_AMX=0) leaves it out."""
    return _core.amx_offered() and not in_use()


def guard_llama_cpp_python() -> None:
    """Apply the rule before llama-cpp-python's `Llama` loads a model (idempotent): a `Llama` loaded first, where the
    build is unsound, would use AMX and crash."""
    in_use()
