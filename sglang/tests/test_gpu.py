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
