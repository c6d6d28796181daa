"""specllm: speculative decoding for GGUF models on your own device."""
from importlib import metadata as _metadata

from . import _core

try:
    _runtime = _metadata.version("llama-cpp-python")
except _metadata.PackageNotFoundError:  # pragma: no cover
    _runtime = None
if _runtime != _core.llama_cpp_version:
    raise ImportError(
        f"specllm was built against llama-cpp-python {_core.llama_cpp_version} but {_runtime} is installed; "
        f"reinstall one to match: pip install llama-cpp-python=={_core.llama_cpp_version} "
        "(or rebuild specllm: pip install --force-reinstall --no-deps specllm)")

from . import grammar  # noqa: E402
from .api import generate  # noqa: E402
from .errors import (  # noqa: E402
    ContextOverflowError, DecodeError, IncompatibleDraftError, InvalidOptionError, ListenError, MemoryFileError,
    ModelLoadError, PullError, RegistryError, SpecLLMError)
from .llm import LLM  # noqa: E402
from .results import Chunk, Completion, Stats, TokenLogprob  # noqa: E402
from .stream import Stream  # noqa: E402



def serve(llm, host: str = "127.0.0.1", port: int = 8000, **options) -> None:
    """Serve llm (an LLM, or a function that loads one) over the OpenAI HTTP API until Ctrl-C or SIGTERM.
    Needs the server extra (pip install "specllm[server]"); options: see specllm.server.serve / create_app."""
    from .server import serve as _serve
    _serve(llm, host=host, port=port, **options)


def __getattr__(name: str):
    """specllm.server (create_app, serve) on first use: `import specllm` stays free of FastAPI and uvicorn."""
    if name == "server":
        import importlib
        return importlib.import_module(".server", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = [
    "LLM", "generate", "serve", "Stream", "Completion", "Chunk", "Stats", "TokenLogprob",
    "SpecLLMError", "ModelLoadError", "IncompatibleDraftError",
    "ContextOverflowError", "DecodeError", "InvalidOptionError", "MemoryFileError", "RegistryError", "PullError",
    "ListenError",
]
