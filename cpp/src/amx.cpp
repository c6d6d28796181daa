// llama.cpp's AMX weight buffer and the rule that keeps specllm's models out of it where its build is unsound
// (specllm/amx.h).
#include "specllm/amx.h"

#include "specllm/log.h"

#include "llama.h"

#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace specllm {

namespace {

using get_extra_bufts_t = ggml_backend_buffer_type_t * (*)(ggml_backend_dev_t);

// the CPU backend's "list extra buffer types" function (it lives in the CPU backend's library), or null
get_extra_bufts_t extra_bufts_function(ggml_backend_dev_t cpu) {
    return cpu ? (get_extra_bufts_t) ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu),
                                                                       "ggml_backend_dev_get_extra_bufts")
               : nullptr;
}

// whether the CPU backend lists llama.cpp's AMX buffer among its extra weight buffer types
bool cpu_offers_amx() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    get_extra_bufts_t get = extra_bufts_function(cpu);
    for (ggml_backend_buffer_type_t * b = get ? get(cpu) : nullptr; b && *b; ++b) {
        if (std::strcmp(ggml_backend_buft_name(*b), "AMX") == 0) {
            return true;
        }
    }
    return false;
}

// the .comment section of a 64-bit ELF file, its NUL-separated strings one per line ("" if absent or unreadable)
std::string elf_comment(const char * path) {
    constexpr size_t max_section = 1 << 20;
    std::ifstream f(path, std::ios::binary);
    Elf64_Ehdr eh{};
    if (!f.read(reinterpret_cast<char *>(&eh), sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shstrndx >= eh.e_shnum) {
        return {};
    }
    std::vector<Elf64_Shdr> sections(eh.e_shnum);
    f.seekg(static_cast<std::streamoff>(eh.e_shoff));
    if (!f.read(reinterpret_cast<char *>(sections.data()), std::streamsize(sections.size() * sizeof(Elf64_Shdr)))) {
        return {};
    }
    auto contents = [&](const Elf64_Shdr & s) {
        std::string data(s.sh_size <= max_section ? s.sh_size : 0, '\0');
        f.seekg(static_cast<std::streamoff>(s.sh_offset));
        if (!f.read(data.data(), std::streamsize(data.size()))) {
            data.clear();
        }
        return data;
    };
    const std::string names = contents(sections[eh.e_shstrndx]);
    for (const Elf64_Shdr & s : sections) {
        if (s.sh_name < names.size() && std::strcmp(names.c_str() + s.sh_name, ".comment") == 0) {
            std::string text = contents(s);
            std::replace(text.begin(), text.end(), '\0', '\n');
            std::string lines; // the non-empty ones
            std::istringstream in(text);
            for (std::string line; std::getline(in, line);) {
                if (!line.empty()) {
                    lines += line + "\n";
                }
            }
            return lines;
        }
    }
    return {};
}

} // namespace

std::string cpu_backend_compilers() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    Dl_info info{};
    get_extra_bufts_t get = extra_bufts_function(cpu);
    if (!get || !dladdr(reinterpret_cast<void *>(get), &info) || !info.dli_fname) {
        return {};
    }
    return elf_comment(info.dli_fname);
}

bool amx_build_sound(const std::string & compilers) {
    if (compilers.find("clang version") != std::string::npos) {
        return true; // clang's _tile_loadconfig is a builtin (GCC lines beside it come from the C runtime's objects)
    }
    bool gcc_seen = false;
    std::istringstream in(compilers);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("GCC: ", 0) == 0) {
            // "GCC: (Debian 12.2.0-14) 12.2.0": the version is the last word
            const size_t last = line.find_last_of(' ');
            const int major = std::atoi(line.c_str() + last + 1);
            if (major < 14) {
                return false;
            }
            gcc_seen = true;
        }
    }
    return gcc_seen;
}

bool weight_repacking_allowed() {
    static const bool allowed = [] {
        if (!cpu_offers_amx()) {
            return true;
        }
        const char * env = std::getenv("SPECLLM_AMX");
        if (env && (std::strcmp(env, "1") == 0 || std::strcmp(env, "0") == 0)) {
            return env[0] == '1';
        }
        std::string compilers = cpu_backend_compilers();
        if (amx_build_sound(compilers)) {
            return true;
        }
        std::replace(compilers.begin(), compilers.end(), '\n', ';');
        log_note(3, "weight repacking is off: llama.cpp would put the weights in its AMX buffer, and its AMX matmul as "
                    "built here (" + (compilers.empty() ? std::string("compiler unknown") : compilers) +
                    ") loads a tile configuration that GCC before 14 leaves unwritten, which crashes (SIGSEGV). "
                    "llama-cpp-python built with clang or GCC 14+ keeps repacking on (README Limits); "
                    "SPECLLM_AMX=1 turns it on anyway");
        return false;
    }();
    return allowed;
}

} // namespace specllm
