"""Item-by-item draws (Reverb's batch with ``max_times_sampled``): a shard's accepted draws, the shards' interleave.

A weighted table whose items may be handed out a limited number of times
samples a batch as Reverb does, one item after another, an item that reached
its limit being out of the later draws.  Each shard draws its own sequence by
rejection against its sampler (:func:`accept`), and the planner interleaves
the shards' sequences draw by draw by the masses they have left
(:func:`interleave`).  Both loops are sequential by nature (each step depends
on the ones before), so they run compiled, not in Python.  No GPU twin: the
sequences are short (a batch) and host-side bookkeeping.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def accept(cand, weight, used, limit, full, gone, want, slots, probs, masses, got):  # pragma: no cover - compiled
    """Take draws of ``cand`` in order while ``got < want``, each unless its item is out.

    ``used[i]`` is how often candidate ``i``'s item went so far (shared by every
    candidate of the same item: ``used`` is indexed by the item's position in
    the unique items of ``cand``, ``cand`` holding those positions); an item
    whose count reaches ``limit`` is out, its ``weight`` leaving the mass.
    Appends to ``slots``, ``probs`` (the draw's weight over the mass left then)
    and ``masses`` (the mass left after each draw) from index ``got``.

    Returns
    -------
    tuple
        ``(got, gone)`` after the chunk.
    """
    for j in range(cand.shape[0]):
        if got >= want:
            break
        u = cand[j]
        if used[u] >= limit:
            continue  # out since: rejected
        w = weight[j]
        slots[got] = u
        probs[got] = w / (full - gone)
        used[u] += 1
        if used[u] >= limit:
            gone += w
        left = full - gone
        masses[got + 1] = left if left > 0.0 else 0.0
        got += 1
    return got, gone


@njit(cache=True, nogil=True)
def interleave(masses, lengths, uniforms, shard_of, draw_of, share):  # pragma: no cover - compiled
    """Pick, for each batch row, the shard of its draw and which of that shard's draws it is.

    ``masses[s, k]`` is shard ``s``'s mass before its draw ``k`` (``lengths[s]``
    draws, then its mass after the last); row ``j`` picks a shard with
    probability proportional to the masses they have left then (by
    ``uniforms[j]``), takes that shard's next draw, and records the shard's
    share of the total (the draw's probability is that share times its
    probability within the shard).  Stops when no shard has mass left.

    Returns
    -------
    int
        Rows picked (fewer than ``uniforms`` only once every item is out).
    """
    n_shards = masses.shape[0]
    pos = np.zeros(n_shards, np.int64)
    for j in range(uniforms.shape[0]):
        total = 0.0
        for s in range(n_shards):
            if pos[s] < lengths[s]:
                total += masses[s, pos[s]]
        if not total > 0.0:
            return j
        x = uniforms[j] * total
        pick = -1
        for s in range(n_shards):
            if pos[s] < lengths[s] and masses[s, pos[s]] > 0.0:
                pick = s  # the last with mass left: where rounding past the end lands
                x -= masses[s, pos[s]]
                if x < 0.0:
                    break
        shard_of[j] = pick
        draw_of[j] = pos[pick]
        share[j] = masses[pick, pos[pick]] / total
        pos[pick] += 1
    return uniforms.shape[0]


@njit(cache=True, nogil=True)
def uniform_left(cand, used, limit, uniforms, slots, probs, masses):  # pragma: no cover - compiled
    """Draws uniform over the items ``cand`` left, one per uniform while any is left: an item whose count
    (``used``, as it went so far) reaches ``limit`` is out of the later draws.  Writes ``slots``, ``probs``
    (one over the items left then) and ``masses`` (the items left before each draw, then after the last).

    Returns
    -------
    int
        Draws made.
    """
    cand, used = cand.copy(), used.copy()
    m = cand.shape[0]
    masses[0] = m
    got = 0
    for j in range(uniforms.shape[0]):
        if m == 0:
            break
        i = min(int(uniforms[j] * m), m - 1)
        slots[got] = cand[i]
        probs[got] = 1.0 / m
        used[i] += 1
        if used[i] >= limit:  # out: the last item left takes its place
            m -= 1
            cand[i], used[i] = cand[m], used[m]
        got += 1
        masses[got] = m
    return got
