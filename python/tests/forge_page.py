"""A writer of a tier without an index's key, for the tests of signed
pages: a process that maps the tier file, finds a page by its bytes and
its ready entry by its 32-byte key and length (an entry is a state word,
the key, length, block, then the CRC-32C of key and payload), and puts bytes
of its own there with their CRC-32C. Everything a checksum checks then holds; only a
signature can tell.

    python forge_page.py TIER_FILE KEY_HEX < (OLD_PAYLOAD_HEX, NEW_PAYLOAD_HEX: a line each)

prints "forged" once done. forge(tier_file, key, old, new) runs it."""

import mmap
import subprocess
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def main(path, key, old, new):
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(old)
        assert at >= 0 and m.find(old, at + 1) < 0, "the page's bytes, once in the tier"
        # The key's ready entry (state 2 in the word's low byte) of this
        # payload's length: another index may hold the key too (a page's
        # token records; a deleted entry of another index keeps its key).
        entries, k = [], m.find(key)
        while k >= 0:
            if k >= 8 and m[k - 8] == 2 and int.from_bytes(m[k + 32 : k + 36], "little") == len(old):
                entries.append(k - 8)
            k = m.find(key, k + 1)
        assert len(entries) == 1, f"{len(entries)} entries of the key for a {len(old)}-byte payload"
        entry = entries[0]
        m[at : at + len(new)] = new
        m[entry + 48 : entry + 52] = crc32c(key + new).to_bytes(4, "little")
    print("forged")


def forge(tier_file, key, old, new):
    """Runs this script as a process of its own (no key, no library)."""
    out = subprocess.run([sys.executable, __file__, tier_file, key.hex()], input=f"{old.hex()}\n{new.hex()}\n",
                         capture_output=True, text=True, timeout=120)
    assert out.stdout == "forged\n", out.stderr[-3000:]


if __name__ == "__main__":
    lines = sys.stdin.read().split()
    main(sys.argv[1], bytes.fromhex(sys.argv[2]), bytes.fromhex(lines[0]), bytes.fromhex(lines[1]))
