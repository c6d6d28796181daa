#include "specllm/grammar.h"

#include "specllm/errors.h"
#include "specllm/gbnf_text.h"
#include "specllm/log.h"
#include "specllm/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <unordered_set>
#include <unistd.h>

namespace specllm {

namespace {

// a grammar sampler, lazy when there are trigger patterns; nullptr (and why, if llama.cpp threw) when it fails
llama_sampler * init(const llama_vocab * vocab, const std::string & gbnf, const std::vector<std::string> & patterns,
                     std::string & error) {
    try {
        if (patterns.empty()) {
            return llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
        }
        std::vector<const char *> p;
        for (const std::string & s : patterns) {
            p.push_back(s.c_str());
        }
        return llama_sampler_init_grammar_lazy_patterns(vocab, gbnf.c_str(), "root", p.data(), p.size(), nullptr, 0);
    } catch (const std::exception & e) {
        error = e.what();
        return nullptr;
    }
}

// llama.cpp's grammar parser prints its error (and the whole grammar) to stderr with fprintf: capture that for the
// error message instead of printing it. Returns the parser's first line, without the function name. The capture
// holds the process's stderr for the parse (a line another thread writes then is lost), so a grammar that parsed
// once is parsed again without it: a server checks and starts the same JSON grammar request after request.
llama_sampler * init_quietly(const llama_vocab * vocab, const std::string & gbnf,
                             const std::vector<std::string> & patterns, std::string & parse_error) {
    static std::mutex m;
    static std::unordered_set<std::string> parsed;
    std::lock_guard<std::mutex> lock(m);
    const std::string key = (vocab != nullptr ? std::to_string(llama_vocab_n_tokens(vocab)) : std::string("-")) + "|" +
                            gbnf; // tokens may be named
    if (parsed.count(key) != 0) {
        return init(vocab, gbnf, patterns, parse_error);
    }
    std::fflush(stderr);
    FILE * tmp = std::tmpfile();
    const int saved = tmp != nullptr ? dup(2) : -1;
    if (saved >= 0) {
        dup2(fileno(tmp), 2);
    }
    std::string thrown;
    llama_sampler * s = init(vocab, gbnf, patterns, thrown);
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
    if (parse_error.empty()) {
        parse_error = thrown;
    }
    if (tmp != nullptr) {
        std::fclose(tmp);
    }
    if (s != nullptr) {
        if (parsed.size() >= 256) {
            parsed.clear();
        }
        parsed.insert(key);
    }
    return s;
}

// a trigger word as the regex llama.cpp's lazy grammar searches the output for (llama-server's regex_escape)
std::string escaped(const std::string & word) {
    static const std::string special = ".^$|()*+?[]{}\\";
    std::string out;
    for (char c : word) {
        if (special.find(c) != std::string::npos) {
            out += '\\';
        }
        out += c;
    }
    return out;
}

std::string piece_of(const llama_vocab * vocab, llama_token t) { // as the grammar reads it (special tokens' text)
    char buf[256];
    const int n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, true);
    if (n >= 0) {
        return std::string(buf, (size_t) n);
    }
    std::string big((size_t) -n, '\0');
    const int m = llama_token_to_piece(vocab, t, big.data(), (int32_t) big.size(), 0, true);
    big.resize((size_t) std::max(m, 0));
    return big;
}

} // namespace

Grammar::Grammar(const llama_vocab * vocab, const std::string & gbnf, const std::vector<std::string> & triggers,
                 const std::vector<std::string> & patterns)
    : vocab_(vocab), smpl_(nullptr), triggers_(triggers), awaiting_(!triggers.empty() || !patterns.empty()) {
    check_gbnf_text(gbnf, triggers, patterns);
    std::vector<std::string> searched; // what llama.cpp searches the output for: the words as regexes, the patterns
    for (const std::string & word : triggers) {
        if (word.empty()) {
            throw InvalidArgument("a grammar trigger is empty; pass the words after which the grammar holds");
        }
        searched.push_back(escaped(word));
    }
    auto compiled = std::make_shared<std::vector<std::regex>>();
    for (const std::string & p : patterns) {
        try {
            compiled->emplace_back(p);
        } catch (const std::regex_error & e) {
            throw InvalidArgument("the grammar trigger pattern '" + p + "' is not a regular expression (ECMAScript): " +
                                  e.what());
        }
        searched.push_back(p);
    }
    patterns_ = compiled;
    log_take_errors(); // only this parse's errors below
    std::string why;
    smpl_ = init_quietly(vocab, gbnf, searched, why);
    if (smpl_ == nullptr) {
        if (why.empty()) {
            why = log_take_errors(); // a missing root rule, left recursion: logged through llama.cpp's log
        }
        throw InvalidArgument("the grammar could not be parsed as GBNF with a 'root' rule" +
                              (why.empty() ? std::string() : ": " + why));
    }
    try {
        if (awaiting_) {
            fresh_ = std::shared_ptr<llama_sampler>(llama_sampler_clone(smpl_), llama_sampler_free);
        }
        check_triggers(triggers);
    } catch (...) { // no destructor runs for an object whose constructor throws
        llama_sampler_free(smpl_);
        smpl_ = nullptr;
        throw;
    }
}

std::string gbnf_error(const std::string & gbnf) {
    if (names_tokens(gbnf)) {
        return std::string(); // read with the model's vocabulary: checked once it is loaded
    }
    log_capture_install(); // llama.cpp's log of a missing root or left recursion, as after a load
    try {
        Grammar parsed(nullptr, gbnf);
    } catch (const InvalidArgument & e) {
        log_take_errors(); // what llama.cpp logged is in the message: not for the next call's log
        return e.what();
    }
    return std::string();
}

// the grammar must read each word as its beginning
void Grammar::check_triggers(const std::vector<std::string> & triggers) const {
    for (const std::string & word : triggers) {
        std::vector<llama_token> tokens(word.size() + 8);
        const int n = llama_tokenize(vocab_, word.c_str(), (int32_t) word.size(), tokens.data(),
                                     (int32_t) tokens.size(), false, true);
        Grammar g(*this);
        bool ok = n > 0;
        for (int i = 0; ok && i < n; ++i) {
            ok = g.allows(tokens[(size_t) i]);
            if (ok) {
                g.accept(tokens[(size_t) i]);
            }
        }
        if (!ok || g.awaiting_) {
            const std::string shown = word.size() > 60 ? word.substr(0, 57) + "..." : word;
            throw InvalidArgument("the grammar does not begin with its trigger '" + shown + "': a lazy grammar holds "
                                  "from the trigger on, so its root must start with each trigger's text");
        }
    }
}

Grammar::Grammar(const Grammar & other)
    : vocab_(other.vocab_), smpl_(llama_sampler_clone(other.smpl_)), triggers_(other.triggers_),
      patterns_(other.patterns_), awaiting_(other.awaiting_), text_(other.text_), fresh_(other.fresh_),
      gave_up_(other.gave_up_) {}

Grammar::~Grammar() {
    if (smpl_ != nullptr) {
        llama_sampler_free(smpl_);
    }
}

void Grammar::swap_state(Grammar & other) {
    std::swap(smpl_, other.smpl_);
    std::swap(awaiting_, other.awaiting_);
    std::swap(text_, other.text_);
    std::swap(gave_up_, other.gave_up_);
}

bool Grammar::allows(llama_token t) {
    if (awaiting_) {
        return true; // a word that would start what the grammar cannot read does not trigger it (accept)
    }
    llama_token_data one{t, 0.0f, 0.0f};
    llama_token_data_array arr{&one, 1, -1, false};
    llama_sampler_apply(smpl_, &arr);
    return one.logit > -INFINITY;
}

bool Grammar::may_trigger(const std::string & piece) const {
    for (const std::string & word : triggers_) {
        const size_t keep = std::min(text_.size(), word.size() - 1);
        if ((text_.substr(text_.size() - keep) + piece).find(word) != std::string::npos) {
            return true;
        }
    }
    if (patterns_ && !patterns_->empty()) { // llama.cpp searches the whole text at every token (a ^...$ pattern is
        const std::string all = text_ + piece; // matched against it first, and searched if that fails)
        for (const std::regex & re : *patterns_) {
            if (std::regex_search(all, re)) {
                return true;
            }
        }
    }
    return false;
}

void Grammar::accept(llama_token t) {
    if (!awaiting_) {
        llama_sampler_accept(smpl_, t);
        return;
    }
    if (gave_up_) {
        return;
    }
    const std::string piece = piece_of(vocab_, t);
    if (!may_trigger(piece)) {
        llama_sampler_accept(smpl_, t); // llama.cpp keeps the text and searches it for the words
        text_ += piece;
        size_t longest = 0;
        for (const std::string & word : triggers_) {
            longest = std::max(longest, word.size());
        }
        if (patterns_->empty() && text_.size() > 4 * longest + 4096) {
            text_.erase(0, text_.size() - longest - 1024); // only the tail can hold the start of a word
        }
        return;
    }
    try {
        llama_sampler_accept(smpl_, t); // triggered: the text from the word on is read by the grammar
    } catch (const std::exception &) {  // ... which cannot read it: still waiting, the text so far left behind.
        // Kept (as before this token in llama.cpp's buffer, without the token), a later token joined the text
        // before it into a word the output does not hold ("n" + "e" around a failed "ed"), and the grammar held
        // from there: the reply broke it
        llama_sampler_free(smpl_);
        smpl_ = llama_sampler_clone(fresh_.get());
        text_.clear();
        gave_up_ = patterns_ && !patterns_->empty();
        return;
    }
    awaiting_ = false;
    text_.clear();
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
    if (awaiting_) {
        out.assign(logits, logits + n_vocab);
        return;
    }
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

std::unique_ptr<Grammar> make_grammar(const llama_vocab * vocab, const GenerateOptions & opts) {
    if (opts.grammar.empty()) {
        if (!opts.grammar_triggers.empty() || !opts.grammar_trigger_patterns.empty()) {
            throw InvalidArgument("grammar_triggers need a grammar: they say where it begins to hold");
        }
        return nullptr;
    }
    if (opts.ignore_eos) {
        throw InvalidArgument("a grammar ends the output where its text is complete: it cannot be combined with "
                              "ignore_eos");
    }
    return std::make_unique<Grammar>(vocab, opts.grammar, opts.grammar_triggers, opts.grammar_trigger_patterns);
}

} // namespace specllm
