"""Which prefill rank serves which decode rank when the two sides of a
prefill-to-decode transfer run at different TP sizes (cxltier.sglang.pdranks):
of MLA every decode rank is served by exactly one prefill rank, of MHA by
every prefill rank that holds its heads, each through a room of its own,
and the room a prefill rank looks in first belongs to a decode rank that
exists; and, of MHA, where a prefill rank's heads go in the rows of each
decode rank it serves, against SGLang's sharding of heads by rank."""

import pytest

from cxltier.sglang.pdranks import (MAX_TP, DisaggError, decode_ranks_served, decode_tp_candidates, first_decode_rank,
                                    head_placement, parts_of, room_part, room_rank)

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


@pytest.mark.parametrize("prefill_tp,decode_tp", SIZES)
def test_every_mha_decode_rank_has_every_prefill_rank_of_its_heads(prefill_tp, decode_tp):
    """Of MHA, every prefill rank serves: a decode rank of a smaller TP
    size takes parts 0 .. k-1 from k prefill ranks, each in a room of its
    own (room_rank), and no two prefill ranks write into one room."""
    rooms = {}
    for i in range(prefill_tp):
        part = room_part(i, prefill_tp, decode_tp, mla=False)
        for j in decode_ranks_served(i, prefill_tp, decode_tp, mla=False):
            rooms.setdefault(room_rank(j, part), []).append(i)
    k = parts_of(prefill_tp, decode_tp, mla=False)
    assert k == max(1, prefill_tp // decode_tp)
    assert sorted(rooms) == sorted(room_rank(j, q) for j in range(decode_tp) for q in range(k))
    assert all(len(served_by) == 1 for served_by in rooms.values())
    assert sum(len(v) for v in rooms.values()) == max(prefill_tp, decode_tp)


def test_the_same_size_pairs_rank_with_rank():
    for tp in range(1, MAX_TP + 1):
        for mla in (True, False):
            assert [list(decode_ranks_served(i, tp, tp, mla)) for i in range(tp)] == [[i] for i in range(tp)]
            assert {room_part(i, tp, tp, mla) for i in range(tp)} == {0}


def test_room_ranks_are_the_decode_rank_for_part_0_and_refuse_what_is_out_of_range():
    assert [room_rank(j) for j in range(MAX_TP)] == list(range(MAX_TP))
    assert len({room_rank(j, q) for j in range(MAX_TP) for q in range(MAX_TP)}) == MAX_TP * MAX_TP
    for bad in ((-1, 0), (MAX_TP, 0), (0, -1), (0, MAX_TP)):
        with pytest.raises(DisaggError):
            room_rank(*bad)


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


HEAD_CASES = [(h, p, d) for h in (1, 2, 4, 8, 16) for p in (1, 2, 4, 8, 16) for d in (1, 2, 4, 8, 16, 32)
              if (d % p == 0 or p % d == 0) and (h % p == 0 or p % h == 0) and (h % d == 0 or d % h == 0)]


@pytest.mark.parametrize("heads,prefill_tp,decode_tp", HEAD_CASES)
def test_a_decode_rank_lands_the_heads_it_holds(heads, prefill_tp, decode_tp):
    """For every decode rank, what head_placement lands of each prefill
    rank that serves it fills exactly the heads SGLang gives that decode
    rank, in order, each head from a prefill rank that holds it
    (head_bytes a head's bytes of a token row)."""
    page, head_bytes = 4, 16
    for j in range(decode_tp):
        want = heads_of(j, decode_tp, heads)
        got = [None] * len(want)
        for i in range(prefill_tp):
            part = room_part(i, prefill_tp, decode_tp, mla=False)
            if j not in decode_ranks_served(i, prefill_tp, decode_tp, mla=False):
                continue
            have = heads_of(i, prefill_tp, heads)
            placed = head_placement(page * len(have) * head_bytes, page * len(want) * head_bytes, page, prefill_tp,
                                    decode_tp, j, part)
            if placed is None:
                assert have == want
                got = list(have)
                continue
            src, dst, length = placed
            assert src % head_bytes == 0 and dst % head_bytes == 0 and length % head_bytes == 0
            n = length // head_bytes
            landed = have[src // head_bytes : src // head_bytes + n]
            assert len(landed) == n
            for x, head in enumerate(landed):
                at = dst // head_bytes + x
                assert got[at] in (None, head), (j, i, got)  # a replica lands the same head
                got[at] = head
        assert got == want, (j, got, want)


@pytest.mark.parametrize("prefill_chunk,decode_chunk,prefill_tp,decode_tp,why", [
    (128, 64, 2, 3, "divide"),  # neither size a multiple of the other
    (128, 48, 1, 2, "not a share"),  # does not divide
    (256, 32, 1, 2, "not a share"),  # 8 shares for 2 ranks
    (192, 64, 1, 2, "not a share"),  # 3 shares for 2 ranks
    (128, 0, 1, 2, "not a share"),
    (128, 66, 1, 2, "not a share"),  # a share that is not whole rows of a 4-token page
    (64, 512, 2, 1, "not a share"),  # 8 prefill rows for 2 prefill ranks
    (64, 192, 4, 1, "not a share"),  # 3 rows for 4 ranks
    (128, 256, 2, 2, "not a share"),  # one size, other heads
])
def test_heads_that_are_no_share_are_refused(prefill_chunk, decode_chunk, prefill_tp, decode_tp, why):
    with pytest.raises(DisaggError, match=why):
        head_placement(prefill_chunk, decode_chunk, 4, prefill_tp, decode_tp, 0)


def test_a_part_past_the_prefill_ranks_is_refused():
    with pytest.raises(DisaggError, match="part"):
        head_placement(64, 128, 4, 2, 1, 0, part=2)
