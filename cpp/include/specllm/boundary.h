// Where an n-gram draft crosses the end of a sentence. A copy of prose seldom survives it: after a sentence the
// model ends its turn or goes on in its own words. On the plain answers of the dev runs (bench.calibrate's 56),
// a draft position right after a sentence end was accepted 0.55 of the time (490 positions; RAG 0.06 of 49, 46 of
// them the model ending its turn; summaries 0.51 of 344), against 0.96 anywhere else; at the first position (the
// last emitted token ended a sentence) 0.43 of 49. The "auto" policy gives that position an estimate of its own.
#pragma once

#include "specllm/model.h"

#include <string>
#include <vector>

namespace specllm {

// does this token's text end a sentence ('.', '!' or '?', trailing spaces aside)?
bool ends_sentence(const std::string & piece);
// does this token's text start with white space (a new word, line or paragraph, not "os.path" or "3.5")?
bool starts_with_space(const std::string & piece);
// the first position j of the draft d[0..n) that follows a sentence end: d[j-1] (or `last`, the token before the
// draft, for j = 0) ends a sentence and d[j] starts with white space; or where a copy reaches the end of a
// message: d[j + 1] (or d[j]) ends a turn. A question copied into its answer ("The chemical symbol for gold")
// goes on with its "?" and the template's end of turn, the answer with " is Au."; on the dev runs' plain answers a
// message's last token was accepted 0.44 of 135 times, 0.26 of 19 as a draft's first (code 0 of 60, RAG 0 of 23,
// code edits 34 of 35). -1 if none
int sentence_boundary(const Model & model, llama_token last, const llama_token * draft, int n);
// cut a draft after its first end-of-turn token: what follows it can never be accepted (an accepted end of turn
// ends the generation; after it come the chat template's tokens for the next message); -> the draft's length
int cut_after_end(const Model & model, std::vector<llama_token> & draft);

} // namespace specllm
