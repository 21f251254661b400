"""The prefill side of prefill to decode keeps (pins) every page it
publishes until its decode has landed it. A page its store wrote or found
there, but that another writer's store evicted before the pin (a full
tier: at TP 4 a decode rank then found a page of its request gone after
the prefill's done), is stored and kept once more; lost twice, the request
fails saying why. The other writer is stood in for by a delete between the
store and the pin, the one moment the race needs; the tier, the index, the
KV pool and the sender are the real ones (no SGLang needed: the sender's
store path reads none of it)."""

import ctypes
import time
from types import SimpleNamespace

import pytest

from cxltier import _native
from cxltier.sglang.disagg import CxlTierKVManager, CxlTierKVSender, DisaggError

PAGE, LAYERS, CHUNK, PAGES = 4, 2, 256, 6


@pytest.fixture
def manager(built, device, monkeypatch):
    monkeypatch.setenv("CXLTIER_LIB", built["lib"])
    for name, value in {"CXLTIER_DEVICES": device, "CXLTIER_PD_INDEX": "pd", "CXLTIER_PD_BLOCKS": "64",
                        "CXLTIER_PD_POPULATE": "0"}.items():
        monkeypatch.setenv(name, value)
    bufs = [(ctypes.c_uint8 * (PAGES * CHUNK))(*((b * 31 + i) % 251 for i in range(PAGES * CHUNK)))
            for b in range(2 * LAYERS)]
    args = SimpleNamespace(page_size=PAGE, engine_rank=0, kv_data_ptrs=[ctypes.addressof(b) for b in bufs],
                           kv_data_lens=[len(b) for b in bufs], kv_item_lens=[CHUNK] * len(bufs), aux_data_ptrs=[],
                           aux_item_lens=[], kv_cache_dtype_str="bfloat16", state_types=[], num_draft_entries=0)
    server = SimpleNamespace(tp_size=1, pp_size=1, model_path="m", device="cpu")
    mgr = CxlTierKVManager(args, "prefill", server)
    mgr.bufs = bufs  # alive as long as the pool that points into them
    yield mgr
    mgr.close()


def losing(mgr, every_time, then_theirs=False):
    """Wraps the pool's store: after it, another writer evicts the first
    key of the block (the first store only, or every one); then_theirs:
    before the second, another writer stores that key itself."""
    real, lost = mgr.pool.store, []

    def store(block, pages):
        if then_theirs and lost:
            assert real(block, pages) == ["stored"]  # the other writer's store of the same page
        statuses = real(block, pages)
        if every_time or not lost:
            mgr.index.delete([block.hex(0)])
            lost.append(block.hex(0))
        return statuses

    mgr.pool.store = store
    return lost


def pinned(mgr, key):
    try:
        mgr.index.delete([key])
    except _native.BusyError:
        return True
    return False


def test_a_page_evicted_before_its_pin_is_stored_and_kept_again(manager):
    tokens = list(range(100, 100 + PAGES * PAGE))
    block = manager.page_keys(tokens)
    sender = CxlTierKVSender(manager, "tier", 7)
    lost = losing(manager, every_time=False)
    sender._store_part(block, list(range(PAGES)))
    assert len(lost) == 1
    assert manager.index.exists_block(block) == PAGES, "a page the decode will look for is gone"
    assert all(pinned(manager, block.hex(i)) for i in range(PAGES)), "a published page is not kept"
    assert sender.written == PAGES + 1  # the lost page stored twice
    sender._end_room()  # the side ends: its pins go
    assert not pinned(manager, block.hex(0))


def test_a_page_lost_twice_fails_the_request_saying_why(manager):
    tokens = list(range(200, 200 + PAGES * PAGE))
    sender = CxlTierKVSender(manager, "tier", 8)
    losing(manager, every_time=True)
    with pytest.raises(DisaggError, match="evicted as soon as they were stored"):
        sender._store_part(manager.page_keys(tokens), list(range(PAGES)))
    sender._end_room()  # as the failure concludes the side: the pins it took go


def test_a_page_another_writer_never_lets_be_kept_fails_in_time(manager, monkeypatch):
    """Found there when stored again, and still not to be pinned, the page
    is another writer's in flight (the same MLA page from another rank of
    the prefill, an uplink's fill): the sender waits for that writer to
    publish it (then keeps it) or give it up (then stores it), and says
    nothing to the decode meanwhile. One that never comes to be kept (here
    another writer stores it and it is evicted, again and again) fails the
    request within SGLang's waiting timeout, saying why. (It was left to
    that writer, and the decode told its pages were in: a TP 2 MLA decode
    rank then failed, a page missing, while the other prefill rank still
    wrote it.)"""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "1")
    tokens = list(range(300, 300 + PAGES * PAGE))
    block = manager.page_keys(tokens)
    sender = CxlTierKVSender(manager, "tier", 9)
    losing(manager, every_time=True, then_theirs=True)
    began = time.monotonic()
    with pytest.raises(DisaggError, match="another writer was writing were neither published nor given up"):
        sender._store_part(block, list(range(PAGES)))
    assert time.monotonic() - began < 30, "the wait for the other writer is not bounded by the timeout"
    assert all(pinned(manager, block.hex(i)) for i in range(1, PAGES))  # its own pages, kept until the side ends
    sender._end_room()
