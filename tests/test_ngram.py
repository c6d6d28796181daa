"""Model-free tests of the n-gram (prompt lookup) index."""
import pytest

from specllm import _core, InvalidOptionError


def index(tokens, n_min=2, n_max=4):
    ix = _core.NgramIndex(n_min, n_max)
    ix.extend(tokens)
    return ix


def test_empty_history_proposes_nothing():
    assert index([]).lookup(5) == (0, [])
    assert index([7]).lookup(5) == (0, [])


def test_continuation_of_an_earlier_occurrence():
    #        0  1  2  3  4  5  6  7
    ix = index([1, 2, 3, 4, 5, 9, 2, 3])
    n, draft = ix.lookup(3)
    assert n == 2 and draft == [4, 5, 9]


def test_longest_match_wins_over_a_more_recent_shorter_one():
    # suffix [7, 2, 3]: matches at 0..2 (length 3, continues with 4); [2, 3] also at 5..6 (continues with 8)
    ix = index([7, 2, 3, 4, 0, 2, 3, 8, 7, 2, 3])
    n, draft = ix.lookup(2)
    assert n == 3 and draft == [4, 0]


def test_most_recent_occurrence_of_the_same_length():
    ix = index([1, 2, 5, 1, 2, 6, 1, 2])
    assert ix.lookup(1) == (2, [6])


def test_the_occurrence_that_agrees_furthest_back_wins():
    # key [1, 2, 3, 4] occurs twice before the end; the older one is preceded by [9, 8] like the current text,
    # so it is the place being copied from (continues with 5), not the newer one (continues with 7)
    #           0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18
    ix = index([9, 8, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 7, 9, 8, 1, 2, 3, 4])
    n, draft = ix.lookup(2)
    assert n == 6 and draft == [5, 0]


def test_many_occurrences_of_a_key_are_searched():
    # a frequent 2-gram (41 occurrences) whose oldest occurrence is the real source
    seq = [5, 6, 1, 2, 42] + [1, 2, 0] * 40 + [5, 6, 1, 2]
    n, draft = index(seq, 2, 2).lookup(1)
    assert n == 4 and draft == [42]


def test_repeats_and_match_at_the_very_end():
    ix = index([4, 4, 4, 4])
    n, draft = ix.lookup(3)
    assert n == 3 and draft == [4]  # the continuation runs into the current suffix and stops at the end
    ix = index([1, 2, 3, 1, 2])
    assert ix.lookup(10) == (2, [3, 1, 2])


def test_incremental_updates_match_a_rebuild():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5, 1, 4, 1, 5]
    ix = _core.NgramIndex(1, 3)
    for i, t in enumerate(seq):
        ix.push(t)
        assert ix.lookup(4) == index(seq[: i + 1], 1, 3).lookup(4)


def test_truncate_forgets_the_tail():
    ix = index([1, 2, 3, 9, 9, 1, 2])
    assert ix.lookup(1) == (2, [3])
    ix.truncate(4)
    assert ix.tokens == [1, 2, 3, 9]
    ix.extend([8, 1, 2])
    assert ix.lookup(2) == (2, [3, 9])


@pytest.mark.parametrize("n_min,n_max", [(0, 3), (3, 2), (1, 17)])
def test_bad_sizes_are_refused(n_min, n_max):
    with pytest.raises(InvalidOptionError, match="n-gram sizes"):
        _core.NgramIndex(n_min, n_max)


def test_match_reports_ambiguity_and_source():
    # key [1, 2] continues with 3 at index 2 and with 4 at index 6: ambiguous; the longer agreement wins
    #           0  1  2  3  4  5  6  7  8  9
    ix = index([9, 1, 2, 3, 0, 1, 2, 4, 9, 1, 2], 2, 2)
    assert ix.match() == (3, True, 3)
    ix = index([9, 1, 2, 3, 0, 9, 1, 2], 2, 4)  # one earlier occurrence: not ambiguous
    assert ix.match() == (3, False, 3)
    assert index([5, 6]).match() == (0, False, 0)
