"""SGLang's Engram host table in the tier, with SGLang itself: real
EngramEmbedding layers (SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1, shared
layout) in two-rank groups of real processes over SGLang's GroupCoordinator,
loaded through SGLang's weight loaders and finish_load
(engram_host_worker.py; its CPU patches are named there). Each rank is a
process of its own, forked from a server that imported torch and SGLang
once (forkserver.py): a rank started anew spent about 15 s importing."""

import json
import os
import socket
import subprocess

import pytest

import cxltier
import forkserver
from cxltier.sglang import engram_host
from cxltier import objects

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "engram_host_worker.py")
ROWS, LAYERS = 10_000, "1,14"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKERS = {}


@pytest.fixture(autouse=True, scope="module")
def workers(tmp_path_factory):
    """The module's fork server (engram_host_worker.py serve): torch and
    SGLang imported once, each rank a process forked from it."""
    WORKERS["server"] = forkserver.Client(WORKER, dict(os.environ), str(tmp_path_factory.mktemp("engram-workers")))
    yield
    WORKERS.pop("server").close()


def serve(device, world=2, rows=ROWS, layout="shared", model="test-model", **env):
    """One server-like group of `world` ranks; returns each rank's result
    and its output (stdout, then stderr)."""
    port = free_port()
    full = dict(os.environ, CXLTIER_DEVICES=device, CXLTIER_ENGRAM_MODEL=model,
                SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE="1", SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT=layout, **env)
    procs = [WORKERS["server"].start([str(r), str(world), str(port), str(rows), LAYERS], full, f"rank{r}")
             for r in range(world)]
    results = []
    for p in procs:
        out = "".join(p.communicate(timeout=300))
        assert p.returncode == 0, out[-3000:]
        line = [x for x in out.splitlines() if x.startswith("RESULT ")]
        assert line, out[-3000:]
        results.append((json.loads(line[0][7:]), out))
    return results


def write_checkpoint(path, *args):
    """engram_host_worker.py checkpoint PATH ROWS LAYERS [REVISION], forked."""
    p = WORKERS["server"].start(["checkpoint", str(path), str(ROWS), LAYERS, *args], dict(os.environ), "checkpoint")
    out = "".join(p.communicate(timeout=120))
    assert p.returncode == 0, out[-3000:]


def test_second_server_attaches_without_loading(built, device):
    first = serve(device)
    for res, log in first:
        for layer in ("1", "14"):
            got = res["layers"][layer]
            assert got["class"] == "TierHostTable" and got["same"], got
            assert got["skipped"] == 0 and not got["read_only"], got
        assert "cxltier: Engram host table layer 1" in log
    t = cxltier.Tier(device)
    tables = {o["name"]: o for o in objects.list_objects(t)}
    assert set(tables) == {"engram/test-model/sglang_engram_1", "engram/test-model/sglang_engram_14"}
    nbytes = ROWS * 256 + ROWS * 8
    for o in tables.values():
        assert o["state"] == "sealed" and o["size"] == nbytes and o["seals"] == 1, o
        assert o["label"].startswith("layer "), o
    used = json.loads(subprocess.check_output([built["cli"], "inspect", "-json", device]))["chunks"]["used"]

    # A restart or a second instance: the same rows, read-only, loader skipped.
    second = serve(device)
    for res, _ in second:
        for layer in ("1", "14"):
            got = res["layers"][layer]
            assert got["same"] and got["skipped"] == 2 and got["read_only"], got
    again = {o["name"]: o for o in objects.list_objects(t)}
    assert {n: o["seals"] for n, o in again.items()} == {n: 1 for n in tables}, again
    assert json.loads(subprocess.check_output([built["cli"], "inspect", "-json", device]))["chunks"]["used"] == used
    t.close()


def test_table_of_another_geometry_is_refused(built, device):
    serve(device, world=1)
    results = None
    with pytest.raises(AssertionError) as e:
        results = serve(device, world=1, rows=ROWS // 2)
    assert results is None
    assert "another model or geometry under this name" in str(e.value)


def test_damaged_table_is_reloaded_when_verify_is_on(built, device):
    serve(device, world=1)
    t = cxltier.Tier(device)
    name = "engram/test-model/sglang_engram_14"
    with objects.TierObject.open(t, name) as o:
        o.buffer()[12345] ^= 0xFF
        with pytest.raises(cxltier.ChecksumError):
            o.verify()
    t.close()
    res, log = serve(device, world=1, CXLTIER_ENGRAM_VERIFY="1")[0]
    assert "payload checksum mismatch; loading it again" in log, log[-2000:]
    assert res["layers"]["14"]["skipped"] == 0 and res["layers"]["14"]["same"], res
    assert res["layers"]["1"]["skipped"] == 2, res
    t = cxltier.Tier(device)
    assert objects.object_info(t, name)["seals"] == 2
    assert objects.object_info(t, name)["state"] == "sealed"
    t.close()


@pytest.mark.parametrize("model,key", [("test-model", "test-model"), ("DeepSeek V4.1:fp8 ü", "DeepSeek_V4.1_fp8__")])
def test_tables_loaded_by_the_cli_are_attached(built, device, tmp_path, model, key):
    """`cxltier engram load --model` writes the tables before any server
    starts; SGLang's EngramEmbedding then attaches them as they are, under
    the same names whatever the model is called (one naming function in the
    library, which the CLI and the Python package both call)."""
    ck = tmp_path / "model-00001-of-00001.safetensors"
    write_checkpoint(ck)
    out = subprocess.run([built["cli"], "engram", "load", "--model", model, "--file", str(ck), device],
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.count(f"loaded engram/{key}/") == 2, out
    # The server names its checkpoint: the digests the CLI sealed match its own.
    for res, _ in serve(device, model=model, CXLTIER_ENGRAM_CHECKPOINT=str(ck)):
        for layer in ("1", "14"):
            got = res["layers"][layer]
            assert got["same"] and got["skipped"] == 2 and got["read_only"], got


def test_a_table_of_another_checkpoint_is_loaded_again(built, device, tmp_path):
    """The CLI loaded a revised checkpoint of the same geometry under the
    model's name; a server of the original sees another digest in the seal
    and loads its own rows, instead of serving the revision's."""
    original, revised = tmp_path / "original", tmp_path / "revised"
    for folder, revision in ((original, "0"), (revised, "1")):
        folder.mkdir()
        write_checkpoint(folder / "model.safetensors", revision)
    out = subprocess.run([built["cli"], "engram", "load", "--model", "test-model", "--file", str(revised), device],
                         capture_output=True, text=True)
    assert out.returncode == 0, out
    for res, log in serve(device, CXLTIER_ENGRAM_CHECKPOINT=str(original)):
        for layer in ("1", "14"):
            got = res["layers"][layer]
            assert got["same"] and got["skipped"] == 0, (got, log[-2000:])
    t = cxltier.Tier(device)
    labels = {o["name"]: o["label"] for o in objects.list_objects(t)}
    t.close()
    assert all(engram_host.label_digest(l) for l in labels.values()), labels
    for res, _ in serve(device, CXLTIER_ENGRAM_CHECKPOINT=str(original)):  # its own now: attached
        assert all(l["same"] and l["skipped"] == 2 for l in res["layers"].values()), res


def test_per_rank_layout_keeps_a_table_per_rank(built, device):
    """SGLang's per_rank layout: each rank's rows in an object of its own,
    named by rank and width, attached by the next server's same rank."""
    for res, _ in serve(device, layout="per_rank"):
        assert all(l["same"] and l["skipped"] == 0 for l in res["layers"].values()), res
    t = cxltier.Tier(device)
    names = {o["name"]: o for o in objects.list_objects(t)}
    t.close()
    assert set(names) == {f"engram/test-model/sglang_engram_{l}.tp{r}of2" for l in (1, 14) for r in (0, 1)}, names
    assert all(o["state"] == "sealed" for o in names.values())
    for res, _ in serve(device, layout="per_rank"):
        assert all(l["same"] and l["skipped"] == 2 and l["read_only"] for l in res["layers"].values()), res


def test_names_fit_the_directory():
    long = engram_host.table_name("m" * 80, "sglang_engram_14", "per_rank", 3, 8)
    assert len(long.encode()) <= 64 and long.startswith("engram/mmm")
    assert engram_host.table_name("V4.1-Flash", "sglang_engram_1", "per_rank", 3, 8) == \
        "engram/V4.1-Flash/sglang_engram_1.tp3of8"
    assert engram_host.table_name("DeepSeek V4.1:fp8", "sglang_engram_1") == "engram/DeepSeek_V4.1_fp8/sglang_engram_1"
