// Drafters propose the next tokens cheaply; the target verifies them. The draft loop lives here.
#pragma once

#include "specllm/model.h"
#include "specllm/ngram.h"
#include "specllm/penalties.h"
#include "specllm/sampling.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace specllm {

struct DraftRequest {
    const std::vector<llama_token> * history = nullptr; // committed tokens: the target's KV cache
    llama_token id_last = -1;                           // newest committed token, not yet in history
    int n_max = 0;                                      // propose at most this many tokens
    const SamplingOptions * sampling = nullptr;         // temperature 0: draft the argmax
    float p_min = 0.0f;                                 // stop when the draft's top probability is below this
    Rng * rng = nullptr;                                // rejection sampling's generator
    int64_t pos0 = 0;                                   // sequence position of the first draft token (coupled
                                                        // sampling keys its draws by seed and position)
    bool use_ngram = false;                             // hybrid drafting: which drafter the policy chose
    const PenaltyWindow * penalties = nullptr;          // the repetition penalties over history + id_last, or
                                                        // none: a model drafts under them as the target decides
};

struct Draft {
    std::vector<llama_token> tokens;
    std::vector<Dist> q;     // per token when sampled from a model at temperature > 0; empty = one-hot
    bool from_ngram = false; // which drafter produced it (for hybrid drafting and stats)
    bool from_memory = false; // the n-gram drafter found it in the memory of earlier generations
    int n_catchup = 0;       // tokens the draft model decoded to catch up with the history before drafting
};

class Drafter {
  public:
    virtual ~Drafter() = default;
    virtual void propose(const DraftRequest & req, Draft & out) = 0;
    // make the drafter's state hold the committed history (a draft model decodes it); called at prefill.
    // `poll` runs between decode batches and may throw to abandon it (what was decoded stays cached)
    virtual void prefill(const std::vector<llama_token> & /*history*/, const std::function<void()> & /*poll*/) {}
    // the n-gram match of the history's suffix (length 0 = none); the policy uses it for hybrid drafting
    virtual NgramMatch ngram_match(const std::vector<llama_token> & /*history*/, llama_token /*id_last*/) {
        return {};
    }
    // the first token the n-gram drafter would propose after the last ngram_match() call (-1 = none)
    virtual llama_token ngram_peek() const { return -1; }
    // up to n tokens the n-gram drafter would propose after the last ngram_match() call (empty = none)
    virtual void ngram_continuation(int /*n*/, std::vector<llama_token> & out) const { out.clear(); }
    virtual bool has_model() const { return false; }
};

// a small model of the same family, drafting token by token on its own context
class ModelDrafter : public Drafter {
  public:
    // n_target_vocab: the target's vocabulary size; a padded vocabulary (either side) only drafts ids both have
    ModelDrafter(std::unique_ptr<Model> model, int n_target_vocab)
        : model_(std::move(model)), n_shared_(std::min(model_->n_vocab(), n_target_vocab)) {}
    void propose(const DraftRequest & req, Draft & out) override;
    void prefill(const std::vector<llama_token> & history, const std::function<void()> & poll) override;
    bool has_model() const override { return true; }
    Model & model() { return *model_; }

  private:
    std::unique_ptr<Model> model_;
    void to_draft_ids(std::vector<llama_token> & seq) const; // ids the draft lacks -> id 0
    int n_shared_; // ids below this exist in both vocabularies: the draft samples among them only
    Warper warper_;
    std::vector<llama_token> seq_; // scratch: history + id_last
    PenaltyWindow penalties_;      // the request's repetition penalties, so that the draft guesses the target's
    std::vector<float> penalized_; // scratch: a penalized row
};

// prompt lookup over prompt + output, and over the memory of earlier generations' outputs (when given one): the
// longer match wins, the current text on a tie
class NgramDrafter : public Drafter {
  public:
    explicit NgramDrafter(const NgramOptions & opts, const NgramMemory * memory = nullptr)
        : index_(opts.n_min, opts.n_max), memory_(memory) {}
    void propose(const DraftRequest & req, Draft & out) override;
    NgramMatch ngram_match(const std::vector<llama_token> & history, llama_token id_last) override;
    llama_token ngram_peek() const override { return seq_.empty() ? -1 : seq_[0]; }
    void ngram_continuation(int n, std::vector<llama_token> & out) const override;

  private:
    bool sync(const std::vector<llama_token> & history, llama_token id_last); // true if the index changed
    NgramMatch find(int n_draft, std::vector<llama_token> & out); // in the current text, then in the memory
    NgramIndex index_;
    const NgramMemory * memory_;
    std::vector<llama_token> memory_seq_; // scratch
    std::vector<llama_token> seq_;
    NgramMatch match_;         // of the last ngram_match() call ...
    bool match_valid_ = false; // ... and the index has not changed since
};

// the n-gram drafter or the draft model, as the policy chooses each step
class HybridDrafter : public Drafter {
  public:
    HybridDrafter(std::unique_ptr<Model> model, int n_target_vocab, const NgramOptions & opts,
                  const NgramMemory * memory = nullptr)
        : model_(std::move(model), n_target_vocab), ngram_(opts, memory) {}
    void propose(const DraftRequest & req, Draft & out) override;
    void prefill(const std::vector<llama_token> & history, const std::function<void()> & poll) override {
        model_.prefill(history, poll);
    }
    NgramMatch ngram_match(const std::vector<llama_token> & history, llama_token id_last) override {
        return ngram_.ngram_match(history, id_last);
    }
    llama_token ngram_peek() const override { return ngram_.ngram_peek(); }
    void ngram_continuation(int n, std::vector<llama_token> & out) const override {
        ngram_.ngram_continuation(n, out);
    }
    bool has_model() const override { return true; }

  private:
    ModelDrafter model_;
    NgramDrafter ngram_;
};

} // namespace specllm
