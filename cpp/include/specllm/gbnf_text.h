// Checks of GBNF text before llama.cpp's grammar parser reads it: the inputs that parser does not refuse but
// crashes on (a NUL ends its string, deep groups overflow its recursion, a backward repeat x{5,2} adds rules until
// the process runs out of memory), read from the text alone. Grammar's constructor runs them on every grammar.
#pragma once

#include <string>
#include <vector>

namespace specllm {

// throws InvalidArgument saying what to change when gbnf (or a trigger word or pattern) holds a NUL, nests groups
// deeper than llama.cpp's parser can recurse, repeats something x{m,n} with n < m, or is empty
void check_gbnf_text(const std::string & gbnf, const std::vector<std::string> & triggers,
                     const std::vector<std::string> & patterns);

// whether GBNF text names a token (<|tok|>, <[id]>): only a model's vocabulary reads those
bool names_tokens(const std::string & gbnf);

} // namespace specllm
