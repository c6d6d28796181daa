// The Model: one llama.cpp model and its context, with the operations the engine needs (tokenize, KV cache cuts and
// shifts, state, decode, logits). Loading and the GGUF pre-check are in model_load.cpp.
#include "specllm/model.h"

#include "specllm/errors.h"
#include "specllm/log.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstdint>
#include <string>
#include <cmath>

namespace specllm {

Model::Model(const ModelOptions & opts) : opts_(opts), model_(load_model(opts, "")) {
    vocab_ = llama_model_get_vocab(model_.get());
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    can_rollback_ = !llama_model_is_recurrent(model_.get()) && !llama_model_is_hybrid(model_.get());

    const int n_threads = opts.n_threads > 0 ? opts.n_threads : default_threads();
    llama_context_params cparams = llama_context_default_params();
    // llama.cpp rounds n_ctx up to a multiple of 256, but caps n_batch by the n_ctx asked for: round first, so
    // that a small n_ctx still takes a whole verify batch
    const int n_ctx = (opts.n_ctx + 255) / 256 * 256;
    cparams.n_ctx = (uint32_t) n_ctx;
    cparams.n_batch = (uint32_t) std::min(std::max(opts.n_batch, 64), n_ctx); // a verify batch (k+1 rows) is never split
    cparams.n_ubatch = cparams.n_batch;
    cparams.n_seq_max = 1;
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.no_perf = true;
    cparams.type_k = cache_type(opts.cache_type_k, "cache_type_k");
    cparams.type_v = cache_type(opts.cache_type_v, "cache_type_v");
    cparams.flash_attn_type = (llama_flash_attn_type) opts.flash_attn;
    check_head_blocks(cparams.type_k, "cache_type_k");
    {
        const int64_t block = ggml_blck_size(cparams.type_k);
        const int64_t head = head_size();
        k_shifts_ = cparams.type_k == GGML_TYPE_F16 || cparams.type_k == GGML_TYPE_F32 ||
                    (block > 1 && head > 0 && head % (2 * block) == 0);
    }
    ctx_.reset(llama_init_from_model(model_.get(), cparams));
    if (!ctx_) {
        std::string why = log_take_errors();
        const bool own_types = opts.cache_type_k != "f16" || opts.cache_type_v != "f16";
        // a quantized type's block (32 values) must divide the model's head size, which llama.h does not expose
        throw ModelLoadError("llama.cpp could not create a context for '" + opts.path + "' with n_ctx=" +
                             std::to_string(opts.n_ctx) +
                             (own_types ? " and KV cache types " + opts.cache_type_k + "/" + opts.cache_type_v +
                                              " (a quantized type's blocks must divide the model's attention head "
                                              "size, which this model's may not: try f16, the default)"
                                        : " (out of memory? try a smaller n_ctx)") +
                             (why.empty() ? "" : ": " + why));
    }
    n_ctx_ = (int) llama_n_ctx(ctx_.get());
    batch_ = llama_batch_init((int32_t) llama_n_batch(ctx_.get()), 0, 1);
}

void Model::check_head_blocks(ggml_type type, const char * what) const {
    // a quantized K cache stores each head's row in blocks: a head size the block does not divide made llama.cpp
    // assert (abort the process) with flash attention off, where "auto" failed the context cleanly
    const int64_t block = ggml_blck_size(type);
    if (block <= 1) {
        return;
    }
    const int64_t head = head_size();
    if (head > 0 && head % block != 0) {
        throw ModelLoadError(std::string(what) + "=" + (std::string(what) == "cache_type_k" ? opts_.cache_type_k
                                                                                           : opts_.cache_type_v) +
                             " stores blocks of " + std::to_string(block) + " values, which do not divide the " +
                             "attention head size (" + std::to_string(head) + ") of '" + opts_.path +
                             "'; use f16 (the default), bf16 or f32");
    }
}

int64_t Model::head_size() const {
    char arch[64] = {0};
    char key_length[32] = {0};
    if (llama_model_meta_val_str(model_.get(), "general.architecture", arch, sizeof(arch)) > 0 &&
        llama_model_meta_val_str(model_.get(), (std::string(arch) + ".attention.key_length").c_str(), key_length,
                                 sizeof(key_length)) > 0) {
        return std::atoll(key_length);
    }
    return llama_model_n_head(model_.get()) > 0 ? llama_model_n_embd(model_.get()) / llama_model_n_head(model_.get())
                                                : 0;
}

Model::~Model() {
    llama_batch_free(batch_);
}

std::string Model::description() const {
    return model_description(model_.get());
}

std::vector<llama_token> tokenize_text(const llama_vocab * vocab, const std::string & text, bool add_special,
                                       bool parse_special) {
    std::vector<llama_token> out(text.size() + 8);
    int n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special,
                           parse_special);
    if (n < 0) {
        if (n == INT32_MIN) {
            throw InvalidArgument("text is too long to tokenize");
        }
        out.resize((size_t) -n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special,
                           parse_special);
    }
    out.resize((size_t) std::max(n, 0));
    return out;
}

std::vector<llama_token> Model::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    return tokenize_text(vocab_, text, add_special, parse_special);
}

std::string Model::piece(llama_token token, bool special) const {
    char buf[128];
    int n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, special);
    if (n >= 0) {
        return std::string(buf, (size_t) n);
    }
    std::string big((size_t) -n, '\0');
    n = llama_token_to_piece(vocab_, token, big.data(), (int32_t) big.size(), 0, special);
    big.resize((size_t) std::max(n, 0));
    return big;
}

std::string Model::vocab_hash() const {
    uint64_t h = 1469598103934665603ULL;
    auto mix = [&h](unsigned char c) {
        h ^= c;
        h *= 1099511628211ULL;
    };
    const int n = llama_vocab_n_tokens(vocab_);
    for (llama_token t = 0; t < n; ++t) {
        const std::string text = piece(t, true);
        const uint32_t len = (uint32_t) text.size(); // the length first: "ab","c" and "a","bc" differ
        for (int i = 0; i < 4; ++i) {
            mix((unsigned char) (len >> (8 * i)));
        }
        for (char c : text) {
            mix((unsigned char) c);
        }
    }
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long) h);
    return buf;
}

std::string Model::chat_template() const {
    const char * tmpl = llama_model_chat_template(model_.get(), nullptr);
    return tmpl ? std::string(tmpl) : std::string();
}

std::string Model::tool_use_template() const {
    const char * tmpl = llama_model_chat_template(model_.get(), "tool_use");
    return tmpl ? std::string(tmpl) : std::string();
}

void Model::truncate(int n) {
    n = std::max(0, n);
    if (n >= (int) cached_.size()) {
        return;
    }
    cached_.resize((size_t) cut_memory(n));
}

int Model::cut_memory(int n) {
    llama_memory_t mem = llama_get_memory(ctx_.get());
    if (llama_memory_seq_rm(mem, 0, n, -1)) {
        return n;
    }
    // a recurrent state cannot be cut back part way (llama.cpp refuses and leaves the memory as it was): forget
    // the sequence, so that the next decode starts over at position 0 instead of failing on every call
    if (!llama_memory_seq_rm(mem, 0, -1, -1)) {
        llama_memory_clear(mem, true);
    }
    return 0;
}

int Model::keep_common_prefix(const std::vector<llama_token> & seq) {
    size_t n = 0;
    const size_t n_max = std::min(seq.size(), cached_.size());
    while (n < n_max && seq[n] == cached_[n]) {
        ++n;
    }
    truncate((int) n);
    return n_past();
}

int Model::keep_shifted(const std::vector<llama_token> & seq, int min_run, int * n_moved) {
    if (n_moved != nullptr) {
        *n_moved = 0;
    }
    llama_memory_t mem = llama_get_memory(ctx_.get());
    size_t head_p = 0; // seq's tokens in place (the common prefix first)
    while (head_p < seq.size() && head_p < cached_.size() && seq[head_p] == cached_[head_p]) {
        ++head_p;
    }
    if (min_run <= 0 || !can_rollback_ || !llama_memory_can_shift(mem)) {
        return keep_common_prefix(seq);
    }
    if (!k_shifts_) {
        if (!k_shift_noted_) {
            k_shift_noted_ = true;
            log_note(3, "specllm: cache_reuse moves no cached runs with a K cache of " + opts_.cache_type_k +
                            " at this model's head size (" + std::to_string(head_size()) + "): llama.cpp's shift "
                            "crashes there; only the common prefix is kept (f16 moves them)");
        }
        return keep_common_prefix(seq);
    }
    // as llama-server's slot update: scan the cache past the prefix for runs that seq continues with
    std::vector<llama_token> kept(cached_.begin(), cached_.begin() + (long) head_p);
    size_t head_c = head_p;
    while (head_c < cached_.size() && head_p < seq.size()) {
        size_t n = 0;
        while (head_c + n < cached_.size() && head_p + n < seq.size() && cached_[head_c + n] == seq[head_p + n]) {
            ++n;
        }
        if (n >= (size_t) min_run) {
            const llama_pos shift = (llama_pos) head_p - (llama_pos) head_c; // <= 0: runs only move back
            if (shift != 0) {
                llama_memory_seq_rm(mem, 0, (llama_pos) head_p, (llama_pos) head_c);
                llama_memory_seq_add(mem, 0, (llama_pos) head_c, (llama_pos) (head_c + n), shift);
                if (n_moved != nullptr) {
                    *n_moved += (int) n;
                }
            }
            kept.insert(kept.end(), cached_.begin() + (long) head_c, cached_.begin() + (long) (head_c + n));
            head_c += n;
            head_p += n;
        } else {
            ++head_c;
        }
    }
    cut_memory((int) head_p); // the cached tokens past the last run (still at their old positions)
    cached_.swap(kept);
    return n_past();
}

size_t Model::state_size() const {
    return llama_state_seq_get_size(ctx_.get(), 0);
}

std::vector<uint8_t> Model::state() const {
    std::vector<uint8_t> out(state_size());
    out.resize(llama_state_seq_get_data(ctx_.get(), out.data(), out.size(), 0));
    return out;
}

bool Model::set_state(const std::vector<uint8_t> & state, const std::vector<llama_token> & tokens) {
    clear();
    // and the cache must span the tokens' positions, from 0 (a sliding-window cache keeps only its window) to n-1: a
    // state file whose cells say otherwise (positions all 0, one at -5, past its tokens) restored "fine" and then
    // failed every later decode, or the reply read a cell left behind. Cells at repeated positions inside that span
    // are not seen (the checksum guards the files against damage, not against a forged one)
    const bool window = llama_model_n_swa(model_.get()) > 0;
    if (state.empty() || llama_state_seq_set_data(ctx_.get(), state.data(), state.size(), 0) == 0 ||
        memory_pos_max() != (int) tokens.size() - 1 || memory_pos_min() < 0 || (!window && memory_pos_min() != 0)) {
        // llama.cpp clears the sequence when it fails part way; and a cell at a negative position is not one that
        // removing positions 0.. removes (it stayed, and the next prompt was read after it): the whole memory
        llama_memory_clear(llama_get_memory(ctx_.get()), true);
        return false;
    }
    cached_ = tokens;
    return true;
}

void Model::decode_polled(const llama_token * tokens, int n, const std::function<void()> & poll) {
    const int step = std::min(n_batch(), prompt_batch);
    for (int i = 0; i < n; i += step) {
        if (poll && i > 0) {
            poll();
        }
        decode(tokens + i, std::min(step, n - i), false);
    }
}

int Model::memory_pos_min() const {
    return (int) llama_memory_seq_pos_min(llama_get_memory(ctx_.get()), 0);
}

int Model::memory_pos_max() const {
    return (int) llama_memory_seq_pos_max(llama_get_memory(ctx_.get()), 0);
}

int Model::n_batch() const {
    return (int) llama_n_batch(ctx_.get());
}

void Model::decode(const llama_token * tokens, int n, bool all_logits, int n_filler) {
    if (n <= 0) {
        return;
    }
    if (n_past() + n > n_ctx_) {
        throw ContextOverflowError("context window full: " + std::to_string(n_past()) + " + " + std::to_string(n) +
                                   " tokens exceed n_ctx=" + std::to_string(n_ctx_) +
                                   "; create the LLM with a larger n_ctx or shorten the prompt");
    }
    const int n_batch = (int) llama_n_batch(ctx_.get());
    if (all_logits && n > n_batch) {
        throw InvalidArgument("a batch with logits for every row is limited to n_batch=" + std::to_string(n_batch));
    }
    const int n_past0 = n_past();
    for (int i0 = 0; i0 < n; i0 += n_batch) {
        const int n_cur = std::min(n_batch, n - i0);
        batch_.n_tokens = n_cur;
        for (int j = 0; j < n_cur; ++j) {
            batch_.token[j] = tokens[i0 + j];
            batch_.pos[j] = n_past() + j;
            batch_.n_seq_id[j] = 1;
            batch_.seq_id[j][0] = 0;
            batch_.logits[j] = all_logits ? i0 + j < n - n_filler : i0 + j == n - 1;
        }
        const int32_t rc = llama_decode(ctx_.get(), batch_);
        if (rc != 0) {
            // the failed batch may have left rows in llama.cpp's memory past what cached() says: cut them too
            cached_.resize((size_t) std::min(n_past(), cut_memory(n_past0)));
            std::string why = log_take_errors();
            if (rc == 1) {
                throw ContextOverflowError("no room in the KV cache for " + std::to_string(n_cur) +
                                           " tokens; use a larger n_ctx");
            }
            throw DecodeError("llama_decode failed with code " + std::to_string(rc) + (why.empty() ? "" : ": " + why));
        }
        cached_.insert(cached_.end(), tokens + i0, tokens + i0 + n_cur);
    }
}

const float * Model::logits(int i) const {
    const float * row = llama_get_logits_ith(ctx_.get(), i);
    if (row == nullptr) {
        throw DecodeError("llama.cpp has no logits for row " + std::to_string(i) + " of the last batch");
    }
    // degenerate logits would sample or verify garbage (an empty distribution, a silent token 0): refuse them.
    // -inf is a masked token and fine, as long as one is finite
    const int n = n_vocab();
    bool any_finite = false;
    for (int j = 0; j < n; ++j) {
        const float v = row[j];
        if (std::isnan(v) || v == INFINITY) {
            throw DecodeError("the model computed " + std::string(std::isnan(v) ? "NaN" : "+inf") + " logits (token " +
                              std::to_string(j) + ", row " + std::to_string(i) + " of the batch ending at position " +
                              std::to_string(n_past() - 1) + "): its weights or this build's kernels are broken; "
                              "try another quantization or n_gpu_layers=0");
        }
        any_finite = any_finite || v > -INFINITY;
    }
    if (!any_finite) {
        throw DecodeError("every logit is -inf (row " + std::to_string(i) + " of the batch ending at position " +
                          std::to_string(n_past() - 1) + "): the model gives no token any probability");
    }
    return row;
}

} // namespace specllm
