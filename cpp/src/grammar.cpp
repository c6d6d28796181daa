#include "specllm/grammar.h"

#include "specllm/errors.h"
#include "specllm/log.h"
#include "specllm/sampling.h"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <unistd.h>

namespace specllm {

namespace {

// llama.cpp's grammar parser prints its error (and the whole grammar) to stderr with fprintf: capture that for the
// error message instead of printing it. Returns the parser's first line, without the function name.
llama_sampler * init_quietly(const llama_vocab * vocab, const std::string & gbnf, std::string & parse_error) {
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    std::fflush(stderr);
    FILE * tmp = std::tmpfile();
    const int saved = tmp != nullptr ? dup(2) : -1;
    if (saved >= 0) {
        dup2(fileno(tmp), 2);
    }
    llama_sampler * s = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
    if (saved >= 0) {
        std::fflush(stderr);
        dup2(saved, 2);
        close(saved);
        std::rewind(tmp);
        char line[1024];
        const std::string marker = "error parsing grammar: ";
        while (parse_error.empty() && std::fgets(line, sizeof line, tmp) != nullptr) {
            std::string text(line);
            const size_t at = text.find(marker);
            if (at != std::string::npos) {
                parse_error = text.substr(at + marker.size());
                while (!parse_error.empty() && (parse_error.back() == '\n' || parse_error.back() == '\r')) {
                    parse_error.pop_back();
                }
            }
        }
    }
    if (tmp != nullptr) {
        std::fclose(tmp);
    }
    return s;
}

} // namespace

Grammar::Grammar(const llama_vocab * vocab, const std::string & gbnf) : vocab_(vocab), smpl_(nullptr) {
    if (gbnf.find_first_not_of(" \t\r\n") == std::string::npos) {
        throw InvalidArgument("the grammar is empty; pass GBNF rules with a 'root' rule (e.g. root ::= \"yes\" | "
                              "\"no\"), or no grammar");
    }
    log_take_errors(); // only this parse's errors below
    std::string why;
    smpl_ = init_quietly(vocab, gbnf, why);
    if (smpl_ == nullptr) {
        if (why.empty()) {
            why = log_take_errors(); // a missing root rule, left recursion: logged through llama.cpp's log
        }
        throw InvalidArgument("the grammar could not be parsed as GBNF with a 'root' rule" +
                              (why.empty() ? std::string() : ": " + why));
    }
}

Grammar::Grammar(const Grammar & other) : vocab_(other.vocab_), smpl_(llama_sampler_clone(other.smpl_)) {}

Grammar::~Grammar() {
    if (smpl_ != nullptr) {
        llama_sampler_free(smpl_);
    }
}

bool Grammar::allows(llama_token t) {
    llama_token_data one{t, 0.0f, 0.0f};
    llama_token_data_array arr{&one, 1, -1, false};
    llama_sampler_apply(smpl_, &arr);
    return one.logit > -INFINITY;
}

void Grammar::accept(llama_token t) {
    llama_sampler_accept(smpl_, t);
}

int Grammar::legal_prefix(const std::vector<llama_token> & tokens) const {
    Grammar g(*this);
    int n = 0;
    for (llama_token t : tokens) {
        if (!g.allows(t)) {
            break;
        }
        ++n;
        if (llama_vocab_is_eog(vocab_, t)) {
            break; // the generation ends there; nothing after it is verified
        }
        g.accept(t);
    }
    return n;
}

void Grammar::mask(const float * logits, int n_vocab, std::vector<float> & out) {
    cand_.resize((size_t) n_vocab);
    for (int i = 0; i < n_vocab; ++i) {
        cand_[(size_t) i] = llama_token_data{i, logits[i], 0.0f};
    }
    llama_token_data_array arr{cand_.data(), cand_.size(), -1, false};
    llama_sampler_apply(smpl_, &arr);
    out.resize((size_t) n_vocab);
    bool any = false;
    for (size_t i = 0; i < arr.size; ++i) { // apply keeps the order and only lowers logits to -inf
        out[(size_t) cand_[i].id] = cand_[i].logit;
        any = any || cand_[i].logit > -INFINITY;
    }
    if (!any) {
        const llama_token eos = llama_vocab_eos(vocab_);
        out[(size_t) (eos >= 0 && eos < n_vocab ? eos : 0)] = 0.0f;
    }
}

ConstrainedRows::ConstrainedRows(Grammar & grammar, const std::vector<llama_token> & draft, const LogitsRow & row,
                                 int n_vocab, bool greedy)
    : committed_(grammar), work_(grammar), draft_(draft), row_(row), n_vocab_(n_vocab), greedy_(greedy) {}

const float * ConstrainedRows::read(int i) {
    while (at_ < i) { // row i is read once drafts before it were accepted; the legal prefix keeps them allowed
        work_.accept(draft_[(size_t) at_++]);
    }
    const float * logits = row_(i);
    if (greedy_ && work_.allows(argmax(logits, n_vocab_))) {
        return logits;
    }
    work_.mask(logits, n_vocab_, masked_);
    return masked_.data();
}

void ConstrainedRows::advance(int n_accepted, llama_token next, bool end) {
    while (at_ < n_accepted) {
        work_.accept(draft_[(size_t) at_++]);
    }
    if (!end) {
        work_.accept(next);
    }
    std::swap(committed_.smpl_, work_.smpl_); // the committed state becomes the work's; the old one is freed
}

} // namespace specllm
