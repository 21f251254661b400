"""SGLang's serving stack for the linker tests, on CPU: real device pools
and allocators, the real UnifiedRadixCache, and cxltier's linker built by
SGLang's own factory from published ServerArgs, as SGLang's registry
builds it. Nothing of SGLang is replaced.

Run as a script it is one TP rank of a gloo group (the test starts one OS
process per rank): it stores a prompt's KV through its tree, then loads it
into a fresh stack and prints what it saw as JSON."""

import array
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LAYERS = 3


def publish_server_args(device, page_size, index="linker", **extra):
    """Publishes ServerArgs that enable the dynamic linker with cxltier's
    config (SGLang's flags, as a user passes them), and returns them."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    config = {"linker": "CxlTierLinker", "linker_module_path": "cxltier.sglang.linker",
              "linker_extra_config": {"devices": device, "index": index, "blocks": 256, **extra}}
    reset_context()
    args = ServerArgs(model_path="dummy", device="cpu", page_size=page_size,
                      enable_unified_cache_external_linker=True, unified_cache_external_linker_backend="dynamic",
                      unified_cache_external_linker_config=config)
    publish(args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    return args


# Small heads for tests; a model's for benchmarks (DeepSeek-V3's MLA latent
# and rope, Llama-3-8B's 8 KV heads of 128 on one rank).
SMALL = {"kv_lora_rank": 16, "qk_rope_head_dim": 8, "head_num": 2, "head_dim": 8}
MODEL = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_num": 8, "head_dim": 128}


def kv_pool(kind, page_size, tokens, layers=LAYERS, dims=SMALL):
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool

    if kind == "swa":  # full attention at even layers, a sliding window at odd ones
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        return SWAKVPool(size=tokens, size_swa=tokens, page_size=page_size, dtype=torch.bfloat16, head_num=dims["head_num"],
                         head_dim=dims["head_dim"], swa_attention_layer_ids=list(range(1, layers, 2)),
                         full_attention_layer_ids=list(range(0, layers, 2)), device="cpu", enable_memory_saver=False,
                         enable_alt_stream=False)
    if kind == "dsa":  # DeepSeek sparse attention: the latent, and the indexer's keys a row per page
        return DSATokenToKVPool(size=tokens, page_size=page_size, kv_lora_rank=16, dtype=torch.bfloat16, qk_rope_head_dim=8,
                                layer_num=layers, device="cpu", index_head_dim=128, enable_memory_saver=False,
                                kv_cache_dim=24)
    if kind == "mla":
        return MLATokenToKVPool(size=tokens, page_size=page_size, dtype=torch.bfloat16, kv_lora_rank=dims["kv_lora_rank"],
                                qk_rope_head_dim=dims["qk_rope_head_dim"], layer_num=layers, device="cpu",
                                enable_memory_saver=False)
    return MHATokenToKVPool(size=tokens, page_size=page_size, dtype=torch.bfloat16, head_num=dims["head_num"],
                            head_dim=dims["head_dim"], layer_num=layers, device="cpu", enable_memory_saver=False,
                            enable_alt_stream=False)


def layer_buffers(pool, layer):
    """The buffers of a layer, K then V (MHA) or the latent (MLA; DSA adds
    its indexer's keys), each with whether its rows are pages (SWA: the
    sub-pool's, and whether the layer is a window's)."""
    if hasattr(pool, "layers_mapping"):
        lid, is_swa = pool.layers_mapping[layer]
        sub = pool.swa_kv_pool if is_swa else pool.full_kv_pool
        return [(sub.k_buffer[lid], is_swa), (sub.v_buffer[lid], is_swa)]
    if hasattr(pool, "k_buffer"):
        return [(pool.k_buffer[layer], False), (pool.v_buffer[layer], False)]
    out = [(pool.kv_buffer[layer], False)]
    if hasattr(pool, "index_k_with_scale_buffer"):
        out.append((pool.index_k_with_scale_buffer[layer], True))
    return out


def rows(pool, slots, page_size, flag):
    """The rows of slots in a buffer: the page rows of a DSA indexer, the
    window's own slots of an SWA layer."""
    if hasattr(pool, "layers_mapping"):
        return pool.translate_loc_from_full_to_swa(slots) if flag else slots
    return slots[::page_size] // page_size if flag else slots


class Stack:
    """One rank's KV pool, allocator, tree and linker."""

    def __init__(self, server_args, kind, page_size, tokens=512, group=None, layers=LAYERS, dims=SMALL, window=8):
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_cache.linker_factory import (create_unified_cache_linker,
                                                                        get_startup_linker_config)
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        self.page_size = page_size
        self.layers = layers
        self.pool = kv_pool(kind, page_size, tokens, layers, dims)
        components = (ComponentType.FULL,)
        if kind == "swa":
            self.alloc = SWATokenToKVPoolAllocator(tokens, tokens, page_size, torch.bfloat16, "cpu", self.pool, False)
            components = (ComponentType.FULL, ComponentType.SWA)
        elif page_size == 1:
            self.alloc = TokenToKVPoolAllocator(tokens, torch.bfloat16, "cpu", self.pool, False)
        else:
            self.alloc = PagedTokenToKVPoolAllocator(tokens, page_size, torch.bfloat16, "cpu", self.pool, False)
        params = CacheInitParams(disable=False, req_to_token_pool=ReqToTokenPool(8, 2048, "cpu", False),
                                 token_to_kv_pool_allocator=self.alloc, page_size=page_size,
                                 tree_components=components, tp_cache_group=group,
                                 sliding_window_size=window if kind == "swa" else None)
        self.cache = UnifiedRadixCache(params)
        # What SGLang's registry does with --enable-unified-cache-external-linker.
        self.cache.init_cache_linker(create_unified_cache_linker(
            server_args, params, backend="dynamic", config=get_startup_linker_config(),
            components=set(self.cache.components)))
        self.pool.register_layer_transfer_counter(self.cache.linker.layer_done_counter)
        self.linker = self.cache.linker.cache_linker

    def fill(self, slots, seed):
        """Writes KV made from seed into slots (what a forward would);
        returns it per layer and buffer."""
        gen = torch.Generator().manual_seed(seed)
        out = []
        for layer in range(self.layers):
            row = []
            for buf, paged in layer_buffers(self.pool, layer):
                at = rows(self.pool, slots, self.page_size, paged)
                data = torch.randn((len(at),) + tuple(buf.shape[1:]), generator=gen).to(buf.dtype)
                buf[at] = data
                row.append(data)
            out.append(row)
        return out

    def store(self, tokens, seed):
        """A prefill's KV inserted into the tree, which offloads it through
        the linker (write-through); waits until the offloads are committed."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        slots = self.alloc.alloc(len(tokens))
        kv = self.fill(slots, seed)
        self.cache.insert(InsertParams(key=RadixKey(array.array("q", tokens)), value=slots))
        deadline = time.monotonic() + 30
        while self.cache.linker.pending_offloads and time.monotonic() < deadline:
            self.cache.check_hicache_events()
            time.sleep(0.01)
        assert not self.cache.linker.pending_offloads, "offloads did not complete"
        return kv

    def load(self, tokens, rid="r", snapshot=True):
        """A new request for tokens as the scheduler runs it: match, load
        back into the request's own slots, a forward reading layer by layer,
        then the load's verdict. Returns (tokens hit, slots, KV each layer
        held when the forward reached it, failed requests); times of the
        match and of the load (start to verdict) in self.timings."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.sampling.sampling_params import SamplingParams

        req = Req(rid, "", array.array("i", tokens), SamplingParams(max_new_tokens=1))
        started = time.perf_counter()
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array.array("q", tokens)), req=req))
        req.last_node = m.last_device_node
        hit, _ = self.cache.init_load_back(InitLoadBackParams(best_match_node=m.last_host_node,
                                                              host_hit_length=m.host_hit_length, req=req))
        slots = self.cache.linker.private_load_indices.get(rid)
        matched = time.perf_counter()
        index = self.cache.ready_to_load_host_cache()
        self.cache.linker.layer_done_counter.set_consumer(index)
        seen = []
        for layer in range(self.layers):
            self.pool.get_key_buffer(layer)  # waits for the layer, as attention does
            if snapshot:
                seen.append([buf[rows(self.pool, slots, self.page_size, paged)].clone()
                             for buf, paged in layer_buffers(self.pool, layer)]
                            if slots is not None else [])
        failed = self.cache.finish_external_linker_loads([req])
        self.timings = {"match": matched - started, "load": time.perf_counter() - matched}
        return hit, slots, seen, [r.rid for r in failed]

    def close(self):
        self.cache.linker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def same(a, b):
    return all(torch.equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb)) and len(a) == len(b)


def rank_main(rank, world, port, device, kind, page_size, pages=8, mode="roundtrip", extra=None):
    """One TP rank: store a prompt of pages pages (KV identical on every
    rank for MLA, the rank's own heads for MHA), then (mode roundtrip) load
    it into a fresh stack."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    args = publish_server_args(device, page_size, **(extra or {}))
    tokens = list(range(1000, 1000 + pages * page_size))
    seed = 7 if kind == "mla" else 7 + rank
    if mode == "store":  # a model's geometry
        a = Stack(args, kind, page_size, tokens=len(tokens) + page_size, group=dist.group.WORLD, layers=8, dims=MODEL)
        a.store(tokens, seed)
        print(json.dumps({"rank": rank, "stored": dict(a.linker.stats)}))
        a.close()
        dist.destroy_process_group()
        return
    # The ranks come from the gloo group, as the linker reads them from
    # SGLang's TP cache group.
    a = Stack(args, kind, page_size, group=dist.group.WORLD)
    kv = a.store(tokens, seed)
    stored = dict(a.linker.stats)
    a.close()
    dist.barrier()
    b = Stack(args, kind, page_size, group=dist.group.WORLD)
    hit, slots, seen, failed = b.load(tokens)
    b.close()
    print(json.dumps({"rank": rank, "hit": hit, "failed": failed, "same": same(kv, seen), "stored": stored}))
    dist.destroy_process_group()


if __name__ == "__main__":
    # rank world port device kind page_size [pages [mode [extra config JSON]]]
    more = sys.argv[7:]
    rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]),
              pages=int(more[0]) if more else 8, mode=more[1] if len(more) > 1 else "roundtrip",
              extra=json.loads(more[2]) if len(more) > 2 else None)
