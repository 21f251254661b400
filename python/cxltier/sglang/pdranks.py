"""Which prefill rank serves which decode rank in a prefill-to-decode
transfer (cxltier.sglang.disagg), and where an MHA page's heads go when the
two sides run at different TP sizes: the map SGLang's mooncake backend
uses, computed here alone so that both sides and the tests agree.

Sizes: one of the prefill's TP size p and the decode's d divides the other.

- p == d: rank r serves rank r.
- d = k*p (a larger decode): prefill rank i serves decode ranks i*k ..
  i*k+k-1; its pages are stored once, each decode rank lands its share of
  their heads (MHA) or the whole latent (MLA).
- p = k*d (a smaller decode): decode rank j holds the KV of prefill ranks
  j*k .. j*k+k-1. MLA's latent is the same on all of them, so the first
  serves and the others stand by. An MHA decode rank holds the heads of
  all k: each serves it a part of its rows (part q = i - j*k), through a
  room of its own.

A room of the rooms table is named by the request's bootstrap room and a
rank (room_rank): the decode rank's, and for part q > 0 of a smaller MHA
decode that rank and the part, so that each prefill rank of the k writes
its own records.
"""


class DisaggError(RuntimeError):
    """A request's transfer through the tier failed; the message says why."""


# The largest decode TP size a prefill rank looks for, and how much larger or
# smaller than its own (a look is a lookup in the rooms table, made for every
# request in bootstrap: a few sizes, not every divisor).
MAX_TP = 64
TP_RATIOS = (2, 3, 4, 6, 8, 16, 32, 64)
# A room's rank word: the decode rank below PART_SHIFT bits, the part above.
PART_SHIFT = 16


def room_rank(decode_rank, part=0):
    """The rank a room of the rooms table is named by: the decode rank's
    for part 0 (every case but a smaller MHA decode's other parts)."""
    if not 0 <= decode_rank < MAX_TP or not 0 <= part < MAX_TP:
        raise DisaggError(f"cxltier disaggregation: decode rank {decode_rank}, part {part}: want both below {MAX_TP}")
    return decode_rank | part << PART_SHIFT


def first_decode_rank(prefill_rank, prefill_tp, decode_tp):
    """The decode rank whose room a prefill rank finds first: its own
    rank's at the same TP size; of a decode of larger TP, the first of the
    decode_tp/prefill_tp ranks it serves; of a smaller one, the rank it
    and prefill_tp/decode_tp - 1 other prefill ranks hold the KV of."""
    if decode_tp >= prefill_tp:
        return prefill_rank * (decode_tp // prefill_tp)
    return prefill_rank // (prefill_tp // decode_tp)


def room_part(prefill_rank, prefill_tp, decode_tp, mla):
    """The part of its decode rank's KV a prefill rank serves: 0 but for an
    MHA decode of a smaller TP size, whose rank j takes part q from prefill
    rank j*k + q."""
    if mla or decode_tp >= prefill_tp:
        return 0
    return prefill_rank % (prefill_tp // decode_tp)


def parts_of(prefill_tp, decode_tp, mla):
    """How many prefill ranks a decode rank lands from: k of a smaller MHA
    decode, else one."""
    return 1 if mla or decode_tp >= prefill_tp else prefill_tp // decode_tp


def decode_tp_candidates(prefill_tp, seen, all_sizes):
    """The decode TP sizes a prefill rank looks for a hello under: its own
    and seen, the last one it served (the common cases, every poll), with
    all_sizes those TP_RATIOS times larger or smaller, up to MAX_TP."""
    p = prefill_tp
    first = [p] if seen in (None, p) else [p, seen]
    if not all_sizes:
        return first
    wider = [p * r for r in TP_RATIOS if p * r <= MAX_TP] + [p // r for r in TP_RATIOS if p % r == 0]
    return first + [d for d in wider if d not in first]


def decode_ranks_served(prefill_rank, prefill_tp, decode_tp, mla=True):
    """The decode ranks a prefill rank writes records for (one size
    dividing the other): none for an MLA rank that stands by; of a smaller
    MHA decode, the one rank it serves a part of."""
    first = first_decode_rank(prefill_rank, prefill_tp, decode_tp)
    if decode_tp >= prefill_tp or not mla:
        return range(first, first + max(1, decode_tp // prefill_tp))
    return range(first, first + 1) if prefill_rank % (prefill_tp // decode_tp) == 0 else range(0)


def head_placement(prefill_chunk, decode_chunk, page_size, prefill_tp, decode_tp, decode_rank, part=0):
    """Where an MHA page's heads go between a prefill rank and a decode
    rank it serves: (source offset, destination offset, length) in bytes of
    each token's row, or None when the decode rank holds the prefill rank's
    page as it is (the same heads). SGLang shards KV heads by rank, and
    replicates them when there are fewer heads than ranks.

    A larger decode (d = k*p): prefill rank j // k serves decode rank j; its
    page holds r = prefill_chunk / decode_chunk times the decode's heads (r
    divides k: k / r decode ranks then hold each head), and rank j takes the
    ((j % k) * r // k)-th share of them.

    A smaller decode (p = k*d): decode rank j takes part q of its rows from
    prefill rank j*k + q; its row holds r = decode_chunk / prefill_chunk
    prefill rows' heads (r divides k: k / r prefill ranks then hold each),
    and part q's row goes to the (q // (k / r))-th place in it.

    Pages of one size hold the same heads (one TP size, or heads replicated
    on both sides)."""
    if prefill_chunk == decode_chunk:
        return None
    geometry = (f"a prefill rank of TP {prefill_tp} with {prefill_chunk}-byte page chunks, a decode rank of TP "
                f"{decode_tp} with {decode_chunk}-byte ones")
    small, large = sorted((prefill_chunk, decode_chunk))
    if max(prefill_tp, decode_tp) % min(prefill_tp, decode_tp):
        raise DisaggError(f"cxltier disaggregation: {geometry}: one TP size must divide the other")
    k = max(prefill_tp, decode_tp) // min(prefill_tp, decode_tp)
    if small <= 0 or large % small or k % (large // small) or small % page_size:
        raise DisaggError(f"cxltier disaggregation: {geometry}: the decode's heads are not a share of the prefill "
                          "rank's or a whole of several (same model and KV dtype needed)")
    r = large // small
    if decode_tp >= prefill_tp:
        row = decode_chunk // page_size
        return (decode_rank % k) * r // k * row, 0, row
    if not 0 <= part < k:
        raise DisaggError(f"cxltier disaggregation: {geometry}: part {part} of {k}")
    row = prefill_chunk // page_size
    return 0, part // (k // r) * row, row
