"""The GPU paths of the library inside a PyTorch process: the top-k pool and
the Engram prefetcher on the CUDA engine, on torch's current stream, with
selections, outputs and appended entries in torch tensors. Skipped unless
torch sees a GPU and the library was built with the cuda tag (CI has
neither; run on a GPU machine with CXLTIER_LIB pointing at a cuda build)."""

import json
import random
import subprocess

import pytest

import cxltier
from cxltier.topk import TopKPool

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no GPU", allow_module_level=True)

from test_engram import GEOMETRY, synthetic_row  # noqa: E402
from test_topk import ENTRY, entry  # noqa: E402


def cuda_pool(t, **kw):
    try:
        return TopKPool(t, engine="cuda", stream=torch.cuda.current_stream().cuda_stream, **kw)
    except cxltier.CxlTierError as e:
        pytest.skip(f"library has no CUDA engine: {e}")


def test_topk_device_paths_agree_with_the_cpu_engine(device):
    rng = random.Random(3)
    S, K, N, layers = 32, 16, 300, 2
    with cxltier.Tier(device) as t, cuda_pool(t, layers=layers, entry_bytes=ENTRY, slots=S, topk=K, max_requests=4) as gpu, \
            TopKPool(t, layers=layers, entry_bytes=ENTRY, slots=S, topk=K, max_requests=4, engine="cpu") as cpu:
        for req in (1, 3):
            cpu.register(req, capacity=N)
            gpu.register(req, capacity=N)
            for layer in range(layers):
                raw = b"".join(entry(req, layer, p) for p in range(N))
                cpu.append(req, layer, raw)
                src = torch.frombuffer(bytearray(raw), dtype=torch.uint8).cuda()
                gpu.append_device(req, layer, src.data_ptr(), N)  # scattered from GPU memory into the tier
                torch.cuda.current_stream().synchronize()
        assert gpu.length(3, 1) == N
        ptr, size, row, per = gpu.buffer(0)
        assert ptr != 0 and row == ENTRY and per == S + 1 and size >= 4 * per * row
        prev = {1: [], 3: []}
        for step in range(30):
            sel = []
            for req in (1, 3):
                keep = [p for p in prev[req] if rng.random() < 0.85 and p != N - 1]
                r = list(dict.fromkeys(keep + [N - 1] + rng.sample(range(N - 1), K)))[:K]
                prev[req] = r
                sel.append(r)
            layer = step % layers
            want, want_step = cpu.resolve(layer, [1, 3], [N, N], sel)
            topk = torch.tensor(sel, dtype=torch.int32, device="cuda")
            out = torch.empty_like(topk)
            got_step = gpu.resolve_device(layer, [1, 3], [N, N], topk.data_ptr(), out.data_ptr())
            torch.cuda.current_stream().synchronize()
            assert out.cpu().tolist() == want, f"step {step}: slots differ from the CPU engine's"
            assert got_step == want_step
            for b, req in enumerate((1, 3)):
                for pos, slot in list(zip(sel[b], want[b]))[:: max(1, K // 4)]:
                    assert gpu.read_slot(layer, req, slot) == entry(req, layer, pos)
        assert gpu.stats()["hits"] > 0


@pytest.mark.parametrize("planner", ["host", "engine"])
def test_engram_prefetch_into_gpu_memory(cli, device, tmp_path, planner):
    geo = tmp_path / "geo.json"
    geo.write_text(json.dumps(GEOMETRY))
    subprocess.run([cli, "engram", "load", "--config", str(geo), "--layer", "1", "--synthetic", device], check=True, capture_output=True)
    with cxltier.Tier(device) as t:
        try:
            p = cxltier.EngramPrefetcher(t, GEOMETRY, engine="cuda", stream=torch.cuda.current_stream().cuda_stream, slots=256,
                                         cache=True, planner=planner)
        except cxltier.CxlTierError as e:
            pytest.skip(f"library has no CUDA engine: {e}")
        with p:
            seqs = [[5, 17, 99, 3], [42, 42, 7]]
            for _ in range(2):  # the second call is served from the GPU cache
                pf = p.prefetch(1, seqs)
                pf.wait()
                rows = [r for s in seqs for pos in cxltier.engram_hash(GEOMETRY, 1, s) for r in pos]
                for r, slot in zip(rows, pf.slots):
                    assert p.read_row(1, slot, 64) == synthetic_row(1, r, 64)
            ptr, size, row = p.buffer(1)
            assert ptr != 0 and row == 64 and size >= 256 * 64
            # the cache is ordinary device memory torch can read through its own copy
            assert p.stats()["hits"] >= len(rows)


@pytest.mark.parametrize("chunk", [32768, 656 * 16])  # vectors in every lane; a chunk not a multiple of 512
def test_kv_pool_on_the_gpu_checks_what_it_moves(device, chunk):
    """A KV pool of GPU buffers on the CUDA engine: the store's checksums
    (taken by the scatter kernel) are what the CPU computes from the tier,
    a verified load lands the stored bytes, and a byte changed in the tier
    fails the load that reads it (the gather kernel's checksum) and drops
    the entry, so the engine recomputes the page."""
    import mmap

    from cxltier.kvpool import KVPool
    from cxltier.prefix import part_keys, string_key

    layers, pages = 3, 6
    bufs = [torch.randint(0, 256, (pages, chunk), dtype=torch.uint8, device="cuda") for _ in range(2 * layers)]
    keys = part_keys([string_key(f"gpu-kv-{chunk}-{i}").hex() for i in range(2)], [string_key("gpu")])
    with cxltier.Tier(device) as t:
        ix = t.prefix(f"gpu-kv-{chunk}", 8, 2 * layers * chunk)
        try:
            pool = KVPool(ix, [(b.data_ptr(), b.numel()) for b in bufs], 2, chunk, chunk, engine="cuda",
                          stream=torch.cuda.current_stream().cuda_stream, device=True)
        except cxltier.CxlTierError as e:
            pytest.skip(f"library has no CUDA engine: {e}")
        assert pool.store(keys, [0, 1]) == ["stored", "stored"]
        host = [bytes(b.cpu().numpy().tobytes()) for b in bufs]
        want = [b"".join(host[k][p * chunk:(p + 1) * chunk] for k in range(2 * layers)) for p in (0, 1)]
        served, _ = ix.get([keys.hex(0), keys.hex(1)], [bytearray(len(w)) for w in want])
        assert served == 2  # the stored checksums, checked by the CPU
        load = pool.load(keys, [3, 4])
        for layer in range(layers):
            load.layer(layer)
        load.close()
        for b in bufs:
            assert torch.equal(b[3], b[0]) and torch.equal(b[4], b[1])
        with open("/dev/shm/" + device.split(":", 1)[1], "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            at = m.find(want[1][-64:])
            assert at >= 0
            m[at + 5] ^= 0x10
        load = pool.load(keys, [3, 4])
        with pytest.raises(cxltier.ChecksumError):
            for layer in range(layers):
                load.layer(layer)
        with pytest.raises(cxltier.ChecksumError):
            load.close()
        assert ix.exists_block(keys) == 1  # the damaged second page is gone, the first kept
        pool.close()
