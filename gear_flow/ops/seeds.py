"""A generator seeded by an int, as ``np.random.default_rng(seed)`` makes it, at a fifth of its cost.

A distributed sample hands each worker group a seed, and whoever draws that
part (its owner, or a learner drawing from the published state) draws with
``default_rng(seed)``, so that a seed gives the same batch whoever draws it.
That is one generator per worker per batch: NumPy's seeding hashes the seed
through :class:`numpy.random.SeedSequence` in Python-level code, 5.5 us of a
reader's batch per worker on this project's CPU.  :func:`generator` computes
the same four words of :meth:`SeedSequence.generate_state` (NumPy's published
algorithm) in one compiled call and hands them to NumPy's own
:class:`~numpy.random.PCG64`, which seeds itself from them as it does from a
SeedSequence: the generator's state, and so every draw, is NumPy's.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.random.bit_generator import ISeedSequence

# numpy.random.SeedSequence's constants (numpy/random/bit_generator.pyx)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_M32 = 0xFFFFFFFF


@njit(nogil=True, cache=True, inline="always")
def _hashmix(value, h):
    """SeedSequence's ``hashmix``: ``(hashed value, next hash constant)``, in uint32 arithmetic (int64
    values below 2**32, each product's low 32 bits kept: a product that wraps past 2**63 keeps them too)."""
    value = (value ^ h) & _M32
    h = (h * _MULT_A) & _M32
    value = (value * h) & _M32
    return value ^ (value >> 16), h


@njit(nogil=True, cache=True, inline="always")
def _mix(x, y):
    r = (_MIX_L * x - _MIX_R * y) & _M32
    return r ^ (r >> 16)


@njit(nogil=True, cache=True)
def _state_words(lo, hi, words):
    """``SeedSequence(seed).generate_state(4, np.uint64)`` of ``seed = hi * 2**32 + lo`` (one entropy word
    when ``hi`` is 0, as NumPy splits an int), into int64 ``words``."""
    n_ent = 2 if hi else 1
    pool = np.zeros(4, np.int64)
    h = _INIT_A
    for i in range(4):  # the pool is 4 words: every entropy word of a 64-bit seed goes in here
        pool[i], h = _hashmix((lo if i == 0 else hi) if i < n_ent else 0, h)
    for s in range(4):
        for d in range(4):
            if s != d:
                v, h = _hashmix(pool[s], h)
                pool[d] = _mix(pool[d], v)
    h = _INIT_B
    out = np.empty(8, np.int64)
    for i in range(8):  # 4 uint64 = 8 uint32 words, the pool's words in turn
        v = (pool[i % 4] ^ h) & _M32
        h = (h * _MULT_B) & _M32
        v = (v * h) & _M32
        out[i] = v ^ (v >> 16)
    for i in range(4):  # little-endian pairs, as NumPy views the uint32 words as uint64 (``words``: int64,
        words[i] = out[2 * i] | (out[2 * i + 1] << 32)  # viewed as uint64 by the caller: the same bits)


class _Words(ISeedSequence):
    """The words a SeedSequence would generate, already generated (PCG64 asks for exactly these)."""

    __slots__ = ("words",)

    def __init__(self, words: np.ndarray) -> None:
        self.words = words

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        """The words :func:`_state_words` computed (PCG64 asks for 4 uint64)."""
        if n_words != 4 or np.dtype(dtype) != np.uint64:  # not PCG64's request: not what was computed
            raise ValueError(f"these words are 4 uint64, asked for {n_words} {np.dtype(dtype)}")
        return self.words


def generator(seed: int) -> np.random.Generator:
    """``np.random.default_rng(seed)``, the same state, made without NumPy's Python-level seeding.

    Parameters
    ----------
    seed : int
        A non-negative int (a seed of 2**64 or more, or another type, goes to
        NumPy itself).

    Returns
    -------
    numpy.random.Generator
        A new PCG64 generator whose draws are ``default_rng(seed)``'s.
    """
    if type(seed) is not int or not 0 <= seed < 1 << 64:
        return np.random.default_rng(seed)
    words = np.empty(4, np.int64)
    _state_words(seed & _M32, seed >> 32, words)
    return np.random.Generator(np.random.PCG64(_Words(words.view(np.uint64))))
