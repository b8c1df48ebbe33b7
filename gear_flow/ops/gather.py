"""Window gather: copy B windows of steps out of a column ring into one batch.

Every column is viewed as bytes, ``[capacity, step_nbytes]`` uint8, so one
compiled function serves every dtype and shape.  For window ``b`` the steps at
ring positions ``src_start[b] + j`` (mod capacity), ``0 <= j < n_valid[b]``,
land at ``out[b, dst_offset[b] + j]``; every other step of ``out[b]`` is zeroed
(head and tail padding).  A window crosses the ring's end as two contiguous
copies.  Rows are copied as contiguous byte runs (memcpy-like), windows in
parallel over the available cores.

Twin of ``kernels/gather.cu`` (``gather_windows``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, nogil=True, cache=True)
def gather_windows(src, src_start, dst_offset, n_valid, out):
    """See the module docstring.  ``src``: uint8[cap, nb]; ``out``: uint8[B, L, nb]."""
    cap = src.shape[0]
    nb = src.shape[1]
    B = out.shape[0]
    L = out.shape[1]
    sf = src.reshape(-1)
    of = out.reshape(-1)
    for b in prange(B):
        s = src_start[b]
        d = dst_offset[b]
        n = n_valid[b]
        base = b * L * nb
        first = n if n < cap - s else cap - s
        of[base + d * nb : base + (d + first) * nb] = sf[s * nb : (s + first) * nb]
        if n > first:
            of[base + (d + first) * nb : base + (d + n) * nb] = sf[0 : (n - first) * nb]
        if d > 0:
            of[base : base + d * nb] = 0
        if d + n < L:
            of[base + (d + n) * nb : base + L * nb] = 0


def window_mask(dst_offset: np.ndarray, n_valid: np.ndarray, length: int, out: np.ndarray | None = None) -> np.ndarray:
    """Boolean ``[B, L]``: True where a window step holds data, False on padding."""
    j = np.arange(length)
    res = (j >= dst_offset[:, None]) & (j < (dst_offset + n_valid)[:, None])
    if out is None:
        return res
    out[...] = res
    return out


def scatter_rows(dst: np.ndarray, pos: int, src: np.ndarray) -> None:
    """Write ``src`` rows into ring ``dst`` starting at ``pos``, wrapping at the end."""
    cap = dst.shape[0]
    n = src.shape[0]
    first = min(n, cap - pos)
    dst[pos : pos + first] = src[:first]
    if n > first:
        dst[: n - first] = src[first:]
