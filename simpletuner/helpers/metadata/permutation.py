"""Permutations fixed by a few plain values, the same on every machine and numpy version.

Nothing here reads or advances the global random, numpy or torch RNGs: each permutation is a
function of a SHA digest of its ``parts`` (never Python's ``hash()``).

``StableShuffle`` gives a permutation's values at chosen positions, so a rank computes only the
1/W of a bucket's shuffled order that it takes. A small permutation is drawn by sorting PCG64
output; a large one is a keyed Feistel network evaluated at just those positions, because
sorting millions of random keys is memory-bound and grows faster than linearly (at 10 million
samples it was most of a rank's split time; benchmarks/bench_split.py).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

FEISTEL_FROM = 1 << 16  # permutations at least this long use the Feistel network
FEISTEL_ROUNDS = 6
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's finalizer constants
_MIX_2 = np.uint64(0x94D049BB133111EB)


def _encoded(parts: tuple) -> bytes:
    return json.dumps(list(parts), separators=(",", ":"), sort_keys=True).encode("utf-8")


def stable_seed(*parts: object) -> int:
    """A 128-bit seed from a SHA-256 digest of JSON-encoded parts."""
    return int.from_bytes(hashlib.sha256(_encoded(parts)).digest()[:16], "little")


def stable_permutation(n: int, *parts: object) -> np.ndarray:
    """A permutation of ``range(n)`` determined only by ``parts``.

    Sorting raw PCG64 output relies only on the bit stream, which numpy keeps stable across
    versions (unlike ``Generator.permutation``'s algorithm).
    """
    return stable_argsort(_keys(n, parts))


def _keys(n: int, parts: tuple) -> np.ndarray:
    return np.random.PCG64(stable_seed(*parts)).random_raw(n)


def stable_permutation_tail(n: int, count: int, *parts: object) -> np.ndarray:
    """``stable_permutation(n, *parts)[n - count:]``, without sorting every key."""
    return stable_argsort_tail(_keys(n, parts), count)


def stable_argsort_tail(keys: np.ndarray, count: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")[len(keys) - count:]``: the ``count`` largest keys are
    partitioned off (linear time) and only they are sorted, by key and then by index (the
    stable order of equal keys). Where a key equal to the smallest of them is left outside,
    which of the equal keys belong is the stable sort's to say: then it sorts them all."""
    n = len(keys)
    if count == 0:
        return np.empty(0, dtype=np.int64)
    chosen = np.sort(np.argpartition(keys, n - count)[n - count:])  # in index order, for ties
    outside = np.ones(n, dtype=bool)
    outside[chosen] = False
    if count < n and keys[outside].max() >= keys[chosen].min():
        return np.argsort(keys, kind="stable")[n - count:]
    return chosen[np.argsort(keys[chosen], kind="stable")]


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")``, faster for keys that are all distinct.

    Distinct keys have exactly one sorted order, so the unstable sort gives the stable sort's
    answer; only when two keys are equal (random 64-bit keys: odds about n^2 / 2^65) is the
    stable sort run instead.
    """
    order = np.argsort(keys)
    ordered = keys[order]
    if np.any(ordered[1:] == ordered[:-1]):
        return np.argsort(keys, kind="stable")
    return order


class StableShuffle:
    """A permutation of ``range(n)`` fixed by ``parts``; ``at(p)`` is its values at positions p.

    Below FEISTEL_FROM it is ``stable_permutation`` (exactly uniform over orders). From there on
    it is a 6-round unbalanced Feistel network on the smallest power of two >= n, keyed by a
    SHA-512 digest of ``parts``, with cycle walking to stay below n: a bijection whose value at
    any position costs the same, computed in numpy for many positions at once.
    """

    def __init__(self, n: int, *parts: object):
        self.n = n
        self._table = stable_permutation(n, *parts) if n < FEISTEL_FROM else None
        if self._table is None:
            digest = hashlib.sha512(_encoded(parts)).digest()  # 8 keys of 64 bits
            self._keys = [np.uint64(int.from_bytes(digest[8 * i:8 * i + 8], "little"))
                          for i in range(FEISTEL_ROUNDS)]
            self._bits = (n - 1).bit_length()

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Values at ``positions`` (each in ``range(n)``), as int64."""
        if self._table is not None:
            return self._table[positions]
        values = self._feistel(np.asarray(positions, dtype=np.uint64))
        outside = np.flatnonzero(values >= self.n)
        while outside.size:  # cycle walking: apply again until inside range(n)
            walked = self._feistel(values[outside])
            values[outside] = walked
            outside = outside[walked >= self.n]
        return values.astype(np.int64)

    @classmethod
    def tail(cls, n: int, count: int, *parts: object) -> np.ndarray:
        """The values at the last ``count`` positions of the permutation fixed by ``parts``
        (what ``StableShuffle(n, *parts).at(range(n - count, n))`` gives), without sorting the
        whole table of a small permutation."""
        if n < FEISTEL_FROM:
            return stable_permutation_tail(n, count, *parts).astype(np.int64)
        return cls(n, *parts).at(np.arange(n - count, n, dtype=np.int64))

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        """A bijection of [0, 2**bits); the halves have ceil and floor of bits/2 bits."""
        left_bits, right_bits = self._bits - self._bits // 2, self._bits // 2
        left, right = x >> np.uint64(right_bits), x & np.uint64((1 << right_bits) - 1)
        for key in self._keys:
            mixed = _mix(right ^ key) & np.uint64((1 << left_bits) - 1)
            left, right = right, left ^ mixed
            left_bits, right_bits = right_bits, left_bits
        return (left << np.uint64(right_bits)) | right


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every input bit affects every output bit."""
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))
