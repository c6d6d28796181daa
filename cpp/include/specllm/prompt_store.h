// Prompt states kept on disk across processes: a desktop app or a server started again with the same long system
// prompt (an agent's tools, an editor's instructions) or a chat taken up again gets its prefix back from a file
// instead of decoding it again (on a 2-core CPU ~23 ms a token: a 4k-token system prompt is 90 s).
//
// One file per state, written after a generation ends (the prompt and the reply as the KV cache holds them) by a
// thread of its own: the header (magic, the model's identity, token count, state size, checksum), the tokens, the
// bytes of llama_state_seq_get_data. Written to a temporary name and renamed, so a file is whole or absent; a state
// whose tokens a new one extends is removed (the new one serves every prompt the old one did). The directory is
// bounded in bytes, least recently used file out first (a restore touches it). A file that is damaged or of another
// model is never restored: another model's files are left alone, a damaged file of ours is removed.
#pragma once

#include "llama.h"
#include "specllm/prompt_file.h"

#include <unistd.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace specllm {

class PromptStore {
  public:
    // dir is created if missing. identity names the model and the numerics of its states (a state restored into
    // another model, or into exact mode from fast mode, would be wrong). Throws InvalidArgument when dir cannot be
    // a directory of files this process writes
    // A process forked from the one that made the store (os.fork, multiprocessing) has no writer thread, and a lock
    // the parent's writer held at the fork would never be released: there the store stores and finds nothing (the
    // child decodes its prompts) and its destructor leaves the parent's thread alone (joining it aborted the child)
    PromptStore(const std::string & dir, size_t max_bytes, uint64_t identity);
    ~PromptStore(); // finishes the writes queued
    PromptStore(const PromptStore &) = delete;
    PromptStore & operator=(const PromptStore &) = delete;

    const std::string & dir() const { return dir_; }
    size_t max_bytes() const { return max_bytes_; }

    // the stored state sharing the longest prefix with seq: the tokens it shares (0: none), its tokens and file
    size_t best(const std::vector<llama_token> & seq, std::vector<llama_token> & tokens, std::string & file) const;
    // a stored or queued state holds all of live but fewer than `slack` of its tokens
    bool covers(const std::vector<llama_token> & live, size_t slack) const;
    // the state in file, checked against its header, tokens and checksum; false (and the file forgotten, removed
    // if damaged) when it cannot be used
    bool read(const std::string & file, const std::vector<llama_token> & tokens, std::vector<uint8_t> & state);
    // a state this process cannot restore (written by an LLM with a larger context, or refused by llama.cpp): not
    // offered again by best(); its file stays, another process's LLM may restore it
    void set_aside(const std::string & file);
    // queue a state to be written
    void write(std::vector<llama_token> tokens, std::vector<uint8_t> state);
    void flush();        // wait until the queued writes are done
    void remove_all();   // this model's states, from the disk and the index (reset())
    int n_entries() const;
    size_t bytes() const; // of this model's states on disk

  private:
    struct Entry {
        std::vector<llama_token> tokens;
        std::string file;
        size_t size = 0;
    };
    struct Job {
        std::vector<llama_token> tokens;
        std::vector<uint8_t> state;
    };
    void scan();
    void run();
    void store(const Job & job);
    void evict();
    void forget(const std::string & file); // under mu_
    bool forked() const { return ::getpid() != pid_; }
    std::string dir_;
    size_t max_bytes_;
    uint64_t identity_;
    mutable std::mutex mu_;
    // released, not destroyed, in a forked child: the parent's writer waited on it at the fork, and destroying a
    // condition variable with a waiter blocks for ever
    std::unique_ptr<std::condition_variable> cv_ = std::make_unique<std::condition_variable>();
    std::deque<Job> jobs_;
    bool busy_ = false;
    bool stop_ = false;
    bool warned_ = false;
    std::vector<Entry> entries_;
    pid_t pid_;                           // of the process that made the store
    std::unique_ptr<std::thread> writer_; // released, not joined, in a forked child
};

// how many tokens a and b share from their start (both prompt caches compare token lists by it)
size_t common_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b);

} // namespace specllm
