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
