// Where an n-gram draft crosses the end of a sentence. A copy of prose seldom survives it: after a sentence the
// model ends its turn or goes on in its own words. On the plain answers of the dev runs (bench.calibrate's 56),
// a draft position right after a sentence end was accepted 0.55 of the time (490 positions; RAG 0.06 of 49, 46 of
// them the model ending its turn; summaries 0.51 of 344), against 0.96 anywhere else; at the first position (the
// last emitted token ended a sentence) 0.43 of 49. The "auto" policy gives that position an estimate of its own.
#pragma once

#include "specllm/model.h"

#include <string>

namespace specllm {

// does this token's text end a sentence ('.', '!' or '?', trailing spaces aside)?
bool ends_sentence(const std::string & piece);
// does this token's text start with white space (a new word, line or paragraph, not "os.path" or "3.5")?
bool starts_with_space(const std::string & piece);
// the first position j of the draft d[0..n) that follows a sentence end: d[j-1] (or `last`, the token before the
// draft, for j = 0) ends a sentence and d[j] starts with white space; -1 if none
int sentence_boundary(const Model & model, llama_token last, const llama_token * draft, int n);

} // namespace specllm
