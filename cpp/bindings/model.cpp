#include "bindings.h"

#include "specllm/boundary.h"
#include "specllm/chat.h"
#include "specllm/errors.h"
#include "specllm/grammar.h"
#include "specllm/model.h"

using namespace specllm;

namespace {

// a token list from Python, each in the model's vocabulary, or InvalidArgument naming `what`
void check_vocab(const Model & model, const std::vector<llama_token> & tokens, const char * what) {
    for (llama_token t : tokens) {
        if (t < 0 || t >= model.n_vocab()) {
            throw InvalidArgument(std::string(what) + ": token " + std::to_string(t) + " is not in the vocabulary "
                                  "(0.." + std::to_string(model.n_vocab() - 1) + ")");
        }
    }
}

py::str token_text(const Model & self, llama_token t) {
    const char * text = t == LLAMA_TOKEN_NULL ? nullptr : llama_vocab_get_text(self.vocab(), t);
    return utf8_str(text ? std::string(text) : std::string());
}

} // namespace

void register_model(py::module_ & m) {
    m.attr("max_vocab_size_difference") = max_vocab_size_difference; // the padded entries a draft's size may differ by
    py::class_<Model>(m, "Model")
        .def_property_readonly("n_ctx", &Model::n_ctx)
        .def_property_readonly("n_vocab", &Model::n_vocab)
        .def_property_readonly("vocab_hash", &Model::vocab_hash)
        .def_property_readonly("n_batch", &Model::n_batch)
        .def_property_readonly("description", &Model::description)
        .def_property_readonly("chat_template", &Model::chat_template)
        .def_property_readonly("tool_use_template", &Model::tool_use_template)
        .def_property_readonly("n_past", &Model::n_past)
        .def_property_readonly("can_rollback", &Model::can_rollback)
        .def_property_readonly("cached", &Model::cached)
        .def_property_readonly("state_size", &Model::state_size) // bytes of the cache's state (a prompt state's)
        .def_property_readonly("memory_pos_min", &Model::memory_pos_min)
        .def_property_readonly("memory_pos_max", &Model::memory_pos_max)
        .def("check_grammar",
             [](const Model & self, const std::string & gbnf, const std::vector<std::string> & triggers,
                const std::vector<std::string> & patterns) { Grammar g(self.vocab(), gbnf, triggers, patterns); },
             py::arg("gbnf"), py::arg("triggers") = std::vector<std::string>(),
             py::arg("patterns") = std::vector<std::string>(),
             "InvalidArgument (ValueError) with the parser's message unless gbnf is a grammar (that begins with "
             "each trigger word, if any)")
        .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("add_special") = true,
             py::arg("parse_special") = true, py::call_guard<released>()) // long texts take seconds
        .def("piece", [](const Model & self, llama_token t, bool special) { return py::bytes(self.piece(t, special)); },
             py::arg("token"), py::arg("special") = false)
        .def("detokenize", [](const Model & self, const std::vector<llama_token> & tokens, bool special) {
            std::string s;
            for (llama_token t : tokens) {
                s += self.piece(t, special);
            }
            return utf8_str(s);
        }, py::arg("tokens"), py::arg("special") = false)
        // the texts of BOS and EOS ("" if the model has none): what a Jinja chat template's bos_token/eos_token are
        .def_property_readonly("bos_text", [](const Model & self) { return token_text(self, llama_vocab_bos(self.vocab())); })
        .def_property_readonly("eos_text", [](const Model & self) { return token_text(self, llama_vocab_eos(self.vocab())); })
        // the fill-in-the-middle tokens (-1 where the model has none): infill.py
        .def_property_readonly("fim_tokens", [](const Model & self) {
            const llama_vocab * v = self.vocab();
            py::dict d;
            d["pre"] = llama_vocab_fim_pre(v);
            d["suf"] = llama_vocab_fim_suf(v);
            d["mid"] = llama_vocab_fim_mid(v);
            d["rep"] = llama_vocab_fim_rep(v); // the repo-level form's repository name and file separator
            d["sep"] = llama_vocab_fim_sep(v);
            return d;
        })
        .def("is_eog", &Model::is_eog)
        .def("sentence_boundary", [](const Model & self, llama_token last, const std::vector<llama_token> & draft) {
            // boundary.h: the first draft position right after the end of a sentence (-1 = none)
            check_vocab(self, draft, "sentence_boundary");
            return sentence_boundary(self, last >= 0 && last < self.n_vocab() ? last : -1, draft.data(),
                                     (int) draft.size());
        }, py::arg("last"), py::arg("draft"))
        .def("cut_after_end", [](const Model & self, std::vector<llama_token> draft) {
            // boundary.h: the draft up to and including its first end-of-turn token
            check_vocab(self, draft, "cut_after_end");
            cut_after_end(self, draft);
            return draft;
        }, py::arg("draft"))
        .def("apply_chat_template", [](const Model & self, const std::vector<ChatMessage> & msgs, bool add_assistant,
                                       const std::string & tmpl) {
            return apply_chat_template(self, msgs, add_assistant, tmpl);
        }, py::arg("messages"), py::arg("add_assistant") = true, py::arg("template") = "");
}
