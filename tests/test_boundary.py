"""Where an n-gram draft crosses the end of a sentence (cpp/include/specllm/boundary.h), with the real Qwen tokenizer:
the "auto" policy gives that draft position an acceptance estimate of its own."""
import pytest

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def model(real_models):
    import specllm

    return specllm.LLM(real_models["target"], draft=None, n_ctx=256, profile_costs=False)._engine.target


def test_a_sentence_end_followed_by_a_new_word_is_a_boundary(model):
    t = model.tokenize(" It works. Then we go on.", False, True)
    pieces = [model.piece(x) for x in t]
    assert pieces == [b" It", b" works", b".", b" Then", b" we", b" go", b" on", b"."]
    assert model.sentence_boundary(t[0], t[1:]) == 2  # " Then" (position 2 of the draft) follows "."
    assert model.sentence_boundary(t[2], t[3:]) == 0  # the token before the draft ended the sentence
    assert model.sentence_boundary(t[3], t[4:]) == -1  # "on." ends the draft: nothing follows it
    assert model.sentence_boundary(t[0], []) == -1
    question = model.tokenize(" Why? Because!  Then", False, True)
    assert model.sentence_boundary(-1, question) >= 1


def test_the_end_of_a_copied_message_is_a_boundary_and_a_draft_stops_at_its_end_of_turn(model):
    import specllm

    # a question copied into its answer ("The chemical symbol for gold") goes on, in the prompt, with "?" and the
    # chat template's end of turn; the answer goes on with " is Au."
    t = model.tokenize(" symbol for gold?<|im_end|>\n<|im_start|>assistant\n", False, True)
    ends = [i for i, x in enumerate(t) if model.is_eog(x)]
    assert len(ends) == 1 and model.piece(t[ends[0] - 1]) == b"?", [model.piece(x) for x in t]
    e = ends[0]
    assert model.sentence_boundary(t[0], t[1:]) == e - 2  # the draft's "?", the message's last token
    assert model.sentence_boundary(t[e - 1], t[e:]) == 0  # the end of turn itself
    assert model.cut_after_end(t[1:]) == t[1:e + 1]  # nothing after the end of turn is drafted
    assert model.cut_after_end(t[:e]) == t[:e] and model.cut_after_end([]) == []
    with pytest.raises(specllm.InvalidOptionError, match="not in the vocabulary"):
        model.cut_after_end([t[0], -1])


@pytest.mark.parametrize("text", ["os.path.join(a, b)", "x = 3.5 * y", "print('done.')", "e.g.the", "v1.2.3"])
def test_periods_inside_code_and_numbers_are_not_boundaries(model, text):
    t = model.tokenize(text, False, True)
    assert model.sentence_boundary(-1, t) == -1, [model.piece(x) for x in t]


def test_bad_tokens_are_refused_with_a_message(model):
    import specllm

    with pytest.raises(specllm.InvalidOptionError, match="not in the vocabulary"):
        model.sentence_boundary(1, [model.n_vocab])
    with pytest.raises(specllm.InvalidOptionError, match="not in the vocabulary"):
        model.sentence_boundary(1, [-5])
    assert model.sentence_boundary(10 ** 8, model.tokenize(" ok", False, True)) == -1  # an unknown last: none


def test_a_reply_that_copies_its_prompt_to_the_end_drafts_no_further_than_the_end_of_turn(real_models):
    import specllm

    llm = specllm.LLM(real_models["target"], draft="ngram", n_ctx=512, profile_costs=False)
    prompt = llm.apply_chat_template([{"role": "user", "content":
                                       "Repeat this sentence exactly and say nothing else: The cat sat on the mat."}])
    for ignore_eos in (False, True):
        llm.reset()  # the drafting memory would propose the first reply, up to its end
        with llm.stream(prompt, max_tokens=12, temperature=0, draft_length=8, ignore_eos=ignore_eos) as stream:
            chunks = list(stream)
        text = "".join(c.text for c in chunks)
        assert text.startswith("The cat sat on the mat."), text
        last = [c for c in chunks if c.n_drafted][-1]
        if not ignore_eos:
            # " sat" is followed in the prompt by " on the mat." and the end of turn: 5 drafted, 5 accepted, where an
            # uncut draft of 8 would go on into the chat template's next message
            assert (last.n_drafted, last.n_accepted) == (5, 5) and chunks[-1].finish_reason == "stop"
        else:
            assert any(c.n_drafted == 8 for c in chunks)  # past an end of turn the reply goes on: nothing is cut
