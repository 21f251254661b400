"""Loading libcxltier and calling it: prototypes, error buffers, and the
mapping of its error codes to Python exceptions carrying the Go message."""

import ctypes
import json
import os
import sys
import threading

ABI_VERSION = 22
_ERRLEN = 1024


class CxlTierError(Exception):
    """A libcxltier call failed; `code` is its CXL_E* code, the message is Go's."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class InvalidError(CxlTierError, ValueError):
    """CXL_EINVAL: a bad argument or configuration."""


class NotFoundError(CxlTierError, KeyError):
    """CXL_ENOTFOUND: no such tier object, handle or entry."""

    def __str__(self):  # KeyError would quote the message
        return self.args[0]


class ExistsError(CxlTierError):
    """CXL_EEXIST."""


class NoSpaceError(CxlTierError):
    """CXL_ENOSPACE: the tier or the index is full."""


class ChecksumError(CxlTierError):
    """CXL_ECHECKSUM: a payload failed its checksum; the entry was dropped."""


class ClosedError(CxlTierError):
    """CXL_ECLOSED: the handle was closed or the client lost its lease."""


class RangeError(CxlTierError):
    """CXL_ERANGE: an output buffer was too small."""


class DeniedError(CxlTierError, PermissionError):
    """CXL_EDENIED: the index's tenant key is wrong or missing."""


class BusyError(CxlTierError):
    """CXL_EBUSY: held by another client for now (a lock wait timed out, an entry is pinned); retry."""


class DamagedError(CxlTierError):
    """CXL_EDAMAGED: shared metadata failed a consistency check; run `cxltier repair`, do not retry."""


_BY_CODE = {-1: InvalidError, -2: NotFoundError, -3: ExistsError, -4: NoSpaceError, -5: ChecksumError, -6: ClosedError,
            -7: RangeError, -8: DeniedError, -9: BusyError, -10: DamagedError}

_u64, _i64, _i8, _int = ctypes.c_uint64, ctypes.c_int64, ctypes.c_int8, ctypes.c_int
_p = ctypes.POINTER
_cstr = ctypes.c_char_p
_bytes = _p(ctypes.c_uint8)
_err = [ctypes.c_char_p, _int]

_PROTOTYPES = {
    "cxl_abi_version": [],
    "cxl_attach": [_cstr, _cstr, _p(_u64)] + _err,
    "cxl_detach": [_u64] + _err,
    "cxl_tier_hold": [_u64, _p(_u64)] + _err,
    "cxl_tier_release": [_u64] + _err,
    "cxl_prefix_open": [_u64, _cstr, _cstr, _i64, _i64, _p(_u64)] + _err,
    "cxl_prefix_close": [_u64] + _err,
    "cxl_prefix_keys": [_int, _p(_i64), _i64, _bytes, _bytes, _i64, _p(_i64)] + _err,
    "cxl_prefix_exists": [_u64, _bytes, _i64, _p(_i64)] + _err,
    "cxl_prefix_set": [_u64, _bytes, _i64, _p(ctypes.c_void_p), _p(_i64), _p(_i8)] + _err,
    "cxl_prefix_get": [_u64, _bytes, _i64, _p(ctypes.c_void_p), _p(_i64), _p(_i64), _p(_i64)] + _err,
    "cxl_prefix_setv": [_u64, _bytes, _i64, _i64, _p(ctypes.c_void_p), _p(_i64), _p(_i8)] + _err,
    "cxl_prefix_getv": [_u64, _bytes, _i64, _i64, _p(ctypes.c_void_p), _p(_i64), _p(_i64)] + _err,
    "cxl_prefix_part_keys": [ctypes.c_char_p, _p(_i64), _i64, _bytes, _i64, _bytes] + _err,
    "cxl_prefix_verify_reads": [_u64, ctypes.c_int] + _err,
    "cxl_prefix_exists_pages": [_u64, ctypes.c_char_p, _i64, _i64, _bytes, _i64, _p(_i64)] + _err,
    "cxl_prefix_part_keys_joined": [ctypes.c_char_p, _i64, _i64, _bytes, _i64, _bytes] + _err,
    "cxl_prefix_delete": [_u64, _bytes, _i64, _p(_i64)] + _err,
    "cxl_prefix_stats": [_u64, ctypes.c_char_p, _int] + _err,
    "cxl_prefix_list": [_u64, _bytes, _i64, _p(_i64)] + _err,
    "cxl_prefix_has": [_u64, _bytes, _i64, _p(_i8)] + _err,
    "cxl_prefix_keep": [_u64, _bytes, _i64, _p(_i8), _p(_u64)] + _err,
    "cxl_prefix_names": [_u64, ctypes.c_char_p, _i64, _p(_i64)] + _err,
    "cxl_uplink_off": [_u64] + _err,
    "cxl_uplink_address": [_u64, ctypes.c_char_p, _int] + _err,
    "cxl_tier_replaced": [_u64, ctypes.c_char_p, _int] + _err,
    "cxl_tier_populate": [_u64, _p(_i64)] + _err,
    "cxl_tier_lease": [_u64, _p(_i64), _p(ctypes.c_uint32)] + _err,
    "cxl_tier_lease_gone": [_u64, _i64, ctypes.c_uint32, _p(_i8)] + _err,
    "cxl_tier_link": [_u64, _cstr, _i64, ctypes.c_char_p, _int] + _err,
    "cxl_link_stats": [_u64, _cstr, ctypes.c_char_p, _int] + _err,
    "cxl_link_turn": [_u64, _i64] + _err,
    "cxl_tier_bulk_priority": [_u64, _cstr, ctypes.c_char_p, _int] + _err,
    "cxl_rooms_open": [_u64, _cstr, _cstr, _i64, _i64, _p(_u64)] + _err,
    "cxl_rooms_close": [_u64] + _err,
    "cxl_rooms_claim": [_u64, _u64, ctypes.c_uint32, _p(_i64), _p(ctypes.c_uint32)] + _err,
    "cxl_rooms_find": [_u64, _u64, ctypes.c_uint32, _p(_i64), _p(ctypes.c_uint32), _p(_i8)] + _err,
    "cxl_rooms_put": [_u64, _i64, ctypes.c_uint32, _int, _cstr, ctypes.c_void_p, _i64] + _err,
    "cxl_rooms_get": [_u64, _i64, ctypes.c_uint32, _int, _cstr, ctypes.c_void_p, _i64, _p(_i64), _p(_i8)] + _err,
    "cxl_rooms_release": [_u64, _i64, ctypes.c_uint32] + _err,
    "cxl_rooms_end": [_u64, _i64, ctypes.c_uint32, _int, _p(_i8)] + _err,
    "cxl_rooms_stats": [_u64, _cstr, _int] + _err,
    "cxl_tier_registered": [_u64, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, _int] + _err,
    "cxl_tier_mappings": [_u64, _p(ctypes.c_void_p), _p(_i64), _i64, _p(_i64), _p(_u64)] + _err,
    "cxl_page_trailer_bytes": [],
    "cxl_prefix_namespace": [_u64, ctypes.c_char_p, _int] + _err,
    "cxl_prefix_pin": [_u64, _bytes, _i64, _p(ctypes.c_void_p), _p(_i64), _p(ctypes.c_uint8), _p(_i8), _p(_i8),
                       _p(_u64)] + _err,
    "cxl_prefix_fill_begin": [_u64, _bytes, _i64, _p(_i64), _p(_i8), _p(_u64)] + _err,
    "cxl_prefix_fill_blocks": [_u64, _p(ctypes.c_void_p), _i64] + _err,
    "cxl_prefix_fill_commit": [_u64, _p(ctypes.c_void_p), _i64, _p(_i8)] + _err,
    "cxl_prefix_fill_close": [_u64] + _err,
    "cxl_prefix_cluster_key": [_u64, _p(ctypes.c_uint8), _i64] + _err,
    "cxl_prefix_unpin": [_u64] + _err,
    "cxl_prefix_room": [_u64, _p(_i64)] + _err,
    "cxl_kvpool_open": [_u64, _cstr, _u64, _i64, _i64, _p(ctypes.c_void_p), _p(_i64), _i64, _i64, _int, _int, _p(_u64)] + _err,
    "cxl_kvpool_close": [_u64] + _err,
    "cxl_kvpool_first_token": [_u64, _int, _int] + _err,
    "cxl_kvpool_store": [_u64, _bytes, _i64, _p(_i64), _p(_i8)] + _err,
    "cxl_kvpool_get": [_u64, _bytes, _i64, _p(_i64)] + _err,
    "cxl_kvpool_load_start": [_u64, _bytes, _i64, _p(_i64), _p(_u64)] + _err,
    "cxl_kvpool_load_layer": [_u64, _int] + _err,
    "cxl_kvpool_load_close": [_u64] + _err,
    "cxl_engram_hash": [_cstr, _int, _p(_i64), _i64, _p(_i64), _i64, _p(_i64)] + _err,
    "cxl_engram_table_name": [_cstr, _cstr, _int, _int, ctypes.c_char_p, _int] + _err,
    "cxl_engram_checkpoint_digest": [_cstr, _int, ctypes.c_char_p, _int] + _err,
    "cxl_engram_open": [_u64, _cstr, _cstr, _u64, _int, _int, _i64, _p(_u64)] + _err,
    "cxl_engram_close": [_u64] + _err,
    "cxl_engram_prefetch": [_u64, _int, _p(_i64), _p(_i64), _i64, _p(_i64), _p(_i64), _p(ctypes.c_int32), _i64, _p(_i64), _p(_u64)] + _err,
    "cxl_engram_wait": [_u64, _p(ctypes.c_int32), _i64, _p(_i64)] + _err,
    "cxl_engram_buffer": [_u64, _int, _p(_u64), _p(_i64), _p(_i64)] + _err,
    "cxl_engram_read": [_u64, _int, _i64, ctypes.c_void_p, _i64] + _err,
    "cxl_engram_stats": [_u64, ctypes.c_char_p, _int] + _err,
    "cxl_engram_compress": [_u64, _p(_i64), _i64] + _err,
    "cxl_topk_open": [_u64, _cstr, _u64, _int, _i64, _int, _int, _int, _cstr, _i64, _p(_u64)] + _err,
    "cxl_topk_close": [_u64] + _err,
    "cxl_topk_register": [_u64, _int, _i64] + _err,
    "cxl_topk_free": [_u64, _int] + _err,
    "cxl_topk_len": [_u64, _int, _int, _p(_i64)] + _err,
    "cxl_topk_append": [_u64, _int, _int, ctypes.c_void_p, _i64, _int] + _err,
    "cxl_topk_resolve": [_u64, _int, _p(_i64), _p(_i64), _i64, ctypes.c_void_p, ctypes.c_void_p, _int, _p(_i64)] + _err,
    "cxl_topk_buffer": [_u64, _int, _p(_u64), _p(_i64), _p(_i64), _p(_i64)] + _err,
    "cxl_topk_read": [_u64, _int, _int, _int, ctypes.c_void_p, _i64] + _err,
    "cxl_topk_stats": [_u64, ctypes.c_char_p, _int] + _err,
    "cxl_region_alloc": [_u64, _i64, _p(_u64), _p(ctypes.c_void_p), _p(_i64)] + _err,
    "cxl_region_free": [_u64, _u64, _i64] + _err,
    "cxl_object_create": [_u64, _cstr, _i64, _int, _p(_u64), _p(ctypes.c_void_p), _p(_i64)] + _err,
    "cxl_object_open": [_u64, _cstr, _int, _p(_u64), _p(ctypes.c_void_p), _p(_i64)] + _err,
    "cxl_object_close": [_u64] + _err,
    "cxl_object_gather": [_u64, _int, ctypes.c_void_p, ctypes.c_void_p, _i64, ctypes.c_void_p, _i64, ctypes.c_void_p, _i64, _int] + _err,
    "cxl_object_info": [_u64, _cstr, ctypes.c_char_p, _int] + _err,
    "cxl_object_seal": [_u64, _cstr, _cstr] + _err,
    "cxl_object_unseal": [_u64, _cstr] + _err,
    "cxl_object_claim": [_u64, _cstr] + _err,
    "cxl_object_verify": [_u64, _cstr] + _err,
    "cxl_object_remove": [_u64, _cstr, _int] + _err,
}

_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    env = os.environ.get("CXLTIER_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "libcxltier.so")]


def lib():
    """The loaded library: $CXLTIER_LIB, else libcxltier.so beside this file."""
    global _lib, _path
    if _lib is not None:  # every call asks: no lock once loaded
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            if not os.path.exists(path):
                tried.append(f"{path} (missing)")
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise ImportError(f"{path}: {e} (a CUDA build needs the NVIDIA driver's libcuda.so.1; "
                                  "machines without one take the default build)") from e
            for name, args in _PROTOTYPES.items():
                fn = getattr(handle, name)
                fn.argtypes, fn.restype = args, _int
            if handle.cxl_abi_version() != ABI_VERSION:
                raise ImportError(f"{path}: ABI {handle.cxl_abi_version()}, this package needs {ABI_VERSION}")
            _lib, _path = handle, path
            return _lib
        raise ImportError(
            "libcxltier.so not found: tried " + ", ".join(tried) + ". Build it with "
            "`go build -buildmode=c-shared -o libcxltier.so ./cmd/libcxltier` and set CXLTIER_LIB, "
            "or pip install the package from a checkout with Go installed"
        )


def engine_kind(engine):
    """The engine to name to the library. "cuda" becomes "cuda:N" for
    torch's current device when torch has started CUDA, so each rank's
    engine runs on its own GPU; without torch the library takes the device
    of the stream it is given, else of the calling thread's context."""
    if engine != "cuda":
        return engine
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return f"cuda:{torch.cuda.current_device()}"
    except (AttributeError, RuntimeError):
        pass
    return engine


def library_path():
    lib()
    return _path


def abi_version():
    return lib().cxl_abi_version()


_tls = threading.local()


def errbuf():
    """This thread's buffer for error messages (one per thread, reused)."""
    buf = getattr(_tls, "errbuf", None)
    if buf is None:
        buf = _tls.errbuf = ctypes.create_string_buffer(_ERRLEN)
    return buf


def raise_for(code, buf):
    """Raises the exception code names, with the message in buf."""
    raise _BY_CODE.get(code, CxlTierError)(code, buf.value.decode("utf-8", "replace"))


_raw = None


def _unconverted(name):
    """The library function without argtypes: ctypes then passes ctypes
    values as they are, with no conversion step per argument (the larger
    part of a small call's cost). The library is loaded a second time for
    it (the same mapping), so the prototyped functions stay as they are."""
    global _raw
    lib()
    with _lock:
        if _raw is None:
            _raw = ctypes.CDLL(_path)
            for fn_name in _PROTOTYPES:
                getattr(_raw, fn_name).restype = _int
    return getattr(_raw, name)


def prebuilt(name, *fixed):
    """One library call whose leading arguments are converted to ctypes
    values once, here (a hot path's handle and output words, made when the
    path is set up): calling the returned function costs the call, not a
    conversion of each argument, and no Python object is made per call.
    Per-call arguments, when the call takes more, are given in order after
    the fixed ones as ctypes values of the function's prototype (nothing
    converts them: a Python int passes as a C int, right only for int
    parameters; bytes pass as a pointer to their own buffer, for
    parameters the library only reads). The error buffer is the call's
    own: use one from one thread at a time."""
    proto = _PROTOTYPES[name]
    takes = len(proto) - len(_err)
    if len(fixed) > takes:
        raise ValueError(f"{name}: {len(fixed)} fixed arguments, it takes {takes}")
    fn = _unconverted(name)
    buf = ctypes.create_string_buffer(_ERRLEN)
    args = tuple(_converted(t, v) for t, v in zip(proto, fixed))
    if len(fixed) == takes:
        args += (buf, _ERRLEN)

        def call():
            code = fn(*args)
            if code:
                raise_for(code, buf)
    else:
        def call(*more):
            code = fn(*args, *more, buf, _ERRLEN)
            if code:
                raise_for(code, buf)
    call.__name__ = call.__qualname__ = name
    return call


def _converted(argtype, v):
    """v as a value of argtype, the way ctypes' argtypes would pass it."""
    if isinstance(v, (ctypes._SimpleCData, ctypes.Array, ctypes._Pointer)) or type(v).__name__ == "CArgObject":
        return v
    if isinstance(argtype, type) and issubclass(argtype, ctypes._SimpleCData) and argtype._type_ not in "zZP":
        return argtype(v)
    return argtype.from_param(v)


def call(name, *args):
    """Calls a library function, raising the exception its code names."""
    buf = errbuf()
    code = getattr(lib(), name)(*args, buf, _ERRLEN)
    if code != 0:
        raise_for(code, buf)
    return code


class Child:
    """An object the library opened on a tier (a prefix index, an Engram
    prefetcher, a top-k pool): cxl_<kind>_close and cxl_<kind>_stats, and
    closing as a context manager. Detaching the tier closes it too."""

    _kind = ""
    _stats_bytes = 1024

    def _opened(self, tier, h):
        self._tier, self._h = tier, h

    def _stats(self, h):
        buf = ctypes.create_string_buffer(self._stats_bytes)
        call(f"cxl_{self._kind}_stats", h, buf, len(buf))
        return json.loads(buf.value)

    def close(self):
        if self._h is not None and self._tier._h is not None:
            h, self._h = self._h, None
            call(f"cxl_{self._kind}_close", h)
        self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
