"""cxltier.sizes: byte counts as the Go tools read them."""

import pytest

from cxltier.sizes import parse_size


@pytest.mark.parametrize("text,want", [
    ("4096", 4096), ("0", 0), ("64KiB", 64 << 10), ("2MiB", 2 << 20), ("1GiB", 1 << 30), ("1TiB", 1 << 40),
    ("64K", 64 << 10), ("3G", 3 << 30), ("512B", 512), (" 8 MiB ", 8 << 20), (4096, 4096),
])
def test_sizes(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text,what", [
    ("64MB", "MB is ambiguous"), ("1GB", "GB is ambiguous"), ("1.5GiB", "non-negative integer"),
    ("-1", "non-negative integer"), ("", "non-negative integer"), ("MiB", "non-negative integer"),
    ("12x", "non-negative integer"), ("١٢", "non-negative integer"), (str(1 << 62) + "KiB", "too large"),
    (-5, "negative"), (1.5, "want a byte count"), (True, "want a byte count"),
])
def test_bad_sizes_are_refused_naming_the_text(text, what):
    with pytest.raises(ValueError, match=what):
        parse_size(text)
