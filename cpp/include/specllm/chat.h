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

// whether llama.cpp's template matcher knows tmpl (a built-in name such as "chatml", or a template it recognizes),
// asked without a model: a chat_template= that is neither is refused before the load
bool chat_template_known(const std::string & tmpl);

} // namespace specllm
