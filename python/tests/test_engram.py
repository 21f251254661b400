import json
import subprocess

import pytest

import cxltier


@pytest.mark.parametrize("preset,layer,ids", [("v4.1-flash", 1, [0, 1, 2]), ("v4.1-flash", 14, [5, 99091, 17, 17, 3]), ("demo", 1, [1, 2, 3, 4])])
def test_binding_agrees_with_cli(cli, preset, layer, ids):
    out = subprocess.run([cli, "engram", "hash", "--preset", preset, "--layer", str(layer), "--ids", ",".join(map(str, ids))],
                         capture_output=True, text=True, check=True).stdout
    want = [json.loads(line) for line in out.splitlines()]
    assert cxltier.engram_hash(preset, layer, ids) == want


def test_engram_md_check_vector(built):
    assert cxltier.engram_hash("v4.1-flash", 1, [0, 1, 2])[0][:3] == [5702652, 24393184, 39183301]


def test_engram_errors(built):
    with pytest.raises(cxltier.InvalidError, match="outside"):
        cxltier.engram_hash("v4.1-flash", 1, [0, 99092])
    with pytest.raises(cxltier.InvalidError, match="not an Engram layer"):
        cxltier.engram_hash("v4.1-flash", 2, [0])
    with pytest.raises(cxltier.CxlTierError, match="preset"):
        cxltier.engram_hash("nope", 1, [0])


GEOMETRY = {"name": "pytiny", "layer_ids": [1, 3], "max_ngram": 3, "heads_per_order": 2, "base_sizes": [40, 60],
            "seed": 11, "vocab": 100, "pad_id": 0, "row_bytes": 64, "dtype": "float32"}


def synthetic_row(layer, i, n):
    """engram.SyntheticRow, written again from its definition."""
    out = bytearray()
    m = (1 << 64) - 1
    for k in range(0, n, 8):
        x = (layer << 48) ^ (i << 12) ^ (k // 8)
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & m
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & m
        x ^= x >> 31
        out += x.to_bytes(8, "little")
    return bytes(out[:n])


def test_prefetch_rows_from_the_tier(cli, device, tmp_path):
    geo = tmp_path / "geo.json"
    geo.write_text(json.dumps(GEOMETRY))
    subprocess.run([cli, "engram", "load", "--config", str(geo), "--layer", "1", "--synthetic", device.replace("shm:", "shm:")],
                   check=True, capture_output=True)
    with cxltier.Tier(device) as t, cxltier.EngramPrefetcher(t, GEOMETRY, engine="cpu", slots=256, cache=True) as p:
        seqs = [[5, 17, 99, 3], [42, 42, 7]]
        pf = p.prefetch(1, seqs)
        assert pf.wait() >= 0
        rows = [r for s in seqs for pos in cxltier.engram_hash(GEOMETRY, 1, s) for r in pos]
        assert len(pf.slots) == len(rows)
        for row, slot in zip(rows, pf.slots):
            assert p.read_row(1, slot, 64) == synthetic_row(1, row, 64)
        # the same batch again: every row is a cache hit now
        p.prefetch(1, seqs).wait()
        st = p.stats()
        assert st["calls"] == 2 and st["hits"] >= len(rows)
        with pytest.raises(cxltier.InvalidError, match="no table for layer 3"):
            p.prefetch(3, seqs)  # layer 3 was never loaded
        with pytest.raises(cxltier.InvalidError, match="host memory"):
            p.buffer(1)  # the CPU engine's cache is not device memory
    with cxltier.Tier(device) as t:
        with pytest.raises(cxltier.NotFoundError, match="no table"):
            cxltier.EngramPrefetcher(t, dict(GEOMETRY, name="other"), engine="cpu")


def test_prefetch_without_the_cache_fetches_every_row(cli, device, tmp_path):
    geo = tmp_path / "geo.json"
    geo.write_text(json.dumps(GEOMETRY))
    subprocess.run([cli, "engram", "load", "--config", str(geo), "--layer", "1", "--synthetic", device], check=True, capture_output=True)
    with cxltier.Tier(device) as t, cxltier.EngramPrefetcher(t, GEOMETRY, engine="cpu", slots=64) as p:
        seqs = [[5, 17, 99, 3], [42, 42, 7]]
        rows = [r for s in seqs for pos in cxltier.engram_hash(GEOMETRY, 1, s) for r in pos]
        for _ in range(2):
            pf = p.prefetch(1, seqs)
            pf.wait()
            assert pf.slots == list(range(len(rows)))  # a call's rows in slots 0..n-1
            for row, slot in zip(rows, pf.slots):
                assert p.read_row(1, slot, 64) == synthetic_row(1, row, 64)
        st = p.stats()
        assert st["cache"] is False and st["hits"] == 0 and st["fetched"] == 2 * len(rows)
        with pytest.raises(cxltier.CxlTierError, match="slots"):
            p.prefetch(1, [list(range(1, 20))])  # 19 positions x 4 rows > 64 slots


def test_engine_planner_matches_host_planner(cli, device, tmp_path):
    """planner="engine" (on the CPU engine: the Go twin of the CUDA kernel)
    gives every row the slot the host planner gives it, call after call."""
    geo = tmp_path / "geo.json"
    geo.write_text(json.dumps(GEOMETRY))
    subprocess.run([cli, "engram", "load", "--config", str(geo), "--layer", "1", "--synthetic", device], check=True, capture_output=True)
    with cxltier.Tier(device) as t, \
            cxltier.EngramPrefetcher(t, GEOMETRY, engine="cpu", slots=256, cache=True, planner="host") as host, \
            cxltier.EngramPrefetcher(t, GEOMETRY, engine="cpu", slots=256, cache=True, planner="engine") as dev:
        assert dev.stats()["planner"] == "engine" and host.stats()["planner"] == "host"
        for seqs, hists in [([[5, 17, 99, 3], [42, 42, 7]], None), ([[8], [9]], [[5, 17, 99, 3], [42, 42, 7]]),
                            ([[5, 17, 99, 3]], None)]:
            a, b = host.prefetch(1, seqs, hists), dev.prefetch(1, seqs, hists)
            assert b.slots is None  # decided by the engine as it runs
            a.wait(), b.wait()
            assert a.slots == b.slots
            rows = [r for pos in cxltier.engram_hash(GEOMETRY, 1, seqs[0]) for r in pos] if hists is None else None
            for row, slot in zip(rows or [], b.slots):
                assert dev.read_row(1, slot, 64) == synthetic_row(1, row, 64)
        assert dev.stats()["hits"] == host.stats()["hits"] > 0
        with pytest.raises(ValueError, match="planner"):
            cxltier.EngramPrefetcher(t, GEOMETRY, engine="cpu", planner="gpu")


def test_detach_closes_the_prefetcher(cli, device, tmp_path):
    geo = tmp_path / "geo.json"
    geo.write_text(json.dumps(GEOMETRY))
    subprocess.run([cli, "engram", "load", "--config", str(geo), "--layer", "1", "--synthetic", device], check=True, capture_output=True)
    t = cxltier.Tier(device)
    p = cxltier.EngramPrefetcher(t, GEOMETRY, engine="cpu", slots=64)
    t.close()  # the prefetcher reads the mapping: it must go with the tier
    with pytest.raises(cxltier.NotFoundError, match="unknown handle"):
        p.prefetch(1, [[1, 2, 3]])


def test_geometry_file_path_as_the_cli_takes_it(cli, device, tmp_path):
    """A geometry file's path works wherever a preset or dict does (the CLI's
    --config, CXLTIER_ENGRAM); read_row copies a whole row by default."""
    geo = tmp_path / "geo.json"
    geo.write_text(json.dumps(GEOMETRY))
    assert cxltier.engram_hash(str(geo), 1, [5, 17]) == cxltier.engram_hash(GEOMETRY, 1, [5, 17])
    subprocess.run([cli, "engram", "load", "--config", str(geo), "--layer", "1", "--synthetic", device],
                   check=True, capture_output=True)
    with cxltier.Tier(device) as t, cxltier.EngramPrefetcher(t, geo, engine="cpu", slots=64) as p:
        assert p.row_bytes == 64
        pf = p.prefetch(1, [[5, 17]])
        pf.wait()
        rows = [r for pos in cxltier.engram_hash(GEOMETRY, 1, [5, 17]) for r in pos]
        assert [p.read_row(1, s) for s in pf.slots] == [synthetic_row(1, r, 64) for r in rows]
        with pytest.raises(cxltier.InvalidError, match="room for 8"):
            p.read_row(1, pf.slots[0], 8)
    with pytest.raises(cxltier.InvalidError, match="geometry file"):
        cxltier.engram_hash(str(tmp_path / "missing.json"), 1, [0])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(cxltier.InvalidError, match="not JSON"):
        cxltier.engram_hash(str(tmp_path / "bad.json"), 1, [0])
