"""Which prefill rank serves which decode rank when the two sides of a
prefill-to-decode transfer run at different TP sizes (MLA): every decode
rank is served by exactly one prefill rank, and the room a prefill rank
looks in first belongs to a decode rank that exists; and, of MHA, which
share of a prefill rank's heads each rank of a larger decode holds."""

import pytest

from cxltier.sglang.disagg import (MAX_TP, DisaggError, decode_ranks_served, decode_tp_candidates, first_decode_rank,
                                   head_share)

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


def heads_of(rank, tp, heads):
    """The KV heads SGLang gives rank of tp: a contiguous share of them, or,
    with fewer heads than ranks, one head replicated over tp/heads ranks."""
    if heads >= tp:
        n = heads // tp
        return list(range(rank * n, (rank + 1) * n))
    return [rank // (tp // heads)]


HEAD_CASES = [(h, p, d) for h in (1, 2, 4, 8, 16) for p in (1, 2, 4, 8) for d in (1, 2, 4, 8, 16, 32)
              if d % p == 0 and (h % p == 0 or p % h == 0) and (h % d == 0 or d % h == 0)]


@pytest.mark.parametrize("heads,prefill_tp,decode_tp", HEAD_CASES)
def test_a_decode_rank_lands_the_heads_it_holds(heads, prefill_tp, decode_tp):
    """For every decode rank, the share head_share picks out of the page of
    the prefill rank that serves it holds exactly the heads SGLang gives
    that decode rank, in order (head_bytes a head's bytes of a token row)."""
    page, head_bytes = 4, 16
    for j in range(decode_tp):
        i = j // (decode_tp // prefill_tp)
        have, want = heads_of(i, prefill_tp, heads), heads_of(j, decode_tp, heads)
        share = head_share(page * len(have) * head_bytes, page * len(want) * head_bytes, page, prefill_tp, decode_tp, j)
        if share is None:
            assert have == want
            continue
        offset, length = share
        assert offset % head_bytes == 0 and length == len(want) * head_bytes
        assert have[offset // head_bytes : (offset + length) // head_bytes] == want


@pytest.mark.parametrize("prefill_chunk,decode_chunk,prefill_tp,decode_tp,why", [
    (128, 256, 2, 1, "from one prefill rank"),  # a smaller decode: several prefill ranks' heads
    (128, 128, 2, 1, "from one prefill rank"),
    (128, 64, 2, 3, "from one prefill rank"),  # not a multiple
    (128, 48, 1, 2, "not a share"),  # does not divide
    (256, 32, 1, 2, "not a share"),  # 8 shares for 2 ranks
    (192, 64, 1, 2, "not a share"),  # 3 shares for 2 ranks
    (128, 0, 1, 2, "not a share"),
    (128, 66, 1, 2, "not a share"),  # a share that is not whole rows of a 4-token page
])
def test_heads_that_are_no_share_are_refused(prefill_chunk, decode_chunk, prefill_tp, decode_tp, why):
    with pytest.raises(DisaggError, match=why):
        head_share(prefill_chunk, decode_chunk, 4, prefill_tp, decode_tp, 0)
