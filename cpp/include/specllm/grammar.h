// Constrained output: a GBNF grammar (llama.cpp's grammar sampler, e.g. JSON or a JSON schema turned into rules)
// that the generated text must follow. The target's rows are masked by the grammar, not the drafts: a draft is cut
// at its first token the grammar forbids (it could never be accepted; rejection sampling
// then reads the draft's q restricted to the allowed tokens, verifier.h), and verify row i is read through the
// grammar's state after drafts 1..i (the verifiers read row i only once those were accepted). Greedy rows whose
// argmax the grammar allows are passed as they are (one token checked, not the vocabulary), as llama.cpp's common
// sampler does; the output is that of masking every row, greedy or sampled.
#pragma once

#include "specllm/options.h"
#include "specllm/sampling.h"
#include "specllm/verifier.h"

#include "llama.h"

#include <memory>
#include <regex>
#include <string>
#include <vector>

namespace specllm {

class Model;

// the error a Grammar of gbnf would throw, read without a model (vocab nullptr: as a program checks a grammar file
// before it loads one); "" when it parses, or when it names tokens, which only a model's vocabulary can read
std::string gbnf_error(const std::string & gbnf);

class Grammar {
  public:
    // throws InvalidArgument with llama.cpp's parse error when gbnf is empty or not a grammar with a "root" rule.
    // triggers: a lazy grammar (llama.cpp's, as llama-server's for tool calls): every token is allowed until the
    // text accepted so far holds one of these words; from then on the grammar holds, read from the word on (its
    // root must begin with each word: InvalidArgument if not). A token that completes a word but takes the text
    // after it where the grammar cannot go leaves the grammar waiting (the word did not start what it describes).
    // patterns: regular expressions (ECMAScript) as llama.cpp's lazy grammars take them: searched in the text so far
    // (one written ^...$ is first matched against all of it), the grammar reads the text from the first group that
    // matched (else the match) on. InvalidArgument for one that is not a regular expression, and for a NUL in any.
    Grammar(const llama_vocab * vocab, const std::string & gbnf, const std::vector<std::string> & triggers = {},
            const std::vector<std::string> & patterns = {});
    Grammar(const Grammar & other); // a copy of the state (llama_sampler_clone)
    Grammar & operator=(const Grammar &) = delete;
    ~Grammar();

    bool allows(llama_token t);         // whether t may come next
    void accept(llama_token t);         // t (allowed, not an end-of-generation token) comes next
    int legal_prefix(const std::vector<llama_token> & tokens) const; // how many leading tokens it allows in turn
    bool constrains() const { return !awaiting_; } // false while a lazy grammar waits for its trigger

    // logits with every token the grammar forbids at -inf, into out; when it allows nothing (a dead end), the
    // end-of-generation token stays, so the generation stops there
    void mask(const float * logits, int n_vocab, std::vector<float> & out);
    // the text the grammar forces next (at most max_chars), whitespace as `reply` (the output so far) wrote it
    // before (grammar_draft.cpp); "" where the next character is free
    // *joins: whether a newline may follow it (set at every character: what holds where it stops)
    std::string forced_text(const std::string & reply, size_t max_chars, bool * joins = nullptr) const;

  private:
    friend class ConstrainedRows; // hands the advanced state over
    void swap_state(Grammar & other);
    void check_triggers(const std::vector<std::string> & triggers) const; // InvalidArgument for a bad one
    bool may_trigger(const std::string & piece) const; // the piece completes a trigger after the text so far

    const llama_vocab * vocab_;
    llama_sampler * smpl_;
    std::vector<llama_token_data> cand_;
    // a lazy grammar's wait, kept beside llama.cpp's (which it does not report): the words, the patterns and the
    // text so far (its tail when there are only words)
    std::vector<std::string> triggers_;
    std::shared_ptr<const std::vector<std::regex>> patterns_;
    bool awaiting_ = false;
    std::string text_;
    // a lazy grammar as made, before any text: the wait starts over from it after a trigger the grammar could not
    // read (shared by copies, only cloned)
    std::shared_ptr<llama_sampler> fresh_;
    // a failed trigger in a grammar with trigger patterns: the output stays free (a pattern is searched in the whole
    // output, whose start a fresh wait would lose: "^\s*(e)" then fired mid-reply)
    bool gave_up_ = false;
};

// Reads one step's verify rows under the grammar (see above); after the verdict, advance() moves the grammar past
// the emitted tokens. Masking the whole vocabulary costs ~30 ms for Qwen2.5's 152k tokens on a 2-core CPU (half a
// plain step), so it is the last resort: greedy, the argmax if allowed; coupled sampling without top-p, the keyed
// draw of the masked, warped row found by checking tokens in the order of their keyed race (top-k and min-p: among
// the highest allowed tokens), handed to the verifier as a row holding only that token. Rejection sampling and
// top-p (whose mass needs every allowed token) mask the whole row.
class ConstrainedRows {
  public:
    ConstrainedRows(Grammar & grammar, const std::vector<llama_token> & draft, const LogitsRow & row, int n_vocab,
                    const SamplingOptions & sampling, int64_t pos0, bool full_mask = false);
    const float * read(int i);
    // rejection sampling: the grammar's mask for row i (0 allowed, -inf forbidden), once read(i) has been called;
    // nullptr where the grammar does not constrain row i (a lazy grammar still waiting)
    const float * allowed(int i) const { return allowed_row_ == i ? allowed_.data() : nullptr; }
    void advance(int n_accepted, llama_token next, bool end); // end: next ends the generation (not accepted)
    int n_masks() const { return n_masks_; }     // rows masked whole this step
    double mask_ms() const { return mask_ms_; }  // ... and the time they took
    // whether every row is masked whole with these options (rejection sampling, top-p)
    static bool masks_every_row(const SamplingOptions & s) {
        return s.temperature > 0.0f && (s.rejection || s.top_p < 1.0f);
    }

  private:
    llama_token keyed_draw(const float * logits, int64_t pos); // -1: fall back to the whole mask
    const float * only(llama_token t);

    Grammar & committed_;
    Grammar work_; // the state before draft[at_]
    const std::vector<llama_token> & draft_;
    const LogitsRow & row_;
    int n_vocab_;
    const SamplingOptions & sampling_;
    int64_t pos0_;
    bool full_mask_; // tests: mask every row whole (the reference the shortcuts must match)
    int at_ = 0;
    int n_masks_ = 0;
    double mask_ms_ = 0.0;
    std::vector<float> masked_;
    std::vector<float> zeros_, allowed_; // rejection sampling: the mask alone, which the draft's q is read through
    int allowed_row_ = -1;
    std::vector<llama_token> order_;
    std::vector<double> key_;
    Warper warper_;
    Dist dist_;
};

// What masking a whole row costs on this machine (a running mean over the steps that masked, kept across
// generations), and so what "auto" counts per row read where every row is masked (AutoPolicy::set_row_read_cost)
class MaskCost {
  public:
    void observe(const ConstrainedRows & rows);
    double per_row_read(const SamplingOptions & s) const { return ConstrainedRows::masks_every_row(s) ? ms_ : 0.0; }

  private:
    double ms_ = 0.0;
    int n_ = 0;
};

// a draft of the text the grammar forces next, in target's tokens (at most max_tokens; what may join the free
// text after it in one token is left out): free drafts for a JSON schema's keys and punctuation
std::vector<llama_token> forced_draft(const Grammar & grammar, const Model & target, const std::string & reply,
                                      int max_tokens);

// the generation's grammar (nullptr without one; lazy with grammar_triggers); InvalidArgument for a bad one, one
// with ignore_eos, or triggers without a grammar
std::unique_ptr<Grammar> make_grammar(const llama_vocab * vocab, const GenerateOptions & opts);

} // namespace specllm
