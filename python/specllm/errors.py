"""specllm's exceptions. The C++ core raises these by name (see cpp/bindings/errors.cpp)."""


class SpecLLMError(Exception):
    """Base class of every error specllm raises on purpose."""


class ModelLoadError(SpecLLMError):
    """The model file is missing, not GGUF, corrupt or truncated, or of an unsupported architecture."""


class IncompatibleDraftError(SpecLLMError):
    """The draft model's vocabulary differs from the target's."""


class ContextOverflowError(SpecLLMError):
    """The prompt plus the requested generation does not fit in the context window (n_ctx)."""


class DecodeError(SpecLLMError):
    """llama.cpp failed to evaluate a batch, or the model computed NaN / +inf logits."""


class InvalidOptionError(SpecLLMError, ValueError):
    """An option has a value outside its range."""


class RegistryError(SpecLLMError):
    """A model name is unknown, or a model could not be fetched into the cache."""


class PullError(RegistryError):
    """Fetching a model failed (no source reachable, or the download did not verify)."""


class ListenError(SpecLLMError):
    """serve() cannot listen on its host and port (the port is taken, the host is not an address of this machine, a
    port below 1024 without the right): raised before the model is loaded."""


class Cancelled(SpecLLMError):
    """A generation was cancelled from another thread during prompt processing (Stream.cancel); streams turn it
    into a last chunk with finish_reason "cancelled". Also a cost measurement that was interrupted (LLM.measure_costs
    takes it as "not measured"; LLM(...) raises it when a stoppable_load's stop ended its load, costs.py)."""


class MemoryFileError(InvalidOptionError):
    """A drafting memory file (LLM.load_memory) that is not one, is damaged, or was saved for another vocabulary."""
