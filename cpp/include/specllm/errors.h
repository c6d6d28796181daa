// Typed errors of the specllm core. llama.cpp's codes and NULLs are translated into these once, at the
// boundary; the bindings map each class to a Python exception of the same name.
#pragma once

#include <stdexcept>
#include <string>

namespace specllm {

// base of every error the core raises on purpose
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// the model file is missing, not a GGUF file, truncated, or of an architecture llama.cpp cannot load
struct ModelLoadError : Error {
    using Error::Error;
};

// the draft model's vocabulary differs from the target's
struct IncompatibleDraftError : Error {
    using Error::Error;
};

// the prompt plus the requested generation does not fit in the context window
struct ContextOverflowError : Error {
    using Error::Error;
};

// an option has a value outside its range (maps to Python's ValueError)
struct InvalidArgument : Error {
    using Error::Error;
};

// the generation was interrupted from another thread (Engine::interrupt) during prompt processing
struct Cancelled : Error {
    using Error::Error;
};

// llama_decode failed for a reason other than a full context
struct DecodeError : Error {
    using Error::Error;
};

} // namespace specllm
