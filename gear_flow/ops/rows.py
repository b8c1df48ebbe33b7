"""A sampled batch's per-row arrays (keys, probabilities, episode ids, timesteps, priorities, times
sampled, the window mask) written in one compiled pass.

Every sample writes them, on every tier (they are host arrays beside the
column buffers): one call, not a NumPy expression per array, is what keeps a
small batch's fixed cost near its gather's.  The shard's fused take
(:func:`gear_flow.storage.windows.take_steps`) calls :func:`fill` from
compiled code; tables and readers that place windows otherwise call it
through :meth:`gear_flow.sample.SampleBuffers.fill_rows`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..keys import key_of
from .gather import _fill_mask


@njit(nogil=True, cache=True)
def fill(rows, off, shard, seqs, probs, scale, ids, steps, dst, n_valid, prio, counted):
    """Rows ``off:off + n`` of a batch, ``n = len(seqs)``.

    Parameters
    ----------
    rows : tuple
        The batch's arrays, written in place: int64 keys ``[B]``, float64
        probabilities ``[B]``, int64 episode ids ``[B]``, int64 timesteps
        ``[B]``, float64 priorities ``[B]``, int64 times sampled ``[B]``,
        bool mask ``[B, L]``.
    off : int
        First row.
    shard : int
        Shard of the ``n`` items (the keys' high bits).
    seqs, ids, steps, dst, n_valid : numpy.ndarray
        int64 ``[n]``: item seqs, episode ids, timesteps, head padding and
        valid steps of each window.
    probs : numpy.ndarray
        float64 ``[n]``: probability of each draw, multiplied by ``scale``.
    scale : float
        The shard's share of the batch's mass (1.0: none).
    prio : numpy.ndarray
        float64 ``[n]`` priorities when drawn, or empty: NaN (not reported).
    counted : numpy.ndarray
        int64 ``[n]`` times sampled, this sample included, or empty: -1.

    Returns
    -------
    bool
        False, with nothing written, when an input is not ``[n]`` (``prio``
        and ``counted`` may be empty) or rows ``off:off + n`` are not all in
        every array of ``rows``.
    """
    keys, probabilities, episode_ids, timesteps, priorities, times_sampled, mask = rows
    n = seqs.shape[0]
    if off < 0 or n > 0 and (
        probs.shape[0] != n or ids.shape[0] != n or steps.shape[0] != n or dst.shape[0] != n
        or n_valid.shape[0] != n or (prio.shape[0] != n and prio.shape[0] != 0)
        or (counted.shape[0] != n and counted.shape[0] != 0)
    ):  # fmt: skip
        return False
    for a in (keys.shape[0], probabilities.shape[0], episode_ids.shape[0], timesteps.shape[0],
              priorities.shape[0], times_sampled.shape[0], mask.shape[0]):  # fmt: skip
        if off + n > a:
            return False
    for b in range(n):
        r = off + b
        keys[r] = key_of(shard, seqs[b])
        probabilities[r] = probs[b] * scale
        episode_ids[r] = ids[b]
        timesteps[r] = steps[b]
        priorities[r] = prio[b] if prio.shape[0] else np.nan
        times_sampled[r] = counted[b] if counted.shape[0] else -1
    _fill_mask(dst, n_valid, mask, off)
    return True
