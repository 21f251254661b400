"""Which prefill rank serves which decode rank when the two sides of a
prefill-to-decode transfer run at different TP sizes (MLA): every decode
rank is served by exactly one prefill rank, and the room a prefill rank
looks in first belongs to a decode rank that exists."""

import pytest

from cxltier.sglang.disagg import MAX_TP, decode_ranks_served, decode_tp_candidates, first_decode_rank

SIZES = [(p, d) for p in (1, 2, 3, 4, 6, 8, 16) for d in (1, 2, 3, 4, 6, 8, 16, 32) if p % d == 0 or d % p == 0]


@pytest.mark.parametrize("prefill_tp,decode_tp", SIZES)
def test_every_decode_rank_has_one_prefill_rank(prefill_tp, decode_tp):
    served = [r for i in range(prefill_tp) for r in decode_ranks_served(i, prefill_tp, decode_tp)]
    assert sorted(served) == list(range(decode_tp))
    for i in range(prefill_tp):
        assert 0 <= first_decode_rank(i, prefill_tp, decode_tp) < decode_tp
        ranks = decode_ranks_served(i, prefill_tp, decode_tp)
        if ranks:
            assert ranks[0] == first_decode_rank(i, prefill_tp, decode_tp)
    standing_by = sum(1 for i in range(prefill_tp) if not decode_ranks_served(i, prefill_tp, decode_tp))
    assert standing_by == max(0, prefill_tp - decode_tp)


def test_the_same_size_pairs_rank_with_rank():
    for tp in range(1, MAX_TP + 1):
        assert [list(decode_ranks_served(i, tp, tp)) for i in range(tp)] == [[i] for i in range(tp)]


@pytest.mark.parametrize("prefill_tp,decode_tp", SIZES)
def test_a_prefill_rank_looks_for_every_decode_size(prefill_tp, decode_tp):
    """Every size of SIZES is looked for by the wide look; the prefill's
    own and the last one served at every poll, first."""
    wide = decode_tp_candidates(prefill_tp, None, True)
    assert decode_tp in wide and len(wide) == len(set(wide))
    assert decode_tp_candidates(prefill_tp, None, False) == [prefill_tp]
    assert decode_tp_candidates(prefill_tp, decode_tp, False)[-1] == decode_tp
    assert decode_tp_candidates(prefill_tp, decode_tp, True)[: 1 + (decode_tp != prefill_tp)] == \
        decode_tp_candidates(prefill_tp, decode_tp, False)
