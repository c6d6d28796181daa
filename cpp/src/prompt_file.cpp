#include "specllm/prompt_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

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

void put64(uint8_t * p, uint64_t v) { std::memcpy(p, &v, 8); }
uint64_t get64(const uint8_t * p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

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

size_t state_file_size(size_t n_tokens, size_t n_state) { return header_size + 4 * n_tokens + n_state; }

std::string state_name_prefix(uint64_t identity) { return hex16(identity) + "-"; }

std::string state_file_name(uint64_t identity, const std::vector<llama_token> & tokens) {
    return state_name_prefix(identity) + hex16(mix(tokens.data(), 4 * tokens.size(), basis)) + ".kv";
}

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

bool read_state_header(std::ifstream & in, uintmax_t file_size, StateHeader & h) {
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

uint64_t state_checksum(const std::vector<llama_token> & tokens, const uint8_t * state, size_t n_state) {
    return mix(state, n_state, mix(tokens.data(), 4 * tokens.size(), basis));
}

int write_state_file(const std::string & path, uint64_t identity, const std::vector<llama_token> & tokens,
                     const std::vector<uint8_t> & state) {
    uint8_t head[header_size] = {};
    std::memcpy(head, magic, 8);
    put64(head + 8, identity);
    const uint32_t n = (uint32_t) tokens.size();
    std::memcpy(head + 16, &n, 4);
    put64(head + 24, state.size());
    put64(head + 32, state_checksum(tokens, state.data(), state.size()));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        return errno ? errno : EIO;
    }
    const bool ok = write_all(fd, head, header_size) && write_all(fd, tokens.data(), 4 * tokens.size()) &&
                    write_all(fd, state.data(), state.size());
    const int err = ok ? 0 : (errno ? errno : EIO);
    if (::close(fd) != 0 && ok) {
        return errno ? errno : EIO;
    }
    return err;
}

namespace {

// the size, the first MiB (the metadata: a real GGUF's weights begin megabytes in) and 64 KiB at 64 places spread over
// the rest: the weights of a fine-tune or another quantization of the same size differ there
uint64_t mix_file(const std::string & path, uint64_t h) {
    constexpr size_t head_bytes = 1 << 20, sample_bytes = 64 << 10, n_samples = 64;
    std::error_code ec;
    const uint64_t size = (uint64_t) fs::file_size(path, ec);
    h = mix(&size, sizeof size, h);
    std::ifstream in(path, std::ios::binary);
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
    return h;
}

} // namespace

std::vector<std::string> split_model_files(const std::string & path) {
    // llama.cpp's split naming (llama_split_path): <prefix>-00001-of-<count>.gguf, 5 digits each
    constexpr size_t tail = 20; // "-00001-of-00003.gguf"
    const auto digits = [&](size_t at) {
        for (size_t i = at; i < at + 5; ++i) {
            if (!std::isdigit((unsigned char) path[i])) {
                return false;
            }
        }
        return true;
    };
    if (path.size() <= tail) {
        return {path};
    }
    const size_t at = path.size() - tail;
    if (path.compare(at, 6, "-00001") != 0 || path.compare(at + 6, 4, "-of-") != 0 || !digits(at + 10) ||
        path.compare(at + 15, 5, ".gguf") != 0) {
        return {path};
    }
    const int count = std::stoi(path.substr(at + 10, 5));
    std::vector<std::string> files{path};
    for (int i = 2; i <= count; ++i) {
        char name[tail + 1];
        std::snprintf(name, sizeof name, "-%05d-of-%05d.gguf", i, count);
        files.push_back(path.substr(0, at) + name);
    }
    return files;
}

uint64_t prompt_store_identity(const std::string & model_path, const std::string & options) {
    uint64_t h = basis;
    for (const auto & file : split_model_files(model_path)) { // a split model's other files hold weights too
        h = mix_file(file, h);
    }
    return mix(options.data(), options.size(), h);
}

} // namespace specllm
