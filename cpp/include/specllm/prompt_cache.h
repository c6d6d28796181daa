// Saved KV states of earlier prompts, so that a prompt continuing a conversation other than the last one reuses
// its prefix instead of decoding it again: an assistant that asks for a chat's title between two turns, an editor
// that interleaves completions with a chat, agents taking turns. The target keeps one KV cache (sequence 0); before
// a new prompt cuts a long part of it away, that state is copied out (llama_state_seq_get_data), and a later
// prompt that shares a longer prefix with a saved state than with the live cache gets it copied back. The bytes
// are llama.cpp's own, so a restored prefix decodes as if it had never left. Bounded in bytes, least recently used
// out first. Only for models whose cache can be cut back to any position (not recurrent ones).
#pragma once

#include "specllm/prompt_store.h"

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

namespace specllm {

class Model;

class PromptCache {
  public:
    // a state is saved only when a prompt would cut at least this many tokens off the live cache, and restored
    // only when it gives at least this many more tokens than the live cache: a conversation's next turn (which
    // re-tokenizes ~20 tokens of the last reply) costs nothing
    static constexpr int min_tokens = 64;

    void set_capacity(size_t bytes); // 0 = off; a smaller capacity drops the least recently used states
    size_t capacity() const { return capacity_; }
    size_t bytes() const { return bytes_; }
    int n_entries() const { return (int) entries_.size(); }
    void clear();

    // before `model`'s cache is made to hold `seq`: save the live state if seq would cut much of it away, and
    // restore the saved state sharing the longest prefix with seq if it beats the live one. Returns the tokens
    // restored (0 when the live cache stays)
    int prepare(Model & model, const std::vector<llama_token> & seq);
    bool restored_from_disk() const { return from_disk_; } // the last prepare() restored a state from the store
    // before `model`'s cache is cleared (a prompt decoded whole, to be scored): the live state saved, as prepare()
    // saves one a prompt cuts away
    void set_aside(Model & model) { prepare(model, {}); }

    // states on disk across processes (prompt_store.h); nullptr = none. persist: after a generation, the live
    // state is queued for the store unless it holds all but min_tokens of it already
    void set_store(std::unique_ptr<PromptStore> store) { store_ = std::move(store); }
    PromptStore * store() const { return store_.get(); }
    void persist(Model & model);

  private:
    struct Entry {
        std::vector<llama_token> tokens;
        std::vector<uint8_t> state;
    };
    void save(Model & model);
    void evict_to(size_t bytes);
    size_t capacity_ = 0;
    size_t bytes_ = 0;
    std::list<Entry> entries_; // most recently used first
    std::unique_ptr<PromptStore> store_;
    bool from_disk_ = false;
};

} // namespace specllm
