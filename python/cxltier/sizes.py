"""Byte counts as every cxltier tool writes them: 4096, 64KiB, 2MiB, 1GiB,
1TiB (K/M/G/T mean the same binary units). KB/MB/GB/TB are refused as
ambiguous, as the Go tools refuse them (internal/tierflags.ParseSize): a
tier's sizes must not depend on which meaning the reader assumed."""

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10),
          ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("B", 1))


def parse_size(text):
    """The byte count text names; ValueError naming the text otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size {text}: negative")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size {text!r}: want a byte count or a string such as 64MiB")
    t = text.strip()
    for u in ("TB", "GB", "MB", "KB"):
        if t.endswith(u):
            raise ValueError(f"size {text!r}: {u} is ambiguous; write {u[0]}iB (binary) or a byte count")
    mult = 1
    for suffix, m in _UNITS:
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)].strip(), m
            break
    if not t.isdigit() or not t.isascii():
        raise ValueError(f"size {text!r}: want a non-negative integer with an optional KiB/MiB/GiB/TiB suffix")
    n = int(t)
    if n > (1 << 62) // mult:
        raise ValueError(f"size {text!r}: too large")
    return n * mult
