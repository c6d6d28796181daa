// Loading a model: the GGUF pre-check, the KV cache type names, llama.cpp's load with its errors turned into
// typed ones, and the check that a draft model shares the target's vocabulary. The Model's operations (tokenize,
// KV cache cuts and shifts, decode, logits) are in model.cpp.
#include "specllm/model.h"

#include "specllm/amx.h"
#include "specllm/errors.h"
#include "specllm/log.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sys/stat.h>
#include <thread>

namespace specllm {

// checks llama.cpp does not make (or makes with a crash or an unclear message)
void check_gguf_file(const std::string & path) {
    struct stat st {};
    if (path.empty()) {
        throw ModelLoadError("model path is empty: pass the path of a .gguf file");
    }
    if (stat(path.c_str(), &st) != 0) {
        if (errno != ENOENT && errno != ENOTDIR) { // a folder on the way that cannot be searched: not "not found"
            throw ModelLoadError("cannot read the model file '" + path + "': " + std::strerror(errno) +
                                 "; check its permissions");
        }
        throw ModelLoadError("model file not found: '" + path + "'; check the path, or use a registry name");
    }
    if (S_ISDIR(st.st_mode)) {
        throw ModelLoadError("model path is a directory: '" + path + "'; pass the .gguf file inside it");
    }
    if (!S_ISREG(st.st_mode)) { // a FIFO's open waits for a writer for ever; a device read as "empty"
        throw ModelLoadError("the model path '" + path + "' is not a regular file (a pipe, a device, ...); pass a "
                             ".gguf file");
    }
    if (st.st_size == 0) {
        throw ModelLoadError("model file is empty: '" + path + "'; the download or copy was interrupted, fetch it again");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in.is_open()) {
        throw ModelLoadError("cannot read the model file '" + path + "': " + std::strerror(errno) +
                             "; check its permissions");
    }
    char magic[4] = {0, 0, 0, 0};
    in.read(magic, 4);
    if (!in || std::memcmp(magic, "GGUF", 4) != 0) {
        throw ModelLoadError("not a GGUF file: '" + path + "' does not start with the GGUF magic; "
                             "convert the model with llama.cpp's convert_hf_to_gguf.py or download a .gguf");
    }
}

namespace {

// llama-server's --cache-type-k/-v names
const std::pair<const char *, ggml_type> cache_types[] = {
    {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16}, {"f32", GGML_TYPE_F32},       {"q8_0", GGML_TYPE_Q8_0},
    {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1}, {"q5_0", GGML_TYPE_Q5_0},     {"q5_1", GGML_TYPE_Q5_1},
    {"iq4_nl", GGML_TYPE_IQ4_NL},
};

bool is_float_cache(const std::string & name) {
    return name == "f16" || name == "bf16" || name == "f32";
}

} // namespace

std::vector<std::string> cache_type_names() {
    std::vector<std::string> names;
    for (const auto & entry : cache_types) {
        names.emplace_back(entry.first);
    }
    return names;
}

ggml_type cache_type(const std::string & name, const char * which) {
    std::string known;
    for (const auto & [n, type] : cache_types) {
        if (name == n) {
            return type;
        }
        known += std::string(known.empty() ? "" : ", ") + n;
    }
    throw InvalidArgument(std::string(which) + " must be one of " + known + ", got '" + name + "'");
}

int default_threads() {
    unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 4 : (int) n;
}

llama_model_ptr load_model(const ModelOptions & opts, const std::string & what) {
    log_capture_install();
    if (opts.n_ctx < 16 || opts.n_ctx > max_ctx) {
        throw InvalidArgument("n_ctx must be between 16 and " + std::to_string(max_ctx) + ", got " +
                              std::to_string(opts.n_ctx));
    }
    if (opts.n_threads < 0 || opts.n_threads > max_threads) {
        throw InvalidArgument("n_threads must be between 0 (all cores) and " + std::to_string(max_threads) +
                              ", got " + std::to_string(opts.n_threads));
    }
    if (opts.n_batch < 1) {
        throw InvalidArgument("n_batch must be >= 1, got " + std::to_string(opts.n_batch));
    }
    cache_type(opts.cache_type_k, "cache_type_k");
    cache_type(opts.cache_type_v, "cache_type_v");
    if (opts.flash_attn < -1 || opts.flash_attn > 1) {
        throw InvalidArgument("flash_attn must be -1 (auto), 0 (off) or 1 (on), got " + std::to_string(opts.flash_attn));
    }
    if (opts.flash_attn == 0 && !is_float_cache(opts.cache_type_v)) {
        throw InvalidArgument("a quantized V cache (cache_type_v " + opts.cache_type_v + ") needs flash attention: "
                              "set flash_attn to auto or on, or cache_type_v to f16");
    }
    check_gguf_file(opts.path);
    log_take_errors();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = opts.n_gpu_layers;
    mparams.use_extra_bufts = opts.repack;
    amx_rule(); // before the first load: AMX out of the extra buffer types where its build crashes
    llama_model_ptr model(llama_model_load_from_file(opts.path.c_str(), mparams));
    if (!model) {
        std::string why = log_take_errors();
        throw ModelLoadError("llama.cpp could not load " + what + "'" + opts.path + "' (corrupt, truncated, or an "
                             "unsupported architecture)" + (why.empty() ? "" : ": " + why));
    }
    const llama_vocab * vocab = llama_model_get_vocab(model.get());
    if (llama_vocab_type(vocab) == LLAMA_VOCAB_TYPE_NONE || llama_vocab_n_tokens(vocab) <= 0) {
        throw ModelLoadError("'" + opts.path + "' has no tokenizer (vocabulary type none): specllm reads and writes "
                             "text and needs one; convert the model with its tokenizer");
    }
    return model;
}

std::string model_description(const llama_model * model) {
    char buf[256];
    int n = llama_model_desc(model, buf, sizeof(buf));
    return n > 0 ? std::string(buf, std::min<size_t>((size_t) n, sizeof(buf) - 1)) : std::string();
}

void check_same_vocab(const Model & target, const Model & draft) {
    const llama_vocab * vt = target.vocab();
    const llama_vocab * vd = draft.vocab();
    auto fail = [&](const std::string & what) {
        throw IncompatibleDraftError("the draft model's vocabulary differs from the target's: " + what +
                                     "; use a draft model of the same family (same tokenizer), or draft=\"ngram\"");
    };
    if (llama_vocab_type(vt) != llama_vocab_type(vd)) {
        fail("tokenizer type " + std::to_string(llama_vocab_type(vd)) + " vs " + std::to_string(llama_vocab_type(vt)));
    }
    // sizes may differ by padding at the end (Qwen2.5-7B and larger pad 151936 to 152064), as llama.cpp allows
    const int n_t = llama_vocab_n_tokens(vt);
    const int n_d = llama_vocab_n_tokens(vd);
    if (std::abs(n_t - n_d) > max_vocab_size_difference) {
        fail("size " + std::to_string(n_d) + " vs " + std::to_string(n_t) + " (at most " +
             std::to_string(max_vocab_size_difference) + " padded entries may differ)");
    }
    const int n_shared = std::min(n_t, n_d);
    struct Special {
        const char * name;
        llama_token (*get)(const llama_vocab *);
    };
    const Special specials[] = {{"bos", llama_vocab_bos}, {"eos", llama_vocab_eos}, {"eot", llama_vocab_eot}};
    for (const auto & s : specials) {
        if (s.get(vt) != s.get(vd)) {
            fail(std::string(s.name) + " token " + std::to_string(s.get(vd)) + " vs " + std::to_string(s.get(vt)));
        }
    }
    if (llama_vocab_get_add_bos(vt) != llama_vocab_get_add_bos(vd)) {
        fail("add_bos differs");
    }
    for (llama_token id = 0; id < n_shared; ++id) {
        const char * a = llama_vocab_get_text(vt, id);
        const char * b = llama_vocab_get_text(vd, id);
        if (std::strcmp(a ? a : "", b ? b : "") != 0) {
            fail("token " + std::to_string(id) + " is '" + std::string(b ? b : "") + "' in the draft and '" +
                 std::string(a ? a : "") + "' in the target");
        }
    }
}

} // namespace specllm
