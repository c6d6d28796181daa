// Registers the bindings; each exposed class has its own file.
#include "bindings.h"

#include "specllm/amx.h"
#include "specllm/errors.h"
#include "specllm/threads.h"
#include "specllm/chat.h"
#include "specllm/grammar.h"
#include "specllm/model.h"
#include "specllm/prompt_store.h"

#include "llama.h"

#include <atomic>
#include <pthread.h>

namespace {
std::atomic<int> calls_inside{0};
std::atomic<bool> exiting{false};
unsigned long main_thread = 0;
} // namespace

int native_calls_inside() { return calls_inside.load(); }

CountedCall::CountedCall(bool may_refuse) {
    if (may_refuse && exiting.load() && PyThread_get_thread_ident() != main_thread) {
        throw specllm::Error("the interpreter is exiting: this LLM takes no more calls from other threads");
    }
    calls_inside.fetch_add(1);
}

CountedCall::~CountedCall() { calls_inside.fetch_sub(1); }

PYBIND11_MODULE(_core, m) {
    m.doc() = "specllm C++ core: speculative decoding over llama.cpp";
    m.attr("llama_cpp_version") = SPECLLM_LLAMA_CPP_VERSION;
    m.attr("cache_types") = py::cast(specllm::cache_type_names()); // the KV cache types (model.cpp's one list)
    // a child forked while another thread was inside a call has that thread's count but not the thread: none
    pthread_atfork(nullptr, nullptr, [] { calls_inside.store(0); });
    m.def("set_exiting", [](unsigned long main_ident) {
        main_thread = main_ident;
        exiting.store(true);
    }, py::arg("main_ident"), "the interpreter exits: later calls without the GIL from other threads are refused");
    m.def("native_calls_inside", &native_calls_inside,
          "how many threads are inside a call into llama.cpp made without the GIL (the exit waits for them)");
    m.def("supports_gpu_offload", &llama_supports_gpu_offload, "whether libllama was built with a GPU backend");
    m.def("release_compute_threads", &specllm::release_compute_threads,
          "release the calling thread's pool of CPU backend workers (OpenMP), as a thread done decoding for now "
          "should (threads.h); False where there is none to release it with");
    m.def("amx_offered", &specllm::amx_offered, "whether llama.cpp's CPU backend offers its AMX weight buffer");
    m.def("amx_rule", &specllm::amx_rule,
          "applies the AMX rule once a process (amx.h): AMX out of llama.cpp's extra buffer types where its build "
          "would crash, unless SPECLLM_AMX=1; whether AMX stays in use");
    m.def("drop_extra_buffer_type", &specllm::drop_extra_buffer_type, py::arg("name"),
          "removes a buffer type from the CPU backend's extra buffer types, for every model loaded after; the count");
    m.def("cpu_backend_compilers", &specllm::cpu_backend_compilers,
          "the compilers named in the .comment section of llama.cpp's CPU backend library, one per line");
    m.def("amx_build_sound", &specllm::amx_build_sound, py::arg("compilers"),
          "whether a CPU backend built by these compilers (.comment lines) loads its AMX tile configuration intact");
    m.def("prompt_store_identity", &specllm::prompt_store_identity, py::arg("model_path"), py::arg("options"),
          "the identity a model's prompt states are stored under (its size, its first MiB, the options given)");
    m.def("chat_template_known", &specllm::chat_template_known, py::arg("tmpl"),
          "whether llama.cpp's template matcher knows tmpl (a built-in name, or a template it recognizes)");
    m.def("gbnf_error", &specllm::gbnf_error, py::arg("gbnf"),
          "why gbnf is not a grammar with a root rule, read without a model; '' if it is (or names tokens)");
    register_errors(m);
    register_options(m);
    register_model(m);
    register_engine(m);
    register_policy(m);
    register_ngram(m);
    register_sampling(m);
    register_embed(m);
}
