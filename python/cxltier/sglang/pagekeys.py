"""The key scheme of KV pages that the SGLang adapters share: the unified-
cache linker, the prefill-to-decode backend (cxltier.sglang.disagg) and the
HiCache backend's dtype. A page stored by one is a hit for the others only
if all three name it alike, so the names are made here, once: an entry's
key is SGLang's page hash XOR a mask naming the model, the rank shard, the
pool part, its geometry and the KV dtype."""

from ..prefix import part_mask


def key_suffix(model, tp_rank, tp_size, pp_rank=0, pp_size=1, cp_rank=0, cp_size=1, replicated=False):
    """The model and shard part of a pool's tag: a pool every TP rank holds
    alike (MLA's latent) is one copy for all ranks; any other is a rank's."""
    model = str(model or "default").replace("/", "-")
    shard = f"_pp{pp_rank}_{pp_size}_cp{cp_rank}_{cp_size}"
    return model + shard if replicated else f"{model}_tp{tp_rank}_{tp_size}{shard}"


def kv_dtype(server_dtype, pool_dtype):
    """The KV dtype in a page's key: the server's --kv-cache-dtype unless
    "auto" (or unset), else the dtype of the pool's buffers (torch's name
    without "torch."). Servers of one model with different KV dtypes
    (fp8_e4m3 and fp8_e5m2 pools both hold uint8) never load each other's
    pages, and "auto" never names a dtype of its own."""
    server = str(server_dtype) if server_dtype is not None else "auto"
    if server not in ("auto", "", "None"):
        return server
    return str(pool_dtype).replace("torch.", "")


def layout(layers, per_layer, chunk, dtype):
    """A part's geometry and dtype, as both sides of a transfer compare it."""
    return f"L{layers}x{per_layer}x{chunk}/{dtype}"


def pool_mask(suffix, pool, part, page_size, layout_):
    """The key mask of one part of one pool (pool "kv", "swa", ...; part
    its index): what the linker stores and loads under, and so what the
    prefill-to-decode backend stores under for the decode and every later
    engine to find."""
    return part_mask(f"{suffix}/linker/v1/{pool}.{part}/p{page_size}/{layout_}")
