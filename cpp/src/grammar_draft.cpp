// Drafts a grammar makes for free: where the grammar leaves one way on (a JSON schema's keys, quotes, colons and
// commas; a forced tool call's name and argument keys), that text is drafted for the target to verify. Found one
// character at a time by asking the grammar which single-character tokens it allows (~100 checks, not the 152k of
// a whole mask); where whitespace may go either way, the reply's own habit decides (what it wrote after the same
// character before; a space after ',' and ':' by default), so a guess costs at most a rejected draft.
#include "specllm/grammar.h"

#include "specllm/model.h"

#include <array>
#include <cmath>
#include <mutex>
#include <unordered_map>

namespace specllm {

namespace {

constexpr bool is_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// the token whose text is exactly each ASCII character (tab, newline, printable), -1 where the vocabulary has none
using CharTokens = std::array<llama_token, 128>;

std::string piece_of(const llama_vocab * vocab, llama_token t) {
    char buf[16];
    const int n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, true); // as the grammar reads tokens
    return n > 0 ? std::string(buf, (size_t) n) : std::string();
}

const CharTokens & char_tokens(const llama_vocab * vocab) {
    static std::mutex m;
    static std::unordered_map<const llama_vocab *, CharTokens> cache;
    std::lock_guard<std::mutex> lock(m);
    auto it = cache.find(vocab);
    if (it != cache.end()) { // a vocabulary freed and another allocated at its address: checked, rebuilt if so
        bool same = true;
        for (int c = 0; c < 128 && same; ++c) {
            const llama_token t = it->second[(size_t) c];
            same = t < 0 || (t < llama_vocab_n_tokens(vocab) && piece_of(vocab, t) == std::string(1, (char) c));
        }
        if (same) {
            return it->second;
        }
    }
    CharTokens table;
    table.fill(-1);
    const int n = llama_vocab_n_tokens(vocab);
    for (llama_token t = 0; t < n; ++t) {
        const std::string p = piece_of(vocab, t);
        if (p.size() == 1 && (unsigned char) p[0] < 128 && table[(size_t) p[0]] < 0 &&
            (p[0] == '\t' || p[0] == '\n' || (p[0] >= 0x20 && p[0] < 0x7f))) {
            table[(size_t) p[0]] = t;
        }
    }
    return cache[vocab] = table;
}

// what followed `prev` the last time the reply wrote it, if that was whitespace or `next` (the one other character
// the grammar allows; 0 if none): the whitespace run to write, or "" to write `next`. Not found: a space after ','
// and ':', nothing elsewhere. Sets `known` false when no rule applies
std::string habit(const std::string & text, char prev, char next, bool & known) {
    known = true;
    for (size_t i = text.size() >= 2 ? text.size() - 1 : 0; i-- > 0;) {
        if (text[i] != prev) {
            continue;
        }
        size_t j = i + 1;
        while (j < text.size() && is_space(text[j])) {
            ++j;
        }
        if (j > i + 1) {
            return text.substr(i + 1, j - i - 1);
        }
        if (next != 0 && text[i + 1] == next) {
            return "";
        }
    }
    if (prev == ',' || prev == ':') {
        return " ";
    }
    known = next != 0;
    return "";
}

} // namespace

std::string Grammar::forced_text(const std::string & reply, size_t max_chars, bool * joins) const {
    if (awaiting_) {
        return ""; // a lazy grammar forces nothing before its trigger
    }
    const CharTokens & table = char_tokens(vocab_);
    const llama_token eos = llama_vocab_eos(vocab_);
    std::vector<llama_token_data> cand; // the single-character tokens (and the end), asked at every character
    std::string chars;                  // ... and their characters (0 for the end)
    for (int c = 0; c < 128; ++c) {
        if (table[(size_t) c] >= 0) {
            cand.push_back(llama_token_data{table[(size_t) c], 0.0f, 0.0f});
            chars += (char) c;
        }
    }
    if (eos >= 0) {
        cand.push_back(llama_token_data{eos, 0.0f, 0.0f});
        chars += '\0';
    }
    Grammar g(*this);
    std::string text = reply;  // the reply and the forced text after it
    std::string pending;       // whitespace the habit chose, written one character at a time
    std::string spaces, others; // what the grammar allows at the current character
    bool may_end = false;
    while (text.size() - reply.size() < max_chars) {
        for (auto & t : cand) {
            t.logit = 0.0f;
        }
        llama_token_data_array arr{cand.data(), cand.size(), -1, false};
        llama_sampler_apply(g.smpl_, &arr); // keeps the order, lowers what is forbidden to -inf
        spaces.clear();
        others.clear();
        for (size_t i = 0; i < cand.size(); ++i) {
            if (cand[i].logit != -INFINITY) {
                may_end = may_end || chars[i] == '\0';
                (is_space(chars[i]) ? spaces : others) += chars[i];
            }
        }
        if (may_end) {
            break; // the text may end here
        }
        char c = 0;
        if (!pending.empty()) {
            c = spaces.find(pending[0]) != std::string::npos ? pending[0] : 0;
            pending.erase(0, 1);
        } else if (spaces.empty() && others.size() == 1) {
            c = others[0];
        } else if (!spaces.empty() && others.size() <= 1) {
            bool known = false;
            const std::string ws = text.empty() ? std::string() : habit(text, text.back(), others.empty() ? 0 :
                                                                                          others[0], known);
            if (!known) {
                break;
            }
            if (ws.empty()) {
                c = others.empty() ? 0 : others[0];
            } else {
                c = spaces.find(ws[0]) != std::string::npos ? ws[0] : 0;
                pending = ws.substr(1);
            }
        }
        if (c == 0) {
            break;
        }
        g.accept(table[(size_t) (unsigned char) c]);
        text += c;
    }
    if (joins != nullptr) { // a newline may come next, and tokenizers write it with what precedes ("{\n")
        bool known = false;
        const std::string ws = text.empty() ? std::string() : habit(text, text.back(), 0, known);
        *joins = !may_end && spaces.find('\n') != std::string::npos && (!known || (!ws.empty() && ws[0] == '\n'));
    }
    return text.substr(reply.size());
}

std::vector<llama_token> forced_draft(const Grammar & grammar, const Model & target, const std::string & reply,
                                      int max_tokens) {
    if (max_tokens <= 0) {
        return {};
    }
    bool joins = false;
    std::string text = grammar.forced_text(reply, (size_t) (8 * max_tokens), &joins);
    // what may join the next, free text in one token (" true", "\"The", "[\"") is left for the target to write
    while (!text.empty() && (is_space(text.back()) || text.back() == '"' || text.back() == '[')) {
        text.pop_back();
    }
    if (text.empty()) {
        return {};
    }
    // tokenized after the reply's last characters, as the target reads it in context (a tokenizer may merge
    // across the boundary, and a SentencePiece one puts a space before text that starts a tokenization); the
    // tokens after those characters are the draft, none if one straddles the boundary
    const std::string tail = reply.substr(reply.size() - std::min(reply.size(), (size_t) 16));
    std::vector<llama_token> tokens = target.tokenize(tail + text, false, false);
    std::vector<size_t> ends; // characters covered after each token
    size_t n = 0;
    for (llama_token t : tokens) {
        ends.push_back(n += target.piece(t).size());
    }
    if (n < tail.size() + text.size()) {
        return {};
    }
    const size_t split = n - text.size(); // a space put before the text counts with the tail
    size_t i = 0;
    while (i < ends.size() && ends[i] < split) {
        ++i;
    }
    if (split > 0 && (i == ends.size() || ends[i] != split)) {
        return {};
    }
    tokens.erase(tokens.begin(), tokens.begin() + (long) (split > 0 ? i + 1 : 0));
    if (joins && !tokens.empty()) {
        tokens.pop_back(); // its last characters may go into one token with the newline after them
    }
    if ((int) tokens.size() > max_tokens) {
        tokens.resize((size_t) max_tokens);
    }
    return tokens;
}

} // namespace specllm
