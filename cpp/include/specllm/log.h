// llama.cpp's log output, captured instead of printed. The Python layer drains it into logging("specllm").
#pragma once

#include <string>
#include <vector>

namespace specllm {

struct LogRecord {
    int level;        // ggml_log_level: 1 debug, 2 info, 3 warn, 4 error
    std::string text; // one line, without the newline
};

// route llama.cpp and ggml logging into the capture buffer (idempotent, thread-safe)
void log_capture_install();

// a line of specllm's own (text starts with "specllm: "), drained with llama.cpp's
void log_note(int level, const std::string & text);

// take every captured line since the last call
std::vector<LogRecord> log_drain();

// the last error-level lines (kept apart from the drain), for error messages; cleared by the call
std::string log_take_errors();

} // namespace specllm
