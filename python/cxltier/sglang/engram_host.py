"""SGLang's Engram host table in the tier: one persistent copy per node.

SGLang 0.5.23 serves DeepSeek-V4.1 Engram from a host table when
SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1: each EngramEmbedding builds
`sglang.srt.layers.engram._HostTable(layout, nbytes, name, group)` and views
its `.bytes` as the fp8 e4m3 plane [n, dim] followed by the e8m0 scale plane
[n, dim/32]; the GPU reads it over UVA at `.device_ptr`. SGLang's own table
is a memfd (or a private copy per rank) that dies with the process and
exists once per TP group. `TierHostTable` has the same constructor and
attributes but keeps the table in a named tier object:

- one copy per node (per CXL pool), shared by every TP rank, DP replica,
  instance and restart; rank 0 creates or finds it, the others attach after
  the group's barrier (no /proc/<pid>/fd, no shared PID namespace);
- a table sealed by an earlier load (its checksum and label in the tier) is
  attached, mapped read-only, and SGLang's weight loader skips its rows
  (`EngramEmbedding._load_rows` is wrapped), so a second server does not
  read the checkpoint's Engram tensors again;
- with CXLTIER_ENGRAM_VERIFY=1 a sealed table is checked against its
  checksum first and loaded again if it fails;
- `finish_load` seals what this server loaded, and logs how much of the
  table lies on huge pages or device DAX in place of SGLang's check.

Enable it with the plugin: SGLANG_PLUGINS=cxltier, CXLTIER_ENGRAM_HOST_TABLE=1
and CXLTIER_DEVICES (the tier's devices). Table names are
`engram/<model>/<SGLang's name>`; <model> is CXLTIER_ENGRAM_MODEL, else the
model path's last component, so that two models never share a table.
`cxltier engram load -sglang` writes the same tables from a checkpoint
before any server starts.
"""

import ctypes
import logging
import os
import re
import threading
import time

from .. import _native
from ..objects import TierObject, claim_load, object_info
from ..tier import Tier

logger = logging.getLogger(__name__)

_DIR_NAME_MAX = 64  # the tier directory's name limit

_tier_lock = threading.Lock()
_tier = None


def process_tier(devices=None):
    """The one tier client this process's host tables share."""
    global _tier
    with _tier_lock:
        if _tier is None:
            devices = devices or os.environ.get("CXLTIER_DEVICES", "shm:cxltier")
            _tier = Tier(devices, name=f"engram-{os.getpid()}")
        return _tier


def model_key():
    """The model name of this server's tables: CXLTIER_ENGRAM_MODEL, else
    the last component of SGLang's model path, else "default" (table_name
    makes it the <model> part of the name, as the CLI does)."""
    key = os.environ.get("CXLTIER_ENGRAM_MODEL")
    if not key:
        try:
            from sglang.srt.runtime_context import get_model

            key = os.path.basename(os.path.normpath(get_model().model_path))
        except Exception:
            key = ""
    return key or "default"


def table_name(model, name, layout="shared", rank=0, world=1):
    """The tier object name of one SGLang host table, made by the library
    (engram.HostTableName), so that `cxltier engram load --model M` and a
    server of model M name it alike whatever M holds. A per-rank table
    holds that rank's rows only, so its name carries the rank and width."""
    out = ctypes.create_string_buffer(_DIR_NAME_MAX + 1)
    per_rank = layout == "per_rank"
    _native.call("cxl_engram_table_name", model.encode(), name.encode(), rank if per_rank else 0,
                 world if per_rank else 1, out, len(out))
    return out.value.decode()


_digests = {}  # (checkpoint, layer) -> digest or None, once per process


def checkpoint_of_server():
    """Where this server's checkpoint is: CXLTIER_ENGRAM_CHECKPOINT (its
    folder or files), else SGLang's model path when it is a local folder;
    None when neither (a hub id not yet downloaded here, tests)."""
    spec = os.environ.get("CXLTIER_ENGRAM_CHECKPOINT")
    if spec:
        return spec
    try:
        from sglang.srt.runtime_context import get_model

        path = get_model().model_path
    except Exception:
        return None
    return path if path and os.path.isdir(path) else None


def checkpoint_digest(layer):
    """The digest of Engram layer `layer` of this server's checkpoint (the
    library's, as `cxltier engram load` records it in a seal), or None when
    the checkpoint is not found here."""
    spec = checkpoint_of_server()
    if spec is None or layer is None:
        return None
    key = (spec, layer)
    if key not in _digests:
        out = ctypes.create_string_buffer(64)
        try:
            _native.call("cxl_engram_checkpoint_digest", spec.encode(), layer, out, len(out))
            _digests[key] = out.value.decode()
        except _native.CxlTierError as e:
            logger.warning("cxltier: Engram layer %d of %s: no checkpoint digest (%s); sealed tables are "
                           "attached without telling checkpoints apart", layer, spec, e)
            _digests[key] = None
    return _digests[key]


def label_digest(label):
    """The checkpoint digest a seal's label records, or None."""
    m = re.search(r"\bdigest ([0-9a-f]{16})\b", label or "")
    return m.group(1) if m else None


class TierHostTable:
    """sglang.srt.layers.engram._HostTable over a named tier object.

    Same constructor and attributes as SGLang's: `layout`, `nbytes`, `group`,
    `dirty` (set by SGLang's loader), `bytes` (a contiguous CPU uint8 tensor
    over tier memory), `device_ptr` (the address kernels use, after
    cudaHostRegister where CUDA works) and `finish_load(label)`, collective
    in the shared layout. Also `loaded`: the table was sealed before this
    process opened it, and the loader skips it. Lives as long as the
    process, like SGLang's."""

    def __init__(self, layout, nbytes, name, group):
        if layout not in ("shared", "per_rank"):
            raise ValueError(
                f"Invalid SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT={layout!r}; expected 'shared' or 'per_rank'"
            )
        try:  # before anything is made in the tier: a table nobody can use must leave nothing behind
            import torch  # noqa: F401
        except ImportError as e:
            raise ImportError(f"cxltier: SGLang's Engram host table in the tier needs torch ({e})") from e
        started = time.perf_counter()
        self.layout, self.nbytes, self.group, self.dirty = layout, nbytes, group, False
        rank, world = _rank(group), _world(group)
        self.name = table_name(model_key(), name, layout, rank, world)
        m = re.fullmatch(r"sglang_engram_(\d+)", name)
        self.digest = checkpoint_digest(int(m.group(1))) if m else None
        tier = process_tier()
        if layout == "shared":
            if rank == 0:
                self._create_if_missing(tier)
                self._check_sealed(tier)
                self._check_checkpoint(tier)
                self._claim_or_wait(tier)
            group.barrier()  # rank 0 made it; every rank now finds it by name
        else:
            self._create_if_missing(tier)
            self._check_sealed(tier)
            self._check_checkpoint(tier)
            self._claim_or_wait(tier)
        info = object_info(tier, self.name)
        if info["size"] != nbytes:
            raise _native.InvalidError(
                -1,
                f"cxltier: tier object {self.name!r} holds {info['size']} bytes, SGLang's table needs {nbytes}: "
                "another model or geometry under this name (set CXLTIER_ENGRAM_MODEL, or remove it with "
                f"`cxltier object rm {self.name}`)",
            )
        self.loaded = info["state"] == "sealed"
        read_only = self.loaded and os.environ.get("CXLTIER_ENGRAM_READONLY", "1") != "0"
        self.object = TierObject.open(tier, self.name, read_only=read_only)
        self.label = info["label"]
        self.bytes = self.object.tensor()[:nbytes]
        self.device_ptr = self._register(self.bytes.data_ptr(), nbytes)
        self.open_seconds = time.perf_counter() - started
        logger.info(
            "cxltier: Engram host table %s: %.2f GiB %s in the tier (%s), in %.1f ms",
            self.name, nbytes / 2**30,
            f"attached, loaded before as {self.label!r}" if self.loaded else "to load",
            "read-only" if read_only else "writable", self.open_seconds * 1e3,
        )

    def _create_if_missing(self, tier):
        try:
            TierObject.create(tier, self.name, self.nbytes, contiguous=True).close()
        except _native.ExistsError:
            pass  # another rank, instance or earlier server made it

    def _check_sealed(self, tier):
        """With CXLTIER_ENGRAM_VERIFY=1, a sealed table whose rows no longer
        match their checksum is unsealed, so that this server loads it again
        instead of serving damaged rows."""
        if os.environ.get("CXLTIER_ENGRAM_VERIFY") != "1":
            return
        with TierObject.open(tier, self.name) as o:
            if o.info()["state"] != "sealed":
                return
            try:
                o.verify()
            except _native.ChecksumError as e:
                logger.warning("cxltier: Engram host table %s: %s; loading it again", self.name, e)
                o.unseal()

    def _check_checkpoint(self, tier):
        """A sealed table that records another checkpoint's digest than
        this server's (a revised checkpoint of the same geometry, another
        model whose path ends alike) is unsealed and loaded again, with the
        reason logged; while other servers read it, it is refused instead
        (they would be handed a mixture)."""
        info = object_info(tier, self.name)
        have = label_digest(info.get("label"))
        if info["state"] != "sealed" or self.digest is None or have is None or have == self.digest:
            return
        why = (f"cxltier: Engram host table {self.name} holds checkpoint digest {have} ({info['label']!r}), "
               f"this server's checkpoint is {self.digest}")
        try:
            with TierObject.open(tier, self.name) as o:
                o.unseal()
        except _native.ExistsError as e:
            raise _native.ExistsError(e.code, f"{why}; other servers read it, so it is not reloaded under them: "
                                      f"give this model its own CXLTIER_ENGRAM_MODEL ({e})") from None
        logger.warning("%s: loading it again", why)

    def _claim_or_wait(self, tier):
        """Becomes the loader of an unsealed table, or, while another running
        process loads it (another server starting beside this one), waits
        for its seal (CXLTIER_ENGRAM_LOAD_WAIT seconds, 600 by default) and
        attaches what it loaded: two loaders never write one table. A loader
        that dies frees the claim, and this process loads it."""
        deadline = time.monotonic() + float(os.environ.get("CXLTIER_ENGRAM_LOAD_WAIT", "600"))
        waited = False
        while True:
            try:
                claim_load(tier, self.name)
                return
            except _native.ExistsError as e:  # CXL_EEXIST: the object is busy
                if time.monotonic() > deadline:
                    raise _native.ExistsError(e.code, f"cxltier: Engram host table {self.name}: {e}; "
                                              "waited CXLTIER_ENGRAM_LOAD_WAIT seconds") from None
                if not waited:
                    waited = True
                    logger.info("cxltier: Engram host table %s: %s; waiting for its seal", self.name, e)
                time.sleep(0.2)

    @staticmethod
    def _register(addr, nbytes):
        """cudaHostRegister where a CUDA device works; the address is the
        device address under UVA. Without CUDA the host address stands."""
        try:
            import torch

            if not torch.cuda.is_available():
                return addr
            # 0x8 (cudaHostRegisterReadOnly) would suit a read-only view, but
            # not every platform has it: default flags, as SGLang does.
            err = torch.cuda.cudart().cudaHostRegister(addr, nbytes, 0)
        except Exception as e:  # noqa: BLE001 - the library must not take SGLang down
            raise RuntimeError(f"cxltier: cudaHostRegister of the Engram host table failed: {e}") from e
        if int(err) != 0:
            raise RuntimeError(f"cxltier: cudaHostRegister({nbytes} bytes of tier memory) failed: {err}")
        return addr

    def finish_load(self, label):
        """Seals what this server loaded (collective in the shared layout:
        every rank has written its rows before rank 0 seals), then reports
        huge pages: measured (smaps) after a load, as SGLang does; from the
        backing alone for a table attached sealed, since reading smaps costs
        tens of milliseconds in a process that maps a large tier."""
        loaded_here = self.dirty
        if self.dirty:
            self.dirty = False
            if self.layout == "shared":
                self.group.barrier()
            if self.layout == "per_rank" or _rank(self.group) == 0:
                digest = f" digest {self.digest}" if self.digest else ""
                self.object.seal(f"{label} ({self.nbytes} bytes, {self.layout}){digest}")
                self.loaded = True
            if self.layout == "shared":
                self.group.barrier()
        where = f"cxltier: Engram host table {label} ({self.name}): layout={self.layout}"
        if not loaded_here:
            kind = backing_kind(self.bytes.data_ptr())
            huge = kind in ("device DAX", "hugetlbfs") or any(
                f"huge={m}" in kind for m in ("always", "within_size", "advise")) or "force" in kind
            (logger.info if huge else logger.warning)(
                "%s, attached; backed by %s%s", where, kind,
                "" if huge else " (4 KiB pages: a page walk per row; docs/operations.md, \"Huge pages\")")
            return
        mapped, huge, kind = huge_page_report(self.bytes.data_ptr(), self.nbytes)
        pct = 100.0 * huge / mapped if mapped else 0.0
        msg = f"{where}, in memory: {mapped / 2**10:.1f} MiB, {huge / 2**10:.1f} MiB of it on {kind} ({pct:.0f}%)"
        if huge == 0:
            logger.warning("%s. No huge pages: a page walk per row, slow once the table's page tables outgrow the "
                           "caches; format the tier on device DAX, hugetlbfs, or a tmpfs mounted with "
                           "huge=within_size or huge=advise (file:PATH; docs/operations.md, \"Huge pages\")", msg)
        else:
            logger.info(msg)


def backing_kind(addr):
    """What backs the mapping holding addr, from /proc/self/maps and
    /proc/mounts (cheap): "device DAX", "hugetlbfs", or the file system
    type and, for shmem, the kernel's shmem huge page mode."""
    path = ""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if _overlaps(line, addr, 1):
                    fields = line.split(None, 5)
                    path = fields[5].strip() if len(fields) > 5 else ""
                    break
    except OSError:
        return "unknown"
    if path.startswith("/dev/dax"):
        return "device DAX"
    fstype, mount, options = "", "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 3 and path.startswith(parts[1].rstrip("/") + "/") and len(parts[1]) > len(mount):
                    fstype, mount, options = parts[2], parts[1], parts[3]
    except OSError:
        pass
    if fstype == "hugetlbfs":
        return "hugetlbfs"
    if fstype == "tmpfs":
        # A tmpfs mount's huge= option decides (absent: never), unless the
        # kernel's shmem setting forces or denies huge pages everywhere.
        huge = re.search(r"(?:^|,)huge=(\w+)", options)
        try:
            with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
                mode = re.search(r"\[(\w+)\]", f.read())
            if mode and mode.group(1) in ("force", "deny"):
                return f"tmpfs (shmem huge pages: {mode.group(1)})"
        except OSError:
            pass
        return f"tmpfs (huge={huge.group(1) if huge else 'never'})"
    return fstype or "unknown"


def _rank(group):
    return getattr(group, "rank_in_group", 0)


def _world(group):
    return getattr(group, "world_size", 1)


def huge_page_report(addr, nbytes):
    """(resident kB, kB of it on huge pages or DAX, what they are) of the
    table at [addr, addr + nbytes). Residency is exact (mincore over the
    table); the huge share is that of the mappings holding it, from
    /proc/self/smaps: a device-DAX mapping counts whole (no page cache; the
    device maps 2 MiB or 1 GiB pages), hugetlbfs by its kernel page size,
    shmem and files by their PMD-mapped bytes."""
    resident = _resident_kb(addr, nbytes)
    rss = huge = 0
    kinds = set()
    cur = None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                if not line[:1].isupper():  # a mapping's header: "lo-hi perms offset dev inode path"
                    cur = _overlaps(line, addr, nbytes)
                    continue
                if cur is None or not line.startswith(("Rss:", "KernelPageSize:", "ShmemPmdMapped:", "FilePmdMapped:", "AnonHugePages:")):
                    continue
                key, _, rest = line.partition(":")
                kb = int(rest.split()[0])
                if key == "Rss":
                    cur["rss"] = kb
                    rss += kb
                    if cur["path"].startswith("/dev/dax"):
                        huge += kb
                        kinds.add("device DAX")
                elif key == "KernelPageSize":
                    if kb > 4 and "rss" in cur:
                        huge += cur["rss"]
                        kinds.add("hugetlbfs pages")
                elif kb:
                    huge += kb
                    kinds.add("huge pages")
    except (OSError, ValueError, IndexError):
        pass
    share = min(1.0, huge / rss) if rss else 0.0
    return resident, int(resident * share), " and ".join(sorted(kinds)) or "huge pages"


def _overlaps(header, addr, nbytes):
    """A smaps mapping's path when it overlaps [addr, addr + nbytes), else None."""
    fields = header.split(None, 5)
    lo, _, hi = fields[0].partition("-")
    if not (int(lo, 16) < addr + nbytes and addr < int(hi, 16)):
        return None
    return {"path": fields[5].strip() if len(fields) > 5 else ""}


def _resident_kb(addr, nbytes, samples=256):
    """kB of [addr, addr + nbytes) in memory (mincore). Whole-range mincore
    costs time in proportion to the range (about 2 s for a 95 GiB layer), so
    a table of more pages than samples is estimated from evenly spaced
    pages."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    lo = addr // page * page
    pages = (addr + nbytes - lo + page - 1) // page
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if pages <= samples:
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(pages * page), vec) != 0:
            return 0
        flags = bytes(vec)  # bit 0: resident; the others are reserved, zero
        return (len(flags) - flags.count(0)) * page // 1024
    one = ctypes.c_ubyte()
    hits = 0
    for k in range(samples):
        at = lo + (k * pages // samples) * page
        if libc.mincore(ctypes.c_void_p(at), ctypes.c_size_t(page), ctypes.byref(one)) != 0:
            return 0
        hits += one.value & 1
    return hits * pages // samples * page // 1024


def wrap_load_rows(embedding_cls):
    """Makes EngramEmbedding._load_rows skip a table attached sealed: its
    rows are in the tier already. Returns False if already wrapped."""
    original = embedding_cls._load_rows
    if getattr(original, "_cxltier", False):
        return False

    def _load_rows(self, param, loaded_weight):
        table = getattr(self, "host_table", None)
        if isinstance(table, TierHostTable) and table.loaded:
            table.skipped_loads = getattr(table, "skipped_loads", 0) + 1
            return None
        return original(self, param, loaded_weight)

    _load_rows._cxltier = True
    _load_rows.__wrapped__ = original
    embedding_cls._load_rows = _load_rows
    return True


def install():
    """Puts TierHostTable in place of SGLang's _HostTable and wraps the
    loader. True when it changed something."""
    from sglang.srt.layers import engram

    done = False
    if engram._HostTable is not TierHostTable:
        engram._HostTable = TierHostTable
        done = True
    return wrap_load_rows(engram.EngramEmbedding) or done
