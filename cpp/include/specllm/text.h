// Turns committed tokens into text: cuts exactly at stop strings (also when one straddles two steps) and
// releases for streaming only complete UTF-8 that cannot turn out to be the start of a stop string.
#pragma once

#include <string>
#include <vector>

namespace specllm {

class TextAssembler {
  public:
    void reset(const std::vector<std::string> & stops);
    // append a token's bytes; returns true when a stop string is complete (the text is cut before it)
    bool push(const std::string & piece);
    // bytes that are safe to stream now
    std::string take_ready();
    // at the end of a generation: everything not yet taken
    std::string take_rest();
    const std::string & text() const { return text_; }

  private:
    std::vector<std::string> stops_;
    size_t max_stop_ = 0;
    std::string text_;
    size_t n_taken_ = 0;
};

// number of trailing bytes of s that form an incomplete UTF-8 sequence (0..3)
size_t utf8_incomplete_tail(const std::string & s);

} // namespace specllm
