#include "specllm/chat.h"

#include "specllm/errors.h"

namespace specllm {

std::string apply_chat_template(const Model & model, const std::vector<ChatMessage> & messages, bool add_assistant,
                                const std::string & tmpl) {
    std::string t = tmpl.empty() ? model.chat_template() : tmpl;
    if (t.empty()) {
        t = "chatml";
    }
    std::vector<llama_chat_message> msgs;
    size_t n_chars = 0;
    for (const auto & m : messages) {
        msgs.push_back({m.first.c_str(), m.second.c_str()});
        n_chars += m.first.size() + m.second.size();
    }
    std::string buf(2 * n_chars + 256, '\0');
    int32_t n = llama_chat_apply_template(t.c_str(), msgs.data(), msgs.size(), add_assistant, buf.data(),
                                          (int32_t) buf.size());
    if (n > (int32_t) buf.size()) {
        buf.resize((size_t) n);
        n = llama_chat_apply_template(t.c_str(), msgs.data(), msgs.size(), add_assistant, buf.data(),
                                      (int32_t) buf.size());
    }
    if (n < 0) {
        throw InvalidArgument("llama.cpp does not know this model's chat template; pass the formatted prompt to "
                              "generate() instead, or give chat_template= one of llama.cpp's built-in names "
                              "(e.g. \"chatml\", \"llama3\", \"gemma\")");
    }
    buf.resize((size_t) n);
    return buf;
}

bool chat_template_known(const std::string & tmpl) {
    const llama_chat_message msg{"user", "hi"};
    char buf[256];
    return llama_chat_apply_template(tmpl.c_str(), &msg, 1, true, buf, (int32_t) sizeof(buf)) >= 0;
}

} // namespace specllm
