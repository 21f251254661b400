"""Writes keys.json: SGLang page-key chains for prefix/keys_test.go.

get_hash_str below is SGLang's function as ../shared/specs/sglang.md §2
states it (python/sglang/srt/mem_cache/hicache_storage.py): SHA-256 over
bytes.fromhex(prior_hash), when there is one, then each token id as 4-byte
little-endian unsigned. Run: python3 gen_keys.py > keys.json
"""
import hashlib
import json
import random


def get_hash_str(token_ids, prior_hash=None):
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def chain(tokens, page_size, prior=None):
    keys = []
    for start in range(0, len(tokens) - page_size + 1, page_size):
        prior = get_hash_str(tokens[start:start + page_size], prior)
        keys.append(prior)
    return keys


rng = random.Random(20261122)
cases = []
for page_size, n, vocab, prior in [
    (1, 5, 32000, None),
    (4, 10, 32000, None),  # short last page is not hashed
    (16, 64, 128256, None),
    (64, 200, 151936, None),
    (16, 48, 2**32, None),
    (8, 16, 129280, "ab" * 32),
]:
    tokens = [rng.randrange(vocab) for _ in range(n)]
    if vocab == 2**32:
        tokens[0], tokens[1] = 0, 2**32 - 1
    cases.append({"page_size": page_size, "prior": prior or "", "tokens": tokens,
                  "keys": chain(tokens, page_size, prior)})
print(json.dumps(cases, indent=1))
