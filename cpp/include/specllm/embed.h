// Embeddings: one vector per input text, as /v1/embeddings and Ollama's /api/embed serve them.
//
// An Embedder is a llama_context of its own with embeddings on, so that embedding a text never touches the
// conversation's KV cache: over the target's weights (Embedder(const Model &, ...): no second copy in memory) or
// over an embedding model's GGUF (Embedder(const ModelOptions &)). A causal model with a KV cache (a generative
// model; Qwen3-Embedding-style models) is decoded in batches of batch_rows, so an input may be as long as the
// context, and pooled here as its GGUF declares: the mean of the last layer's hidden states over the input's tokens
// (declared mean, or none declared: a generative model) or the last token's. A model that attends both ways (BERT),
// keeps no cache (an encoder) or declares CLS pooling takes each input whole in one batch, at most its training
// context, pooled by llama.cpp as declared (none declared: the mean here), as llama-server does.
#pragma once

#include "specllm/model.h"
#include "specllm/options.h"

#include "llama-cpp.h"

#include <functional>
#include <string>
#include <vector>

namespace specllm {

class Embedder {
  public:
    static constexpr int batch_rows = 64; // rows per decode when pooling here: 39 MB of logits for Qwen2.5
    static constexpr int max_seqs = 16;   // inputs sharing one decode batch

    // over the target's weights; n_ctx: the longest input in tokens
    Embedder(const Model & target, int n_ctx, int n_threads);
    // a model of its own (throws ModelLoadError; InvalidArgument for a reranking model)
    explicit Embedder(const ModelOptions & opts);
    ~Embedder();
    Embedder(const Embedder &) = delete;
    Embedder & operator=(const Embedder &) = delete;

    int n_embd() const { return n_embd_; }
    int n_ctx() const { return n_ctx_; }
    std::string pooling() const; // "mean", "cls" or "last"
    std::string description() const;
    const std::string & path() const { return path_; }

    // the text's tokens, with the model's special tokens (BOS, CLS/SEP, EOS as it adds them) if add_special
    std::vector<llama_token> tokenize(const std::string & text, bool add_special = true) const;
    // each input's vector, in order (L2-normalized if normalize). Consecutive inputs that fit one batch together
    // are decoded in one, each its own sequence (up to max_seqs). Throws InvalidArgument (an empty input, a token
    // outside the vocabulary), ContextOverflowError (an input longer than n_ctx()) before decoding anything;
    // DecodeError. poll runs before every decode batch and may throw to abandon the call (a stop from another
    // thread, Ctrl-C)
    std::vector<std::vector<float>> embed(const std::vector<std::vector<llama_token>> & inputs, bool normalize,
                                          const std::function<void()> & poll = {});

  private:
    void init_context(int n_ctx, int n_threads);
    void check(const std::vector<llama_token> & tokens) const;
    void add_rows(const llama_token * tokens, int n, int pos0, int seq); // to batch_
    void decode(bool encode);                                             // batch_
    void accumulate(int row0, int n, std::vector<double> & sum) const;   // rows' hidden states into sum
    std::vector<float> finish(const std::vector<double> & sum, double scale, bool normalize) const;

    llama_model_ptr own_model_;         // an embedding model of its own (none: the target's weights)
    const llama_model * model_ = nullptr;
    llama_context_ptr ctx_;             // declared after own_model_: freed before it
    llama_batch batch_{};
    const llama_vocab * vocab_ = nullptr;
    std::string path_;
    int n_embd_ = 0;
    int n_ctx_ = 0;
    int n_vocab_ = 0;
    enum class Pooling { mean, last, model }; // taken here from the rows' hidden states, or llama.cpp's
    Pooling pooling_ = Pooling::mean;
    bool encoder_only_ = false;         // llama_encode, not llama_decode
};

} // namespace specllm
