"""One TP rank of a server-like process for test_engram_host_real: joins a
gloo group of `world` processes, builds SGLang's real GroupCoordinator over
it, builds real EngramEmbedding layers with SGLang's host table enabled and
the cxltier plugin part installed, loads them through SGLang's own weight
loader and finish_load, and prints what it saw as JSON.

Patched, because CI has no GPU: torch.cuda.current_device (EngramEmbedding
asks for the device to decide how the GPU reads host rows) and
engram._sorted_host_reads (it queries the CUDA driver); nothing else.

    python engram_host_worker.py RANK WORLD PORT ROWS LAYERS
    python engram_host_worker.py checkpoint PATH ROWS LAYERS [REVISION]
    python engram_host_worker.py serve

serve: a fork server (forkserver.serve_lines) that imported torch and
SGLang once; each child runs as the script with its arguments would."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import forkserver  # noqa: E402

dim, scales = 256, 8


def checkpoint(layer, rows, revision=0):
    """What a V4.1 checkpoint would hold for layer: fp8 rows and e8m0 scales
    (another revision: the same shapes, other bytes)."""
    g = torch.Generator().manual_seed(layer + 1000 * revision)
    w = torch.randint(0, 256, (rows, dim), dtype=torch.uint8, generator=g)
    s = torch.randint(100, 140, (rows, scales), dtype=torch.uint8, generator=g)
    return w.view(torch.float8_e4m3fn), s.view(torch.float8_e8m0fnu)


def write_checkpoint(path, rows, layers, revision=0):
    """A checkpoint of layers, as safetensors."""
    from safetensors.torch import save_file

    tensors = {}
    for layer in layers:
        w, s = checkpoint(layer, rows, revision)
        tensors[f"layers.{layer}.engram.embed.weight"] = w
        tensors[f"layers.{layer}.engram.embed.scale"] = s
    save_file(tensors, path)


def shared_imports():
    """SGLang's modules a rank uses (the fork server imports them once)."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.layers import engram
    from sglang.srt.runtime_context import get_parallel

    from cxltier.sglang import engram_host

    return GroupCoordinator, engram, get_parallel, engram_host


def rank_main(rank, world, port, rows, layers):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    GroupCoordinator, engram, get_parallel, engram_host = shared_imports()
    torch.cuda.current_device = lambda: 0  # CPU: no device to ask
    engram._sorted_host_reads = lambda device: False

    group = GroupCoordinator([list(range(world))], rank, "gloo", use_pynccl=False, use_mscclpp=False,
                             use_custom_allreduce=False, use_torch_symm_mem_all_reduce=False,
                             use_hpu_communicator=False, use_xpu_communicator=False, group_name="tp")
    engram_host.install()
    out = {"rank": rank, "layers": {}}
    with get_parallel().override(tp_rank=rank, tp_size=world, tp_group=group, attn_tp_rank=rank, attn_tp_size=world,
                                 attn_dp_rank=0, attn_dp_size=1, attn_cp_rank=0, attn_cp_size=1):
        for layer in layers:
            bounds = (0, rows // 2, rows)
            t0 = time.perf_counter()
            emb = engram.EngramEmbedding(rows, dim, layer, column_bounds=bounds)
            w, s = checkpoint(layer, rows)
            # SGLang's DefaultModelLoader calls each parameter's weight_loader.
            emb.weight.weight_loader(emb.weight, w)
            emb.scale.weight_loader(emb.scale, s)
            emb.finish_load(f"layer {layer}")
            took = time.perf_counter() - t0
            table = emb.host_table
            # The shared layout holds every row; per_rank only this rank's.
            lo, n = (0, rows) if emb.weight.shape[0] == rows else (emb.row_start, emb.rows)
            same = bool(torch.equal(emb.weight.view(torch.uint8), w.view(torch.uint8)[lo:lo + n])
                        and torch.equal(emb.scale.view(torch.uint8), s.view(torch.uint8)[lo:lo + n]))
            out["layers"][layer] = {
                "class": type(table).__name__, "name": getattr(table, "name", None),
                "skipped": getattr(table, "skipped_loads", 0), "same": same, "seconds": took,
                "read_only": getattr(getattr(table, "object", None), "read_only", None),
                "address": table.bytes.data_ptr(), "device_ptr": table.device_ptr,
            }
    group.barrier()
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def main(argv):
    if argv[0] == "serve":
        shared_imports()
        from safetensors.torch import save_file  # noqa: F401
        forkserver.serve_lines("engram_host_worker serve", main)
    elif argv[0] == "checkpoint":
        write_checkpoint(argv[1], int(argv[2]), [int(x) for x in argv[3].split(",")],
                         int(argv[4]) if len(argv) > 4 else 0)
    else:
        rank_main(int(argv[0]), int(argv[1]), argv[2], int(argv[3]), [int(x) for x in argv[4].split(",")])


if __name__ == "__main__":
    main(sys.argv[1:])
