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

Embedder::Embedder(const ModelOptions & opts)
    : own_model_(load_model(opts, "the embedding model ")), model_(own_model_.get()),
      vocab_(llama_model_get_vocab(model_)), path_(opts.path) {
    init_context(opts.n_ctx, opts.n_threads);
}

Embedder::~Embedder() {
    llama_batch_free(batch_);
}

void Embedder::init_context(int n_ctx, int n_threads) {
    encoder_only_ = llama_model_has_encoder(model_) && !llama_model_has_decoder(model_);
    if (llama_model_has_encoder(model_) && !encoder_only_) {
        throw InvalidArgument("'" + path_ + "' is an encoder-decoder model (T5-style): specllm embeds with a "
                              "decoder's or an encoder's own states, not a pair's; pass an embedding model");
    }
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    n_embd_ = llama_model_n_embd_out(model_);
    llama_context_params cparams = llama_context_default_params();
    cparams.embeddings = true;
    cparams.n_seq_max = max_seqs;
    cparams.kv_unified = true; // the sequences of a batch share the cache: each input may be as long as n_ctx
    cparams.n_threads = cparams.n_threads_batch = n_threads > 0 ? n_threads : default_threads();
    cparams.no_perf = true;
    auto create = [&](int limit, int rows, enum llama_pooling_type pooling) {
        cparams.n_ctx = (uint32_t) ((limit + 255) / 256 * 256);
        cparams.n_batch = cparams.n_ubatch = (uint32_t) std::min(rows, (int) cparams.n_ctx);
        cparams.pooling_type = pooling;
        ctx_.reset(llama_init_from_model(const_cast<llama_model *>(model_), cparams));
        if (!ctx_) {
            std::string why = log_take_errors();
            throw ModelLoadError("llama.cpp could not create an embedding context for '" + path_ + "' with n_ctx=" +
                                 std::to_string(limit) + " (out of memory? try a smaller n_ctx)" +
                                 (why.empty() ? "" : ": " + why));
        }
    };
    // a small context first, to read what the GGUF declares: its pooling (a generative model: none), whether it
    // attends both ways, whether it keeps a cache
    create(256, batch_rows, LLAMA_POOLING_TYPE_UNSPECIFIED);
    const enum llama_pooling_type kind = llama_pooling_type(ctx_.get());
    if (kind == LLAMA_POOLING_TYPE_RANK) {
        throw InvalidArgument("'" + path_ + "' is a reranking model (pooling type rank): it scores pairs of texts "
                              "and has no embeddings to serve; pass an embedding model");
    }
    const bool causal = llama_get_causal_attn(ctx_.get()) && llama_get_memory(ctx_.get()) != nullptr && !encoder_only_;
    const int n_train = llama_model_n_ctx_train(model_);
    ctx_.reset();
    if (causal && kind != LLAMA_POOLING_TYPE_CLS) {
        // a causal model with a cache: its hidden states decoded in batches of batch_rows (an input may be as long
        // as the context) and pooled here, the mean (none declared, or mean) or the last row's (last)
        pooling_ = kind == LLAMA_POOLING_TYPE_LAST ? Pooling::last : Pooling::mean;
        create(own_model_ && n_train > 0 ? std::min(n_ctx, n_train) : n_ctx, batch_rows, LLAMA_POOLING_TYPE_NONE);
        n_ctx_ = (int) llama_n_ctx(ctx_.get());
    } else {
        // both ways (BERT), no cache (an encoder), or CLS: the whole input in one batch, at most the length the
        // model was trained on (a position table ends there); pooled as declared by llama.cpp, none declared: the
        // mean here
        pooling_ = kind == LLAMA_POOLING_TYPE_NONE ? Pooling::mean : Pooling::model;
        n_ctx_ = n_train > 0 ? std::min(n_ctx, n_train) : n_ctx;
        create(n_ctx_, max_ctx, kind);
    }
    batch_ = llama_batch_init((int32_t) llama_n_batch(ctx_.get()), 0, 1);
}

std::string Embedder::pooling() const {
    switch (pooling_) {
        case Pooling::last: return "last";
        case Pooling::mean: return "mean";
        default: return llama_pooling_type(ctx_.get()) == LLAMA_POOLING_TYPE_CLS ? "cls"
                        : llama_pooling_type(ctx_.get()) == LLAMA_POOLING_TYPE_LAST ? "last" : "mean";
    }
}

std::string Embedder::description() const {
    return model_description(model_);
}

std::vector<llama_token> Embedder::tokenize(const std::string & text, bool add_special) const {
    return tokenize_text(vocab_, text, add_special, true);
}

void Embedder::decode(bool encode) {
    const int32_t rc = encode ? llama_encode(ctx_.get(), batch_) : llama_decode(ctx_.get(), batch_);
    if (rc != 0) {
        if (llama_get_memory(ctx_.get()) != nullptr) {
            llama_memory_clear(llama_get_memory(ctx_.get()), true);
        }
        std::string why = log_take_errors();
        throw DecodeError("llama.cpp failed to compute an embedding (code " + std::to_string(rc) + ")" +
                          (why.empty() ? "" : ": " + why));
    }
}

void Embedder::add_rows(const llama_token * tokens, int n, int pos0, int seq) {
    for (int j = 0; j < n; ++j) {
        const int r = batch_.n_tokens++;
        batch_.token[r] = tokens[j];
        batch_.pos[r] = pos0 + j;
        batch_.n_seq_id[r] = 1;
        batch_.seq_id[r][0] = seq;
        batch_.logits[r] = 1; // every row's hidden state is pooled
    }
}

void Embedder::check(const std::vector<llama_token> & tokens) const {
    if (tokens.empty()) {
        throw InvalidArgument("an empty input has no embedding: pass a text of at least one token");
    }
    for (llama_token t : tokens) {
        if (t < 0 || t >= n_vocab_) {
            throw InvalidArgument("input token " + std::to_string(t) + " is not in the embedding model's vocabulary "
                                  "(0.." + std::to_string(n_vocab_ - 1) + ")");
        }
    }
    if ((int) tokens.size() > n_ctx_) {
        throw ContextOverflowError("an input of " + std::to_string(tokens.size()) + " tokens is longer than the "
                                   "embedding context (" + std::to_string(n_ctx_) + " tokens): shorten it, or let "
                                   "it be truncated (truncate=True)");
    }
}

std::vector<std::vector<float>> Embedder::embed(const std::vector<std::vector<llama_token>> & inputs, bool normalize,
                                                const std::function<void()> & poll) {
    for (const auto & tokens : inputs) {
        check(tokens); // a bad input anywhere: nothing is decoded
    }
    llama_memory_t mem = llama_get_memory(ctx_.get()); // null: an encoder keeps no cache
    auto clear = [mem] {
        if (mem != nullptr) {
            llama_memory_clear(mem, true);
        }
    };
    const int cap = (int) llama_n_batch(ctx_.get());
    std::vector<std::vector<double>> sums(inputs.size(), std::vector<double>((size_t) n_embd_, 0.0));
    for (size_t i = 0; i < inputs.size();) {
        // consecutive inputs that fit one batch together share it, each its own sequence (a short input alone
        // leaves most of a batch's arithmetic unused); a longer one is decoded alone, in batches (pooled here)
        size_t end = i;
        int rows = 0;
        while (end < inputs.size() && end - i < (size_t) max_seqs && rows + (int) inputs[end].size() <= cap) {
            rows += (int) inputs[end++].size();
        }
        clear();
        if (end == i) { // pooled here (a model pooled by llama.cpp takes any input in one batch)
            const std::vector<llama_token> & tokens = inputs[i];
            const int n = (int) tokens.size();
            for (int i0 = 0; i0 < n; i0 += cap) {
                if (poll) {
                    poll(); // a throw leaves rows in the memory: the next pack clears it first
                }
                batch_.n_tokens = 0;
                add_rows(tokens.data() + i0, std::min(cap, n - i0), i0, 0);
                decode(false);
                if (pooling_ == Pooling::mean) {
                    accumulate(0, batch_.n_tokens, sums[i]);
                } else if (i0 + cap >= n) {
                    accumulate(batch_.n_tokens - 1, 1, sums[i]); // last: the input's last row
                }
            }
            ++i;
            continue;
        }
        if (poll) {
            poll();
        }
        batch_.n_tokens = 0;
        for (size_t k = i; k < end; ++k) {
            add_rows(inputs[k].data(), (int) inputs[k].size(), 0, (int) (k - i));
        }
        decode(encoder_only_);
        int row = 0;
        for (size_t k = i; k < end; ++k) {
            const int n = (int) inputs[k].size();
            if (pooling_ == Pooling::mean) {
                accumulate(row, n, sums[k]);
            } else if (pooling_ == Pooling::last) {
                accumulate(row + n - 1, 1, sums[k]);
            } else {
                const float * pooled = llama_get_embeddings_seq(ctx_.get(), (llama_seq_id) (k - i));
                if (pooled == nullptr) {
                    throw DecodeError("llama.cpp returned no pooled embedding for input " + std::to_string(k));
                }
                std::copy(pooled, pooled + n_embd_, sums[k].begin());
            }
            row += n;
        }
        i = end;
    }
    clear();
    std::vector<std::vector<float>> out;
    out.reserve(inputs.size());
    for (size_t k = 0; k < inputs.size(); ++k) {
        // pooled here: the sum over the input's rows, into their mean
        const double scale = pooling_ == Pooling::mean ? 1.0 / (double) inputs[k].size() : 1.0;
        out.push_back(finish(sums[k], scale, normalize));
    }
    return out;
}

void Embedder::accumulate(int row0, int n, std::vector<double> & sum) const {
    for (int r = row0; r < row0 + n; ++r) {
        const float * h = llama_get_embeddings_ith(ctx_.get(), r);
        if (h == nullptr) {
            throw DecodeError("llama.cpp returned no hidden state for row " + std::to_string(r));
        }
        for (int d = 0; d < n_embd_; ++d) {
            sum[(size_t) d] += h[d];
        }
    }
}

std::vector<float> Embedder::finish(const std::vector<double> & sum, double scale, bool normalize) const {
    double norm = 0.0;
    for (double v : sum) {
        if (!std::isfinite(v)) {
            throw DecodeError("the model computed a non-finite embedding: its weights or this build's kernels are "
                              "broken; try another quantization");
        }
        norm += v * scale * v * scale;
    }
    norm = std::sqrt(norm);
    const double k = normalize && norm > 0.0 ? scale / norm : scale;
    std::vector<float> out((size_t) n_embd_);
    for (int d = 0; d < n_embd_; ++d) {
        out[(size_t) d] = (float) (sum[(size_t) d] * k);
    }
    return out;
}

} // namespace specllm
