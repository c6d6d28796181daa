#include "specllm/prompt_store.h"

#include "specllm/errors.h"
#include "specllm/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace specllm {

namespace {

constexpr char magic[8] = {'S', 'P', 'L', 'K', 'V', 'S', 'T', '1'};
constexpr size_t header_size = 40; // magic, identity u64, n_tokens u32, 0 u32, n_state u64, checksum u64
constexpr uint64_t prime = 0x100000001b3ULL;
constexpr uint64_t basis = 0xcbf29ce484222325ULL;

uint64_t mix(const void * data, size_t n, uint64_t h) {
    const auto * p = static_cast<const uint8_t *>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ w) * prime;
        h ^= h >> 29;
    }
    for (; i < n; ++i) {
        h = (h ^ p[i]) * prime;
    }
    return h;
}

std::string hex16(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long) v);
    return buf;
}

// <identity>-<tokens>.kv: 16 hex digits each
bool is_state_name(const std::string & name) {
    if (name.size() != 36 || name[16] != '-' || name.compare(33, 3, ".kv") != 0) {
        return false;
    }
    for (size_t i = 0; i < 33; ++i) {
        if (i != 16 && !std::isxdigit((unsigned char) name[i])) {
            return false;
        }
    }
    return true;
}

struct Header {
    uint64_t identity = 0;
    uint32_t n_tokens = 0;
    uint64_t n_state = 0;
    uint64_t checksum = 0;
};

void put64(uint8_t * p, uint64_t v) { std::memcpy(p, &v, 8); }
uint64_t get64(const uint8_t * p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

// false: not a state file of this format, or shorter than its header says
bool read_header(std::ifstream & in, uintmax_t file_size, Header & h) {
    uint8_t buf[header_size];
    if (!in.read(reinterpret_cast<char *>(buf), header_size) || std::memcmp(buf, magic, 8) != 0) {
        return false;
    }
    h.identity = get64(buf + 8);
    std::memcpy(&h.n_tokens, buf + 16, 4);
    h.n_state = get64(buf + 24);
    h.checksum = get64(buf + 32);
    // each part within the file before the sum (a crafted n_state wrapped it to the size: 16 GB allocated)
    return h.n_state > 0 && h.n_state <= file_size && 4ull * h.n_tokens <= file_size &&
           file_size == header_size + 4ull * h.n_tokens + h.n_state;
}

bool write_all(int fd, const void * data, size_t n) {
    const auto * p = static_cast<const uint8_t *>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return false;
        }
        p += w;
        n -= (size_t) w;
    }
    return true;
}

} // namespace

size_t common_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    const size_t n = std::min(a.size(), b.size());
    return (size_t) (std::mismatch(a.begin(), a.begin() + (long) n, b.begin()).first - a.begin());
}

uint64_t prompt_store_identity(const std::string & model_path, const std::string & options) {
    // the size, the first MiB (the metadata: a real GGUF's weights begin megabytes in) and 64 KiB at 64 places
    // spread over the rest: the weights of a fine-tune or another quantization of the same size differ there
    constexpr size_t head_bytes = 1 << 20, sample_bytes = 64 << 10, n_samples = 64;
    std::error_code ec;
    const uint64_t size = (uint64_t) fs::file_size(model_path, ec);
    uint64_t h = mix(&size, sizeof size, basis);
    std::ifstream in(model_path, std::ios::binary);
    std::vector<char> buf(head_bytes);
    in.read(buf.data(), (std::streamsize) buf.size());
    h = mix(buf.data(), (size_t) in.gcount(), h);
    if (!ec && size > head_bytes + sample_bytes) {
        buf.resize(sample_bytes);
        for (size_t i = 0; i < n_samples; ++i) {
            const uint64_t at = head_bytes + (size - head_bytes - sample_bytes) * (i + 1) / n_samples;
            in.clear();
            in.seekg((std::streamoff) at);
            in.read(buf.data(), (std::streamsize) buf.size());
            h = mix(buf.data(), (size_t) in.gcount(), h);
        }
    }
    return mix(options.data(), options.size(), h);
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
    const std::string mine = hex16(identity_) + "-";
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
        Header h;
        Entry e;
        if (!e2 && read_header(in, size, h) && h.identity == identity_) {
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

bool PromptStore::read(const std::string & file, const std::vector<llama_token> & tokens,
                       std::vector<uint8_t> & state) {
    if (forked()) {
        return false;
    }
    std::error_code ec;
    const uintmax_t size = fs::file_size(file, ec);
    std::ifstream in(file, std::ios::binary);
    Header h;
    std::vector<llama_token> got(tokens.size());
    bool ok = !ec && in && read_header(in, size, h) && h.identity == identity_ && h.n_tokens == tokens.size() &&
              in.read(reinterpret_cast<char *>(got.data()), (std::streamsize) (4 * got.size())) && got == tokens;
    if (ok) {
        state.resize((size_t) h.n_state);
        ok = (bool) in.read(reinterpret_cast<char *>(state.data()), (std::streamsize) state.size()) &&
             mix(state.data(), state.size(), mix(got.data(), 4 * got.size(), basis)) == h.checksum;
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
    if (forked() || state.empty() || header_size + 4 * tokens.size() + state.size() > max_bytes_) {
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
    const std::string name = dir_ + "/" + hex16(identity_) + "-" +
                             hex16(mix(job.tokens.data(), 4 * job.tokens.size(), basis)) + ".kv";
    const std::string tmp = name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    uint8_t head[header_size] = {};
    std::memcpy(head, magic, 8);
    put64(head + 8, identity_);
    const uint32_t n = (uint32_t) job.tokens.size();
    std::memcpy(head + 16, &n, 4);
    put64(head + 24, job.state.size());
    put64(head + 32, mix(job.state.data(), job.state.size(), mix(job.tokens.data(), 4 * job.tokens.size(), basis)));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    bool ok = fd >= 0 && write_all(fd, head, header_size) && write_all(fd, job.tokens.data(), 4 * job.tokens.size()) &&
              write_all(fd, job.state.data(), job.state.size());
    const int err = errno;
    ok = fd >= 0 && ::close(fd) == 0 && ok && std::rename(tmp.c_str(), name.c_str()) == 0;
    if (!ok) {
        ::unlink(tmp.c_str());
        std::lock_guard<std::mutex> lock(mu_);
        if (!warned_) { // once: a full disk would otherwise log every reply
            warned_ = true;
            log_note(3, "a prompt state could not be written to " + dir_ + " (" + std::strerror(err ? err : EIO) +
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
    entries_.push_back(Entry{job.tokens, name, header_size + 4 * job.tokens.size() + job.state.size()});
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
