#include "specllm/embed.h"

#include "specllm/errors.h"
#include "specllm/log.h"

#include <algorithm>
#include <cmath>

namespace specllm {

Embedder::Embedder(const Model & target, int n_ctx, int n_threads)
    : model_(target.weights()), vocab_(target.vocab()), path_(target.options().path) {
    init_context(n_ctx, n_threads);
}

Embedder::Embedder(const ModelOptions & opts) : path_(opts.path) {
    log_capture_install();
    if (opts.n_ctx < 16 || opts.n_ctx > max_ctx) {
        throw InvalidArgument("n_ctx must be between 16 and " + std::to_string(max_ctx) + ", got " +
                              std::to_string(opts.n_ctx));
    }
    if (opts.n_threads < 0 || opts.n_threads > max_threads) {
        throw InvalidArgument("n_threads must be between 0 (all cores) and " + std::to_string(max_threads) +
                              ", got " + std::to_string(opts.n_threads));
    }
    check_gguf_file(opts.path);
    log_take_errors();
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = opts.n_gpu_layers;
    own_model_.reset(llama_model_load_from_file(opts.path.c_str(), mparams));
    if (!own_model_) {
        std::string why = log_take_errors();
        throw ModelLoadError("llama.cpp could not load the embedding model '" + opts.path + "' (corrupt, truncated, "
                             "or an unsupported architecture)" + (why.empty() ? "" : ": " + why));
    }
    model_ = own_model_.get();
    vocab_ = llama_model_get_vocab(model_);
    if (llama_vocab_type(vocab_) == LLAMA_VOCAB_TYPE_NONE || llama_vocab_n_tokens(vocab_) <= 0) {
        throw ModelLoadError("'" + opts.path + "' has no tokenizer (vocabulary type none): an embedding model needs "
                             "one to read text");
    }
    init_context(opts.n_ctx, opts.n_threads);
}

Embedder::~Embedder() {
    llama_batch_free(batch_);
}

void Embedder::init_context(int n_ctx, int n_threads) {
    if (llama_model_has_encoder(model_) && llama_model_has_decoder(model_)) {
        throw InvalidArgument("'" + path_ + "' is an encoder-decoder model (T5-style): specllm embeds with a "
                              "decoder's or an encoder's own states, not a pair's; pass an embedding model");
    }
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    n_embd_ = llama_model_n_embd_out(model_);
    llama_context_params cparams = llama_context_default_params();
    cparams.embeddings = true;
    cparams.pooling_type = LLAMA_POOLING_TYPE_UNSPECIFIED; // the GGUF's (a generative model's: none)
    cparams.n_seq_max = 1;
    cparams.n_threads = cparams.n_threads_batch = n_threads > 0 ? n_threads : default_threads();
    cparams.no_perf = true;
    auto create = [&](int limit, int rows) {
        cparams.n_ctx = (uint32_t) ((limit + 255) / 256 * 256);
        cparams.n_batch = cparams.n_ubatch = (uint32_t) std::min(rows, (int) cparams.n_ctx);
        ctx_.reset(llama_init_from_model(const_cast<llama_model *>(model_), cparams));
        if (!ctx_) {
            std::string why = log_take_errors();
            throw ModelLoadError("llama.cpp could not create an embedding context for '" + path_ + "' with n_ctx=" +
                                 std::to_string(limit) + " (out of memory? try a smaller n_ctx)" +
                                 (why.empty() ? "" : ": " + why));
        }
    };
    create(n_ctx, batch_rows);
    const enum llama_pooling_type kind = llama_pooling_type(ctx_.get());
    if (kind == LLAMA_POOLING_TYPE_RANK) {
        throw InvalidArgument("'" + path_ + "' is a reranking model (pooling type rank): it scores pairs of texts "
                              "and has no embeddings to serve; pass an embedding model");
    }
    pool_here_ = kind == LLAMA_POOLING_TYPE_NONE;
    n_ctx_ = (int) llama_n_ctx(ctx_.get());
    if (!pool_here_) {
        // the model's own pooling needs the whole input in one batch (llama.cpp pools per batch, and an encoder
        // attends both ways): one batch as long as the context, at most what the model was trained on
        const int n_train = llama_model_n_ctx_train(model_);
        n_ctx_ = n_train > 0 ? std::min(n_ctx, n_train) : n_ctx;
        ctx_.reset();
        create(n_ctx_, max_ctx);
    }
    batch_ = llama_batch_init((int32_t) llama_n_batch(ctx_.get()), 0, 1);
}

std::string Embedder::pooling() const {
    switch (llama_pooling_type(ctx_.get())) {
        case LLAMA_POOLING_TYPE_CLS: return "cls";
        case LLAMA_POOLING_TYPE_LAST: return "last";
        default: return "mean";
    }
}

std::string Embedder::description() const {
    char buf[256];
    int n = llama_model_desc(model_, buf, sizeof(buf));
    return n > 0 ? std::string(buf, std::min<size_t>((size_t) n, sizeof(buf) - 1)) : std::string();
}

std::vector<llama_token> Embedder::tokenize(const std::string & text) const {
    return tokenize_text(vocab_, text, true, true);
}

void Embedder::decode_rows(const llama_token * tokens, int n, int pos0, bool encode) {
    batch_.n_tokens = n;
    for (int j = 0; j < n; ++j) {
        batch_.token[j] = tokens[j];
        batch_.pos[j] = pos0 + j;
        batch_.n_seq_id[j] = 1;
        batch_.seq_id[j][0] = 0;
        batch_.logits[j] = 1; // every row's hidden state is pooled
    }
    const int32_t rc = encode ? llama_encode(ctx_.get(), batch_) : llama_decode(ctx_.get(), batch_);
    if (rc != 0) {
        llama_memory_clear(llama_get_memory(ctx_.get()), true);
        std::string why = log_take_errors();
        throw DecodeError("llama.cpp failed to compute an embedding (code " + std::to_string(rc) + ")" +
                          (why.empty() ? "" : ": " + why));
    }
}

std::vector<float> Embedder::embed(const std::vector<llama_token> & tokens, bool normalize,
                                   const std::function<void()> & poll) {
    const int n = (int) tokens.size();
    if (n == 0) {
        throw InvalidArgument("an empty input has no embedding: pass a text of at least one token");
    }
    for (llama_token t : tokens) {
        if (t < 0 || t >= n_vocab_) {
            throw InvalidArgument("input token " + std::to_string(t) + " is not in the embedding model's vocabulary "
                                  "(0.." + std::to_string(n_vocab_ - 1) + ")");
        }
    }
    if (n > n_ctx_) {
        throw ContextOverflowError("an input of " + std::to_string(n) + " tokens is longer than the embedding "
                                   "context (" + std::to_string(n_ctx_) + " tokens): shorten it, or let it be "
                                   "truncated (truncate=True)");
    }
    llama_memory_t mem = llama_get_memory(ctx_.get());
    llama_memory_clear(mem, true);
    std::vector<double> sum((size_t) n_embd_, 0.0);
    const float * pooled = nullptr;
    if (pool_here_) {
        for (int i0 = 0; i0 < n; i0 += batch_rows) {
            if (poll) {
                poll(); // a throw leaves rows in the memory: the next embed() clears it first
            }
            const int rows = std::min(batch_rows, n - i0);
            decode_rows(tokens.data() + i0, rows, i0, false);
            for (int j = 0; j < rows; ++j) {
                const float * row = llama_get_embeddings_ith(ctx_.get(), j);
                if (row == nullptr) {
                    throw DecodeError("llama.cpp returned no hidden state for row " + std::to_string(j));
                }
                for (int d = 0; d < n_embd_; ++d) {
                    sum[(size_t) d] += row[d];
                }
            }
        }
        for (double & v : sum) {
            v /= n;
        }
    } else {
        if (poll) {
            poll();
        }
        const bool encoder_only = llama_model_has_encoder(model_) && !llama_model_has_decoder(model_);
        decode_rows(tokens.data(), n, 0, encoder_only);
        pooled = llama_get_embeddings_seq(ctx_.get(), 0);
        if (pooled == nullptr) {
            throw DecodeError("llama.cpp returned no pooled embedding for the input");
        }
        for (int d = 0; d < n_embd_; ++d) {
            sum[(size_t) d] = pooled[d];
        }
    }
    llama_memory_clear(mem, true);
    double norm = 0.0;
    for (double v : sum) {
        if (!std::isfinite(v)) {
            throw DecodeError("the model computed a non-finite embedding: its weights or this build's kernels are "
                              "broken; try another quantization");
        }
        norm += v * v;
    }
    norm = std::sqrt(norm);
    std::vector<float> out((size_t) n_embd_);
    for (int d = 0; d < n_embd_; ++d) {
        out[(size_t) d] = (float) (normalize && norm > 0.0 ? sum[(size_t) d] / norm : sum[(size_t) d]);
    }
    return out;
}

} // namespace specllm
