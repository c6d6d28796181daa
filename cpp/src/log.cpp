#include "specllm/log.h"

#include "llama.h"

#include <deque>
#include <mutex>

namespace specllm {

namespace {

std::mutex g_mutex;
std::deque<LogRecord> g_records;     // drained by the Python layer
std::string g_errors;                // recent error lines, for exception messages
std::string g_partial;               // a line still being written (llama.cpp logs in pieces)
int g_partial_level = GGML_LOG_LEVEL_INFO;
constexpr size_t n_records_max = 2000;

void on_log(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (text == nullptr) {
        return;
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    if (level != GGML_LOG_LEVEL_CONT) {
        g_partial_level = level;
    }
    g_partial += text;
    size_t pos;
    while ((pos = g_partial.find('\n')) != std::string::npos) {
        LogRecord rec{g_partial_level, g_partial.substr(0, pos)};
        g_partial.erase(0, pos + 1);
        if (rec.text.empty()) {
            continue;
        }
        if (rec.level == GGML_LOG_LEVEL_ERROR) {
            if (g_errors.size() > 4000) {
                g_errors.clear();
            }
            g_errors += rec.text + "\n";
        }
        g_records.push_back(std::move(rec));
        if (g_records.size() > n_records_max) {
            g_records.pop_front();
        }
    }
}

} // namespace

void log_capture_install() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(on_log, nullptr);
        llama_backend_init();
    });
}

void log_note(int level, const std::string & text) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.push_back(LogRecord{level, "specllm: " + text});
    if (g_records.size() > n_records_max) {
        g_records.pop_front();
    }
}

std::vector<LogRecord> log_drain() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<LogRecord> out(g_records.begin(), g_records.end());
    g_records.clear();
    return out;
}

std::string log_take_errors() {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::string out;
    out.swap(g_errors);
    while (!out.empty() && out.back() == '\n') {
        out.pop_back();
    }
    return out;
}

} // namespace specllm
