#include "specllm/prompt_store.h"

#include "specllm/errors.h"
#include "specllm/log.h"
#include "specllm/prompt_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace specllm {

size_t common_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    const size_t n = std::min(a.size(), b.size());
    return (size_t) (std::mismatch(a.begin(), a.begin() + (long) n, b.begin()).first - a.begin());
}

PromptStore::PromptStore(const std::string & dir, size_t max_bytes, uint64_t identity)
    : dir_(dir), max_bytes_(max_bytes), identity_(identity), pid_(::getpid()) {
    if (dir.empty()) {
        throw InvalidArgument("prompt_cache_dir is empty: give a directory (created if missing), or None for no "
                              "prompt states on disk");
    }
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (!fs::is_directory(dir)) {
        throw InvalidArgument("prompt_cache_dir '" + dir + "' is not a directory and cannot be made one" +
                              (ec ? " (" + ec.message() + ")" : std::string()) + ": give a directory to keep "
                              "prompt states in");
    }
    // a place this process cannot write fails now, not after the first reply
    const std::string probe = dir + "/.probe-" + std::to_string(::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        throw InvalidArgument("prompt_cache_dir '" + dir + "' cannot be written (" + std::strerror(errno) +
                              "): give a directory this process may write to");
    }
    ::close(fd);
    ::unlink(probe.c_str());
    scan();
    writer_ = std::make_unique<std::thread>([this] { run(); });
}

PromptStore::~PromptStore() {
    if (forked()) {
        // the parent's thread is not in this process (std::thread's join threw, terminating it), and destroying the
        // condition variable it waited on blocks: both kept, never destroyed (not even at exit), and reachable from
        // a global, so that a leak checker does not report them lost
        static auto * kept = new std::vector<void *>();
        kept->push_back(writer_.release());
        kept->push_back(cv_.release());
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_->notify_all();
    writer_->join();
}

void PromptStore::scan() {
    const std::string mine = state_name_prefix(identity_);
    const auto stale = fs::file_time_type::clock::now() - std::chrono::hours(1);
    std::error_code ec;
    for (const auto & de : fs::directory_iterator(dir_, ec)) {
        const std::string name = de.path().filename().string();
        std::error_code e2;
        if (name.find(".kv.tmp.") != std::string::npos && name.size() > 36 && is_state_name(name.substr(0, 36))) {
            if (fs::last_write_time(de.path(), e2) < stale) {
                fs::remove(de.path(), e2); // left by a process killed while writing
            }
            continue;
        }
        if (!is_state_name(name) || name.compare(0, 17, mine) != 0 || !de.is_regular_file(e2)) {
            continue; // not a state, or another model's
        }
        const uintmax_t size = fs::file_size(de.path(), e2);
        std::ifstream in(de.path(), std::ios::binary);
        StateHeader h;
        Entry e;
        if (!e2 && read_state_header(in, size, h) && h.identity == identity_) {
            e.tokens.resize(h.n_tokens);
            if (in.read(reinterpret_cast<char *>(e.tokens.data()), (std::streamsize) (4ull * h.n_tokens))) {
                e.file = de.path().string();
                e.size = (size_t) size;
                entries_.push_back(std::move(e));
                continue;
            }
        }
        log_note(3, "a prompt state file of this model that is damaged was removed: " + de.path().string());
        fs::remove(de.path(), e2);
    }
}

size_t PromptStore::best(const std::vector<llama_token> & seq, std::vector<llama_token> & tokens,
                         std::string & file) const {
    if (forked()) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(mu_);
    size_t best_n = 0;
    const Entry * chosen = nullptr;
    for (const auto & e : entries_) {
        const size_t n = common_prefix(e.tokens, seq);
        if (n > best_n) {
            best_n = n;
            chosen = &e;
        }
    }
    if (chosen) {
        tokens = chosen->tokens;
        file = chosen->file;
    }
    return best_n;
}

bool PromptStore::covers(const std::vector<llama_token> & live, size_t slack) const {
    if (forked()) {
        return true; // nothing to write here
    }
    std::lock_guard<std::mutex> lock(mu_);
    const size_t need = live.size() > slack ? live.size() - slack : 0;
    for (const auto & e : entries_) {
        if (common_prefix(e.tokens, live) > need) {
            return true;
        }
    }
    for (const auto & j : jobs_) {
        if (common_prefix(j.tokens, live) > need) {
            return true;
        }
    }
    return false;
}

void PromptStore::forget(const std::string & file) {
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [&](const Entry & e) { return e.file == file; }),
                   entries_.end());
}

void PromptStore::set_aside(const std::string & file) {
    std::lock_guard<std::mutex> lock(mu_);
    forget(file);
}

bool PromptStore::read(const std::string & file, const std::vector<llama_token> & tokens,
                       std::vector<uint8_t> & state) {
    if (forked()) {
        return false;
    }
    std::error_code ec;
    const uintmax_t size = fs::file_size(file, ec);
    std::ifstream in(file, std::ios::binary);
    StateHeader h;
    std::vector<llama_token> got(tokens.size());
    bool ok = !ec && in && read_state_header(in, size, h) && h.identity == identity_ && h.n_tokens == tokens.size() &&
              in.read(reinterpret_cast<char *>(got.data()), (std::streamsize) (4 * got.size())) && got == tokens;
    if (ok) {
        state.resize((size_t) h.n_state);
        ok = (bool) in.read(reinterpret_cast<char *>(state.data()), (std::streamsize) state.size()) &&
             state_checksum(got, state.data(), state.size()) == h.checksum;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
        state.clear();
        forget(file);
        if (fs::exists(file, ec)) { // gone: another process evicted it; there but wrong: damaged
            log_note(3, "a prompt state file that is damaged was removed: " + file);
            fs::remove(file, ec);
        }
        return false;
    }
    fs::last_write_time(file, fs::file_time_type::clock::now(), ec); // recently used: evicted last
    return true;
}

void PromptStore::write(std::vector<llama_token> tokens, std::vector<uint8_t> state) {
    if (forked() || state.empty() || state_file_size(tokens.size(), state.size()) > max_bytes_) {
        return; // larger than the whole store: not kept
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        jobs_.push_back(Job{std::move(tokens), std::move(state)});
    }
    cv_->notify_all();
}

void PromptStore::flush() {
    if (forked()) {
        return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_->wait(lock, [this] { return jobs_.empty(); });
}

void PromptStore::run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        cv_->wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) {
            return; // stopped, every queued state written
        }
        const Job & job = jobs_.front(); // stays queued (covers() sees it) until written; push_back keeps it valid
        lock.unlock();
        store(job);
        lock.lock();
        jobs_.pop_front();
        cv_->notify_all();
    }
}

void PromptStore::store(const Job & job) {
    static std::atomic<unsigned> counter{0};
    const std::string name = dir_ + "/" + state_file_name(identity_, job.tokens);
    const std::string tmp = name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    int err = write_state_file(tmp, identity_, job.tokens, job.state);
    if (err == 0 && std::rename(tmp.c_str(), name.c_str()) != 0) {
        err = errno ? errno : EIO;
    }
    const bool ok = err == 0;
    if (!ok) {
        ::unlink(tmp.c_str());
        std::lock_guard<std::mutex> lock(mu_);
        if (!warned_) { // once: a full disk would otherwise log every reply
            warned_ = true;
            log_note(3, "a prompt state could not be written to " + dir_ + " (" + std::strerror(err) +
                            "); replies go on, the states are not kept on disk");
        }
        return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    std::error_code ec;
    for (auto it = entries_.begin(); it != entries_.end();) {
        // a state the new one extends serves no prompt the new one does not (the same name: replaced by the rename)
        if (common_prefix(it->tokens, job.tokens) == it->tokens.size()) {
            if (it->file != name) {
                fs::remove(it->file, ec);
            }
            it = entries_.erase(it);
        } else {
            ++it;
        }
    }
    entries_.push_back(Entry{job.tokens, name, state_file_size(job.tokens.size(), job.state.size())});
    evict();
}

void PromptStore::evict() {
    // every state file in the directory counts (other models' too: one bound for the directory), oldest out first
    struct File {
        fs::file_time_type time;
        std::string path;
        uintmax_t size;
    };
    std::vector<File> files;
    uintmax_t total = 0;
    std::error_code ec;
    for (const auto & de : fs::directory_iterator(dir_, ec)) {
        std::error_code e2;
        if (is_state_name(de.path().filename().string()) && de.is_regular_file(e2)) {
            File f{de.last_write_time(e2), de.path().string(), de.file_size(e2)};
            if (!e2) {
                total += f.size;
                files.push_back(std::move(f));
            }
        }
    }
    std::sort(files.begin(), files.end(), [](const File & a, const File & b) { return a.time < b.time; });
    for (const auto & f : files) {
        if (total <= max_bytes_) {
            break;
        }
        fs::remove(f.path, ec);
        forget(f.path);
        total -= f.size;
    }
}

void PromptStore::remove_all() {
    if (forked()) {
        return;
    }
    flush();
    std::lock_guard<std::mutex> lock(mu_);
    std::error_code ec;
    for (const auto & e : entries_) {
        fs::remove(e.file, ec);
    }
    entries_.clear();
    // and this model's states that other processes wrote since this one scanned the directory (entries_ holds only
    // those it found then and its own): reset() promises none of its conversations is left on disk
    const std::string mine = state_name_prefix(identity_);
    for (const auto & de : fs::directory_iterator(dir_, ec)) {
        const std::string name = de.path().filename().string();
        std::error_code e2;
        if (is_state_name(name) && name.compare(0, mine.size(), mine) == 0 && de.is_regular_file(e2)) {
            fs::remove(de.path(), e2);
        }
    }
}

int PromptStore::n_entries() const {
    if (forked()) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(mu_);
    return (int) entries_.size();
}

size_t PromptStore::bytes() const {
    if (forked()) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto & e : entries_) {
        n += e.size;
    }
    return n;
}

} // namespace specllm
