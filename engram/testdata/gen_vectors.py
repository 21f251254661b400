#!/usr/bin/env python3
"""Writes vectors.json: Engram row indices computed with numpy's own random
generator, following the reference algorithm of engram.md step by step.
The Go tests compare against this file; run it again (needs numpy) only to
add cases. Not used by CI."""
import json
import numpy as np

INT64_MAX = 2**63 - 1


def is_prime(n):
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def derive(g):
    half = max(1, (INT64_MAX // g["vocab"]) // 2)
    seen, layers = set(), {}
    for layer in g["layer_ids"]:
        rng = np.random.default_rng(g["seed"] + 10007 * layer)
        mult = rng.integers(0, half, size=g["max_ngram"], dtype=np.int64) * 2 + 1
        moduli = []
        for n in range(2, g["max_ngram"] + 1):
            start, heads = g["base_sizes"][n - 2] - 1, []
            for _ in range(g["heads_per_order"]):
                c = start + 1
                while not (is_prime(c) and c not in seen):
                    c += 1
                seen.add(c)
                heads.append(c)
                start = c
            moduli.append(heads)
        layers[layer] = (mult, moduli)
    return layers


def hash_batch(g, mult, moduli, x):
    x = np.asarray(x, dtype=np.int64)
    B, T = x.shape
    shifts = [x] + [np.pad(x, ((0, 0), (k, 0)), constant_values=g["pad_id"])[:, :T] for k in range(1, g["max_ngram"])]
    flat = [p for order in moduli for p in order]
    offsets = np.concatenate([[0], np.cumsum(flat)[:-1]]).astype(np.int64)
    out = []
    for n in range(2, g["max_ngram"] + 1):
        mix = shifts[0] * mult[0]
        for k in range(1, n):
            mix = np.bitwise_xor(mix, shifts[k] * mult[k])
        for p in moduli[n - 2]:
            out.append(mix % p)
    local = np.stack(out, axis=2)
    return local, local + offsets


def geometry(name, layers, max_ngram, heads, base, seed, vocab, pad):
    return dict(name=name, layer_ids=layers, max_ngram=max_ngram, heads_per_order=heads,
                base_sizes=[base] * (max_ngram - 1), seed=seed, vocab=vocab, pad_id=pad, row_bytes=64, dtype="f32")


cases = [
    geometry("v4.1-flash", [1, 14], 4, 8, 16000000, 0, 99092, 2),
    geometry("demo", [1, 15], 3, 8, 646400, 0, 99092, 2),
    geometry("engram-27b", [2, 15], 3, 8, 2262400, 0, 99092, 2),
    geometry("big-seed", [0, 3, 7], 5, 3, 1000003, 2**40 + 12345, 129280, 7),
    geometry("small-vocab", [4], 3, 2, 97, 42, 5, 4),
    geometry("32-bit-draws", [2, 9], 3, 4, 1 << 20, 5, 3_000_000_000, 11),
]
rng = np.random.default_rng(2026)
out = []
for g in cases:
    layers = derive(g)
    for layer, (mult, moduli) in layers.items():
        ids = rng.integers(0, g["vocab"], size=(2, 9), dtype=np.int64)
        local, glob = hash_batch(g, mult, moduli, ids)
        out.append(dict(geometry=g, layer=layer, multipliers=mult.tolist(), moduli=moduli,
                        ids=ids.tolist(), local=local.tolist(), rows=glob.tolist()))
with open("vectors.json", "w") as f:
    json.dump(out, f, separators=(",", ":"))
print(f"wrote {len(out)} cases")
