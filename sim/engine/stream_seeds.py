"""The PCG64 seeds of many requests' acceptance streams at once: the words numpy's
`SeedSequence([seed, request_id]).generate_state(4, np.uint64)` gives, worked out over an
array of request ids.

A stream's generator is `PCG64(SeedSequence([seed, request_id]))`, and building one
SeedSequence costs about as much as planning a request's step (its hashing runs one word at
a time). The hash's constants do not depend on the data, so the same 32-bit operations run
over a column of ids instead (numpy's `bit_generator.pyx`: `_coerce_to_uint32_array`,
`SeedSequence.mix_entropy`, `SeedSequence.generate_state`, pool of 4 words). The words are
handed to PCG64 through `Seeded`, so the generator is numpy's own, seeded as it would seed
itself; tests/test_stream_seeds.py holds the words to SeedSequence's.
"""
from __future__ import annotations

import numpy as np
from numpy.random.bit_generator import ISeedSequence

POOL = 4  # SeedSequence's default pool size, in 32-bit words
STATE_WORDS = 4  # 64-bit words PCG64 asks for: the state's two, the increment's two
INIT_A, MULT_A = 0x43B0D7E5, 0x931E8875  # mix_entropy's hash
INIT_B, MULT_B = 0x8B51F9DD, 0x58F38DED  # generate_state's hash
MIX_L, MIX_R = 0xCA01F9DD, 0x4973F715
MASK32 = 0xFFFFFFFF


class Seeded(ISeedSequence):
    """A SeedSequence's output, known already: what PCG64 asks a seed sequence for."""

    __slots__ = ("words",)

    def __init__(self, words: np.ndarray) -> None:
        self.words = words

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        if n_words != STATE_WORDS or np.dtype(dtype) != np.uint64:
            raise ValueError(f"Seeded holds {STATE_WORDS} uint64 words, asked for {n_words} {np.dtype(dtype)}")
        return self.words


def uint32_words(n: int) -> list[int]:
    """An int as SeedSequence reads it: 32-bit words, least significant first ([0] for 0)."""
    if n < 0:
        raise ValueError("expected non-negative integer")
    words = [n & MASK32]
    n >>= 32
    while n:
        words.append(n & MASK32)
        n >>= 32
    return words


def seed_words(seed: int, first: int, count: int) -> np.ndarray:
    """The PCG64 seed words (count x 4 uint64) of requests first .. first + count - 1 under
    `seed`; every id in the range must have as many 32-bit words as `first` (a range of ids
    from a multiple of 1024 up to the next does)."""
    n_id = len(uint32_words(first))
    if first + count > 1 << 64 or len(uint32_words(first + count - 1)) != n_id:
        raise ValueError(f"request ids {first}..{first + count - 1} do not share a word count below 2**64")
    ids = np.arange(first, first + count, dtype=np.uint64)
    columns = [np.full(count, w, np.uint32) for w in uint32_words(seed)]
    columns += [(ids >> np.uint64(32 * k) & np.uint64(MASK32)).astype(np.uint32) for k in range(n_id)]
    pool = _mix_entropy(columns, count)
    return _generate_state(pool)


def _hashmix(value: np.ndarray, h: int) -> tuple[np.ndarray, int]:
    h_next = h * MULT_A & MASK32
    value = (value ^ np.uint32(h)) * np.uint32(h_next)
    return value ^ (value >> np.uint32(16)), h_next


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = np.uint32(MIX_L) * x - np.uint32(MIX_R) * y
    return r ^ (r >> np.uint32(16))


def _mix_entropy(entropy: list[np.ndarray], count: int) -> list[np.ndarray]:
    h = INIT_A
    pool = []
    for i in range(POOL):
        pool_word, h = _hashmix(entropy[i] if i < len(entropy) else np.zeros(count, np.uint32), h)
        pool.append(pool_word)
    for src in range(POOL):
        for dst in range(POOL):
            if src != dst:
                hashed, h = _hashmix(pool[src], h)
                pool[dst] = _mix(pool[dst], hashed)
    for src in range(POOL, len(entropy)):
        for dst in range(POOL):
            hashed, h = _hashmix(entropy[src], h)
            pool[dst] = _mix(pool[dst], hashed)
    return pool


def _generate_state(pool: list[np.ndarray]) -> np.ndarray:
    h = INIT_B
    out = np.empty((len(pool[0]), 2 * STATE_WORDS), np.uint32)
    for i in range(2 * STATE_WORDS):
        value = pool[i % POOL] ^ np.uint32(h)
        h = h * MULT_B & MASK32
        value = value * np.uint32(h)
        out[:, i] = value ^ (value >> np.uint32(16))
    # Pairs of 32-bit words, the first the low half (SeedSequence views them little-endian).
    wide = out.astype(np.uint64)
    return wide[:, 0::2] | (wide[:, 1::2] << np.uint64(32))
