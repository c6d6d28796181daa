// One GGUF model with its llama_context: loading with checks, tokenization, and a KV cache whose contents
// (the tokens at positions 0..n-1 of sequence 0) are tracked so callers can reuse or cut a prefix.
#pragma once

#include "specllm/options.h"

#include "llama-cpp.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace specllm {

constexpr int max_threads = 512; // GGML_MAX_N_THREADS: more fail inside llama.cpp's thread pool
constexpr int max_ctx = 1 << 24; // far beyond any model's training context; keeps the arithmetic in int

class Model {
  public:
    explicit Model(const ModelOptions & opts); // throws ModelLoadError
    ~Model();
    Model(const Model &) = delete;
    Model & operator=(const Model &) = delete;

    const llama_vocab * vocab() const { return vocab_; }
    const llama_model * weights() const { return model_.get(); } // for a second context over them (embed.h)
    llama_context * ctx() const { return ctx_.get(); }
    const ModelOptions & options() const { return opts_; }
    int n_ctx() const { return n_ctx_; }
    int n_vocab() const { return n_vocab_; }
    int n_batch() const;
    std::string description() const;

    std::vector<llama_token> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    // text of one token; control tokens render as "" unless special (then their text, as llama-server's /tokenize)
    std::string piece(llama_token token, bool special = false) const;
    // a 64-bit FNV-1a digest of every token's text (hex): what a drafting memory file is checked against
    std::string vocab_hash() const;
    bool is_eog(llama_token token) const { return llama_vocab_is_eog(vocab_, token); }
    std::string chat_template() const; // the GGUF's tokenizer.chat_template, or "" if none
    std::string tool_use_template() const; // tokenizer.chat_template.tool_use (Hermes 2 Pro / 3), or "" if none

    // KV cache of sequence 0
    const std::vector<llama_token> & cached() const { return cached_; }
    // positions llama.cpp's memory holds for the sequence (-1 when empty): the truth cached() must agree with
    int memory_pos_min() const;
    int memory_pos_max() const;
    int n_past() const { return (int) cached_.size(); }
    // whether llama.cpp can cut this model's memory back to any position: false for recurrent (Mamba, RWKV) and
    // hybrid-memory models, whose state at an earlier position is gone once later tokens were decoded
    bool can_rollback() const { return can_rollback_; }
    // keep positions [0, n). A model that cannot roll back loses its whole cache instead (n_past() becomes 0, and
    // the caller decodes again from the start): what cached() says is always what llama.cpp's memory holds
    void truncate(int n);
    int keep_common_prefix(const std::vector<llama_token> & seq); // truncate to the prefix shared with seq; returns
                                                                  // n_past() after it
    // keep_common_prefix, then llama-server's --cache-reuse: each later run of at least min_run cached tokens that
    // seq holds next, in order, is moved to its place in seq (llama.cpp shifts its positions), the cached tokens
    // between runs dropped. An editor's prompt whose other-file chunks rotate (one drops out at the front) keeps
    // the rest. The moved runs' KV was computed after other text than now precedes them: the output can differ from
    // decoding seq afresh (as with llama-server's option). min_run <= 0, or a model whose positions cannot shift
    // (recurrent memory), keeps the common prefix alone. Returns n_past(); *n_moved gets the tokens moved
    int keep_shifted(const std::vector<llama_token> & seq, int min_run, int * n_moved = nullptr);
    void clear() { truncate(0); }
    // the cache's state as llama.cpp copies it out (llama_state_seq_get_data), and back: set_state makes the cache
    // hold `tokens` from a state saved when it held them; false (and an empty cache) if llama.cpp refuses it
    std::vector<uint8_t> state() const;
    size_t state_size() const; // the bytes state() would copy
    bool set_state(const std::vector<uint8_t> & state, const std::vector<llama_token> & tokens);

    // decode tokens at positions n_past().. in batches of n_batch; logits for every row (all_logits; but the last
    // n_filler rows, padding) or only the last row. Throws ContextOverflowError / DecodeError; on error the cache
    // is cut back.
    void decode(const llama_token * tokens, int n, bool all_logits, int n_filler = 0);
    // decode a prompt (no logits but the last row's) in batches of at most prompt_batch tokens, calling poll
    // before every batch but the first; poll may throw to abandon it (what was decoded stays cached)
    void decode_polled(const llama_token * tokens, int n, const std::function<void()> & poll);
    static constexpr int prompt_batch = 256; // ~4 s of prefill on a 2-core CPU between polls
    // row i of the last decode (only rows that requested logits); throws DecodeError on NaN or +inf logits, or
    // when every logit is -inf
    const float * logits(int i) const;

  private:
    void check_head_blocks(ggml_type type, const char * what) const; // a ModelLoadError if a block breaks a head
    int64_t head_size() const; // the attention head's size (0 if the model does not say)
    ModelOptions opts_;
    llama_model_ptr model_;   // declared before the context so that it is freed after it
    llama_context_ptr ctx_;
    llama_batch batch_{};
    const llama_vocab * vocab_ = nullptr;
    int n_ctx_ = 0;
    int n_vocab_ = 0;
    bool can_rollback_ = true;
    // llama.cpp can move cached runs (cache_reuse) without crashing: a K cache of f16 or f32, or a quantized one
    // whose head rows hold an even number of blocks (q8_0 at head 32, 96 or 160 segfaulted in the shift's rope;
    // bf16's rope aborts at any head size)
    bool k_shifts_ = true;
    bool k_shift_noted_ = false;
    std::vector<llama_token> cached_;
    int cut_memory(int n); // remove positions >= n from llama.cpp's memory; returns how many positions remain
};

// the text's tokens; add_special: BOS/EOS as the model adds them; parse_special: "<|im_end|>" is one control token
std::vector<llama_token> tokenize_text(const llama_vocab * vocab, const std::string & text, bool add_special,
                                       bool parse_special);
// a readable, non-empty GGUF file at path, or ModelLoadError saying what is wrong with it
void check_gguf_file(const std::string & path);
// the model at opts.path loaded with its tokenizer (opts checked), or a typed error; what: "" or "the embedding
// model " for the messages
llama_model_ptr load_model(const ModelOptions & opts, const std::string & what);
std::string model_description(const llama_model * model); // "qwen2 1.5B Q4_K - Medium"

// the ggml type of a KV cache type's name ("q8_0"), or InvalidArgument naming `which` and the names known
ggml_type cache_type(const std::string & name, const char * which);
std::vector<std::string> cache_type_names(); // f16 first

// the hardware's threads (what n_threads = 0 means)
int default_threads();

// the most entries two vocabularies may differ by (padding at the end), as llama.cpp's speculative tools allow
constexpr int max_vocab_size_difference = 128;

// throws IncompatibleDraftError naming the first difference (type, sizes more than max_vocab_size_difference
// apart, special tokens, add_bos, token texts on the shared range)
void check_same_vocab(const Model & target, const Model & draft);

} // namespace specllm
