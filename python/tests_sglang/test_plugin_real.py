"""The plugin through SGLang's real plugin loader (sglang.srt.plugins), the
HiSparse host pool built as hisparse_coordinator builds it, and the Engram
hook following a real ReqToTokenPool."""

import os
import subprocess
import sys
import textwrap
import tomllib
from types import SimpleNamespace

import torch

from cxltier.sglang import engram_hook, hisparse

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(PACKAGE_DIR, "pyproject.toml"), "rb") as f:
    PROJECT = tomllib.load(f)["project"]


def run_loader(tmp_path, device, extra_code="", _after=None, **env):
    """Loads plugins in a fresh process with SGLang's loader, our entry
    point declared in dist-info metadata as pip would write it."""
    dist = tmp_path / f"cxltier-{PROJECT['version']}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: cxltier\nVersion: {PROJECT['version']}\n")
    entry = PROJECT["entry-points"]["sglang.srt.plugins"]["cxltier"]  # the entry point pip installs
    (dist / "entry_points.txt").write_text(f"[sglang.srt.plugins]\ncxltier = {entry}\n")
    code = textwrap.dedent(f"""
        import logging, sys
        sys.path[:0] = [{str(tmp_path)!r}, {PACKAGE_DIR!r}]
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
        {extra_code}
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.managers import hisparse_coordinator as hc
        from sglang.srt.model_executor.model_runner import ModelRunner
        print("HISPARSE", [getattr(getattr(hc, n, None), "_cxltier", False) for n in
              ("MLATokenToKVPoolHost", "HiSparseMHATokenToKVPoolHost", "DeepSeekV4PagedHostPool")])
        print("ENGRAM", getattr(ModelRunner.forward, "_cxltier_engram", False))
        from sglang.srt.layers import engram
        print("HOSTTABLE", engram._HostTable.__name__, getattr(engram.EngramEmbedding._load_rows, "_cxltier", False))
        from sglang.srt.layers import engram_staging
        print("STAGER", engram_staging.EngramRowStager.__name__)
        from sglang.srt.managers.cache_controller import HiCacheController
        from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinkerWrapper
        print("TOKENS", getattr(HiCacheController._page_backup, "_cxltier_token_records", False),
              getattr(UnifiedCacheLinkerWrapper._offload_node, "_cxltier_token_records", False))
    """) + textwrap.dedent(_after or "")
    full_env = dict(os.environ, SGLANG_PLUGINS="cxltier", CXLTIER_DEVICES=device, **env)
    out = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


def test_loader_installs_every_part(built, device, tmp_path):
    log = run_loader(tmp_path, device, CXLTIER_HISPARSE_HOST_POOL="1", CXLTIER_ENGRAM="v4.1-flash",
                     CXLTIER_ENGRAM_HOST_TABLE="1")
    assert "Failed to execute general plugin" not in log, log[-3000:]
    assert "HISPARSE [True, True, True]" in log and "ENGRAM True" in log, log[-3000:]
    assert "HOSTTABLE TierHostTable True" in log and "STAGER TierRowStager" in log, log[-3000:]
    bare = run_loader(tmp_path, device)
    assert "HOSTTABLE _HostTable False" in bare and "STAGER EngramRowStager" in bare, bare[-3000:]
    assert "TOKENS True True" in bare, bare[-3000:]  # on by default: it acts only for a backend with "kv_events"
    off = run_loader(tmp_path, device, CXLTIER_KV_EVENTS="0")
    assert "TOKENS False False" in off, off[-3000:]


def test_loader_makes_the_disaggregation_backend_a_choice(built, device, tmp_path):
    """After SGLang's loader ran the plugin, SGLang's own argument parser
    takes --disaggregation-transfer-backend cxltier and get_kv_class finds
    its classes; CXLTIER_DISAGG=0 leaves the choices as they were."""
    code = """
        from sglang.srt.server_args import prepare_server_args
        from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class
        try:
            a = prepare_server_args(["--model-path", "m", "--device", "cpu", "--disaggregation-mode", "prefill",
                                     "--disaggregation-transfer-backend", "cxltier"])
        except SystemExit:
            print("REFUSED")
        else:
            print("SENDER", get_kv_class(TransferBackend(a.disaggregation_transfer_backend), KVClassType.SENDER).__name__)
    """
    log = run_loader(tmp_path, device, extra_code="", CXLTIER_DISAGG="1", _after=code)
    assert "SENDER CxlTierKVSender" in log, log[-3000:]
    off = run_loader(tmp_path, device, CXLTIER_DISAGG="0", _after=code)
    assert "REFUSED" in off and "SENDER" not in off, off[-3000:]


def test_unknown_sglang_classes_are_named_not_raised(built, device, tmp_path):
    """An SGLang without a pool class the plugin replaces: the HiSparse part
    is skipped with the SGLang version in the message, the rest installs,
    and SGLang's loader sees no failure."""
    log = run_loader(tmp_path, device, CXLTIER_HISPARSE_HOST_POOL="1", CXLTIER_ENGRAM="v4.1-flash",
                     extra_code="import sglang.srt.managers.hisparse_coordinator as hc; del hc.DeepSeekV4PagedHostPool")
    assert "Failed to execute general plugin" not in log
    assert "HiSparse host pool in the tier not installed: SGLang 0.5.23" in log and "DeepSeekV4PagedHostPool" in log
    assert "ENGRAM True" in log


def test_hisparse_pool_buffer_lies_in_the_tier(built, device, monkeypatch, no_cuda_register):
    """The DSA pool, constructed with hisparse_coordinator's arguments and
    class binding, has its KV buffer in tier memory; SGLang registers that
    buffer for CUDA itself, and its transfer views read it."""
    from sglang.srt.managers import hisparse_coordinator as hc
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    monkeypatch.setenv("CXLTIER_DEVICES", device)
    for name in hisparse.POOL_CLASSES:
        monkeypatch.setattr(hc, name, getattr(hc, name))  # undone after the test
    assert hisparse.install() == 3
    dev = MLATokenToKVPool(size=64, page_size=64, dtype=torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=8,
                           layer_num=2, device="cpu", enable_memory_saver=False)
    pool = hc.MLATokenToKVPoolHost(  # as HiSparseCoordinator.__init__ calls it
        buffer_info=dev.get_device_pool_infos()[0].buffer_info, device_capacity_tokens=dev.size, start_layer=0,
        end_layer=2, target_layer_num=2, host_to_device_ratio=2, host_size=0, page_size=64, layout="layer_first",
        override_kv_cache_dim=dev.kv_cache_dim)
    region = pool.allocator.regions[0]
    assert pool.kv_buffer.data_ptr() == region.address
    assert pool.kv_buffer.nbytes <= region.size
    assert no_cuda_register == [(region.address, pool.kv_buffer.nbytes)]
    # SGLang's own page views write and read the tier memory
    page = torch.arange(pool.get_data_page(64).numel(), dtype=torch.int16).to(torch.bfloat16)
    pool.set_from_flat_data_page(64, page)
    raw = bytes((region.size and region.buffer())[: pool.kv_buffer.nbytes])
    assert torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).view(pool.kv_buffer.shape)[:, 64:128].flatten().equal(page)
    pool.destroy()
    assert pool.allocator.regions == []


def test_engram_hook_follows_real_req_to_token_pool(built):
    """SGLang 0.5.23 frees a request with ReqToTokenPool.free(req); the hook
    forgets its row and the real free goes on (before, the wrapper raised
    TypeError: 'Req' object is not iterable, in the scheduler)."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    pool = ReqToTokenPool(size=8, max_context_len=32, device="cpu", enable_memory_saver=False)
    forgotten = []
    hook = SimpleNamespace(forget=forgotten.extend, counters={"errors": 0})
    engram_hook._forget_on_free(SimpleNamespace(req_to_token_pool=pool), hook)
    rows = pool.alloc_rows(2)
    req = SimpleNamespace(kv=SimpleNamespace(holds_kv=True, req_pool_idx=rows[1]))
    free_before = len(pool.free_slots)
    pool.free(req)
    assert forgotten == [rows[1]] and req.kv.req_pool_idx is None
    assert len(pool.free_slots) == free_before + 1
    pool.free_rows([rows[0]])
    assert forgotten == [rows[1], rows[0]] and hook.counters["errors"] == 0
    # a row the wrapper cannot read is logged, and SGLang's free still runs
    odd = SimpleNamespace()
    pool.free_rows([odd])
    assert hook.counters["errors"] == 1 and pool.free_slots[-1] is odd


def test_engram_hook_stays_off_for_native_engram(built, device, sglang_process_groups, monkeypatch):
    """A model with SGLang's own Engram layers (a real EngramEmbedding) gets
    no forward hook: its rows come from SGLang's host table."""
    from sglang.srt.layers import engram

    monkeypatch.setenv("CXLTIER_ENGRAM", "v4.1-flash")
    monkeypatch.setenv("CXLTIER_DEVICES", device)
    model = torch.nn.Module()
    model.add_module("engram", engram.EngramEmbedding(64, 256, 1, column_bounds=(0, 32, 64)))
    assert engram_hook.serves_engram_natively(model)
    assert engram_hook.hook_from_env(SimpleNamespace(model=model)) is False
    assert not engram_hook.serves_engram_natively(torch.nn.Linear(2, 2))
