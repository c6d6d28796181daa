#include "specllm/text.h"

#include <algorithm>

namespace specllm {

size_t utf8_incomplete_tail(const std::string & s) {
    const size_t n = s.size();
    for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
        const unsigned char c = (unsigned char) s[n - back];
        if ((c & 0xC0) == 0x80) {
            continue; // continuation byte: look further back for the lead byte
        }
        size_t need = 1;
        if ((c & 0xE0) == 0xC0) {
            need = 2;
        } else if ((c & 0xF0) == 0xE0) {
            need = 3;
        } else if ((c & 0xF8) == 0xF0) {
            need = 4;
        }
        return need > back ? back : 0;
    }
    return 0; // only continuation bytes: nothing sensible to wait for
}

void TextAssembler::reset(const std::vector<std::string> & stops) {
    stops_.clear();
    max_stop_ = 0;
    for (const auto & s : stops) {
        if (!s.empty()) {
            stops_.push_back(s);
            max_stop_ = std::max(max_stop_, s.size());
        }
    }
    text_.clear();
    n_taken_ = 0;
}

bool TextAssembler::push(const std::string & piece) {
    const size_t old = text_.size();
    text_ += piece;
    if (stops_.empty()) {
        return false;
    }
    // a stop string can only end inside the new bytes
    const size_t from = old >= max_stop_ ? old - max_stop_ + 1 : 0;
    size_t cut = std::string::npos;
    for (const auto & s : stops_) {
        const size_t pos = text_.find(s, from);
        cut = std::min(cut, pos);
    }
    if (cut == std::string::npos) {
        return false;
    }
    text_.resize(std::max(cut, n_taken_));
    return true;
}

std::string TextAssembler::take_ready() {
    size_t end = text_.size() - utf8_incomplete_tail(text_);
    // hold back a suffix that may still grow into a stop string
    for (const auto & s : stops_) {
        for (size_t n = std::min(s.size() - 1, text_.size()); n > 0; --n) {
            if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
                end = std::min(end, text_.size() - n);
                break;
            }
        }
    }
    if (end <= n_taken_) {
        return std::string();
    }
    std::string out = text_.substr(n_taken_, end - n_taken_);
    n_taken_ = end;
    return out;
}

std::string TextAssembler::take_rest() {
    std::string out = text_.substr(std::min(n_taken_, text_.size()));
    n_taken_ = text_.size();
    return out;
}

} // namespace specllm
