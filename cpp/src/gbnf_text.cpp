#include "specllm/gbnf_text.h"

#include "specllm/errors.h"

#include <algorithm>

namespace specllm {

namespace {

constexpr size_t max_group_depth = 2500; // JSON schemas' lengths are held to 2000 (specllm/grammar.py)

// f(c) for each character of GBNF text outside "strings", [classes] and # comments, until f returns false
template <typename F> void for_each_rule_char(const std::string & gbnf, F f) {
    for (size_t i = 0; i < gbnf.size(); ++i) {
        const char c = gbnf[i];
        if (c == '#') {
            while (i < gbnf.size() && gbnf[i] != '\n') {
                ++i;
            }
        } else if (c == '"' || c == '[') {
            const char end = c == '"' ? '"' : ']';
            for (++i; i < gbnf.size() && gbnf[i] != end; ++i) {
                i += gbnf[i] == '\\' ? 1 : 0;
            }
        } else if (!f(c)) {
            return;
        }
    }
}

// the deepest nesting of ( ) groups in GBNF text: llama.cpp's parser recurses once per level (~0.5 KB of stack
// each; 20,000 levels overflowed an 8 MiB stack)
size_t group_depth(const std::string & gbnf) {
    size_t depth = 0, deepest = 0;
    for_each_rule_char(gbnf, [&](char c) {
        if (c == '(') {
            deepest = std::max(deepest, ++depth);
        } else if (c == ')' && depth > 0) {
            --depth;
        }
        return true;
    });
    return deepest;
}

// the first repetition x{m,n} of GBNF text whose n is below its m ("" if none): llama.cpp's parser subtracts them
// unsigned and added rules until the process ran out of memory (a server request killed it)
std::string backward_repetition(const std::string & gbnf) {
    std::string found, inside;
    bool open = false;
    for_each_rule_char(gbnf, [&](char c) {
        if (c == '{') {
            open = true;
            inside.clear();
        } else if (c == '}' && open) {
            open = false;
            const size_t comma = inside.find(',');
            const auto digits = [](const std::string & s, std::string & out) { // a count, without leading zeros
                const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
                if (a == std::string::npos || s.find_first_not_of("0123456789", a) <= b) {
                    return false;
                }
                const size_t z = s.find_first_not_of('0', a);
                out = z > b ? "0" : s.substr(z, b - z + 1);
                return true;
            };
            std::string lo, hi; // compared as numbers of any length: by their digits' count, then their digits
            if (comma != std::string::npos && digits(inside.substr(0, comma), lo) &&
                digits(inside.substr(comma + 1), hi) &&
                (hi.size() < lo.size() || (hi.size() == lo.size() && hi < lo))) {
                found = "{" + inside + "}";
            }
        } else if (open) {
            inside += c;
        }
        return found.empty();
    });
    return found;
}

} // namespace

bool names_tokens(const std::string & gbnf) {
    bool found = false;
    for_each_rule_char(gbnf, [&](char c) {
        found = c == '<';
        return !found;
    });
    return found;
}

void check_gbnf_text(const std::string & gbnf, const std::vector<std::string> & triggers,
                     const std::vector<std::string> & patterns) {
    const auto has_nul = [](const std::string & s) { return s.find('\0') != std::string::npos; };
    if (has_nul(gbnf) || std::any_of(triggers.begin(), triggers.end(), has_nul) ||
        std::any_of(patterns.begin(), patterns.end(), has_nul)) {
        throw InvalidArgument("a grammar, trigger or pattern holds a NUL character, which llama.cpp reads as its end; "
                              "leave it out");
    }
    if (const size_t depth = group_depth(gbnf); depth > max_group_depth) {
        throw InvalidArgument("the grammar nests groups " + std::to_string(depth) + " deep; at most " +
                              std::to_string(max_group_depth) + " (llama.cpp's parser recurses per level): write "
                              "long repetitions as x{m,n}, or a JSON schema's maxLength / maxItems below 2000");
    }
    if (const std::string rep = backward_repetition(gbnf); !rep.empty()) {
        throw InvalidArgument("the grammar repeats something " + rep + " times: its maximum is below its minimum; "
                              "write x{m,n} with m <= n");
    }
    if (gbnf.find_first_not_of(" \t\r\n") == std::string::npos) {
        throw InvalidArgument("the grammar is empty; pass GBNF rules with a 'root' rule (e.g. root ::= \"yes\" | "
                              "\"no\"), or no grammar");
    }
}

} // namespace specllm
