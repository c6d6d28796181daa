// Chat prompts through the model's own template (llama.cpp's built-in template matcher).
#pragma once

#include "specllm/model.h"

#include <string>
#include <utility>
#include <vector>

namespace specllm {

using ChatMessage = std::pair<std::string, std::string>; // role, content

// formats messages with tmpl (the GGUF's tokenizer.chat_template when empty, chatml when the model has none);
// add_assistant: end with the tokens that open the assistant's reply
std::string apply_chat_template(const Model & model, const std::vector<ChatMessage> & messages, bool add_assistant,
                                const std::string & tmpl = "");

} // namespace specllm
