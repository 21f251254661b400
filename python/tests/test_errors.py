import pytest

import cxltier


def test_missing_tier_is_not_found(built):
    with pytest.raises(cxltier.NotFoundError, match="backing does not exist"):
        cxltier.Tier("shm:cxltier-py-no-such-tier")


def test_bad_backing_is_invalid(built):
    with pytest.raises(cxltier.InvalidError, match="want shm:NAME"):
        cxltier.Tier("tape:/dev/st0")


def test_missing_index_carries_go_message(built, device):
    with cxltier.Tier(device) as t:
        with pytest.raises(cxltier.NotFoundError) as e:
            t.prefix("nope")
        assert "nope" in str(e.value) and "not found" in str(e.value)
        assert e.value.code == -2


def test_payload_too_large(built, device):
    with cxltier.Tier(device) as t:
        ix = t.prefix("small", blocks=4, block_bytes=256)
        with pytest.raises(cxltier.InvalidError, match="too large|larger"):
            ix.set([cxltier.string_key("k")], [b"x" * 257])
        bufs = [bytearray(10)]
        ix.set([cxltier.string_key("k")], [b"y" * 200])
        with pytest.raises(cxltier.InvalidError, match="buffer of 10 bytes"):
            ix.get([cxltier.string_key("k")], bufs)


def test_bad_keys_and_buffers_refused_before_the_call(built, device):
    with cxltier.Tier(device) as t:
        ix = t.prefix("m", blocks=4, block_bytes=256)
        with pytest.raises(ValueError, match="want 32"):
            ix.exists([b"short"])
        with pytest.raises(ValueError, match="not a hex digest"):
            ix.exists(["page-1"])
        with pytest.raises(ValueError, match="2 keys but 1 buffers"):
            ix.set([cxltier.string_key("a"), cxltier.string_key("b")], [b"x"])
        with pytest.raises(ValueError, match="read-only"):
            ix.get([cxltier.string_key("a")], [b"immutable"])


def test_use_after_close(built, device):
    t = cxltier.Tier(device)
    ix = t.prefix("m", blocks=4, block_bytes=256)
    t.close()
    with pytest.raises(cxltier.ClosedError):
        ix.exists([cxltier.string_key("a")])
    with pytest.raises(cxltier.ClosedError):
        t.prefix("m")


def test_bad_page_size(built):
    with pytest.raises(cxltier.InvalidError, match="page size"):
        cxltier.page_keys([1, 2, 3], 0)


def test_tenant_key(built, device):
    with cxltier.Tier(device) as t:
        ix = t.prefix("tenant", blocks=4, block_bytes=256, key="s3cret")
        ix.set([cxltier.string_key("a")], [b"mine"])
        ix.close()
        with pytest.raises(cxltier.DeniedError, match="wrong or missing index key"):
            t.prefix("tenant")
        with pytest.raises(PermissionError):
            t.prefix("tenant", key="guess")
        ix = t.prefix("tenant", key="s3cret")
        assert ix.exists([cxltier.string_key("a")]) == 1


def test_cli_script_runs_the_go_cli(cli):
    """The `cxltier` script pip installs runs the Go CLI ($CXLTIER_CLI here)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, CXLTIER_CLI=cli)
    out = subprocess.run([sys.executable, "-m", "cxltier._cli", "engram", "presets"], env=env, capture_output=True,
                         text=True, check=True, cwd=os.path.join(os.path.dirname(__file__), ".."))
    assert "v4.1-flash" in out.stdout
    env["CXLTIER_CLI"] = "/nonexistent/cxltier"
    bad = subprocess.run([sys.executable, "-m", "cxltier._cli", "status"], env=env, capture_output=True, text=True,
                         cwd=os.path.join(os.path.dirname(__file__), ".."))
    assert bad.returncode == 127 and "CXLTIER_CLI" in bad.stderr


def test_prebuilt_calls_raise_what_the_library_says(built, device):
    """_native.prebuilt converts its fixed arguments once; its errors are the
    generic path's, with the Go message."""
    import ctypes

    from cxltier import _native
    from cxltier.prefix import KeyBlock

    with pytest.raises(ValueError, match="3 fixed arguments, it takes 2"):
        _native.prebuilt("cxl_prefix_verify_reads", 1, 1, 1)
    with pytest.raises(cxltier.NotFoundError, match="handle 987654321"):
        _native.prebuilt("cxl_prefix_verify_reads", 987654321, 1)()
    with cxltier.Tier(device) as t:
        ix = t.prefix("m", blocks=4, block_bytes=256)
        keys = [cxltier.string_key(s) for s in "abc"]
        ix.set(keys[:1] + keys[2:], [b"x", b"z"])
        raw = b"".join(keys)
        block = KeyBlock((ctypes.c_uint8 * len(raw)).from_buffer_copy(raw), 3)
        assert ix.exists_block(block) == 1
        assert ix.has_block(block) == [True, False, True]
        with pytest.raises(cxltier.InvalidError):
            ix._hot("cxl_prefix_exists")[0](None, ctypes.c_int64(-1), None)
        ix.close()
        with pytest.raises(cxltier.ClosedError):
            ix.exists_block(block)
