// llama.cpp's AMX weight buffer and the rule that keeps the process's models out of it where its build is unsound
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

// the CPU backend's null-terminated list of extra weight buffer types, as llama.cpp reads it at a model load (the
// CPU backend keeps it in a static vector, so edits to it last), or null
ggml_backend_buffer_type_t * extra_bufts() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    get_extra_bufts_t get = extra_bufts_function(cpu);
    return get ? get(cpu) : nullptr;
}

// whether the list holds a buffer type called `name`
bool extra_buft_listed(const char * name) {
    for (ggml_backend_buffer_type_t * b = extra_bufts(); b && *b; ++b) {
        if (std::strcmp(ggml_backend_buft_name(*b), name) == 0) {
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

bool amx_offered() {
    static const bool offered = extra_buft_listed("AMX");
    return offered;
}

int drop_extra_buffer_type(const std::string & name) {
    int dropped = 0;
    ggml_backend_buffer_type_t * list = extra_bufts();
    ggml_backend_buffer_type_t * out = list;
    for (ggml_backend_buffer_type_t * b = list; b && *b; ++b) {
        if (name == ggml_backend_buft_name(*b)) {
            ++dropped;
        } else {
            *out++ = *b;
        }
    }
    if (out) {
        *out = nullptr; // still terminated: the list only shrinks
    }
    return dropped;
}

bool amx_rule() {
    static const bool kept = [] {
        if (!amx_offered()) {
            return false;
        }
        const char * env = std::getenv("SPECLLM_AMX");
        if (env && std::strcmp(env, "1") == 0) {
            return true;
        }
        if (env && std::strcmp(env, "0") == 0) {
            drop_extra_buffer_type("AMX");
            return false;
        }
        std::string compilers = cpu_backend_compilers();
        if (amx_build_sound(compilers)) {
            return true;
        }
        drop_extra_buffer_type("AMX");
        std::replace(compilers.begin(), compilers.end(), '\n', ';');
        log_note(3, "llama.cpp's AMX weight buffer is left out (weights are repacked for the CPU's other kernels): "
                    "its AMX matmul as built here (" +
                    (compilers.empty() ? std::string("compiler unknown") : compilers) +
                    ") loads a tile configuration that GCC before 14 leaves unwritten, which crashes (SIGSEGV). "
                    "llama-cpp-python built with clang or GCC 14+ keeps AMX (README Limits); SPECLLM_AMX=1 keeps it "
                    "anyway");
        return false;
    }();
    return kept;
}

} // namespace specllm
