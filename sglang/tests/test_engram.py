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
