"""Combining per-shard selections into one exact global choice.

Shared by the local and the distributed table: the first level decides how
many items each shard contributes, the second (on the shards) picks them.

* Weighted selectors: counts ~ Multinomial(B, m_s / sum(m)) with ``m_s`` the
  shard's valid mass; an item drawn with local probability ``q`` then has
  global probability ``q * m_s / sum(m) = w_i / sum(m)``, exactly the
  single-table distribution.
* WithoutReplacement: counts ~ multivariate hypergeometric over the items left
  in each shard's epoch, so the batch is a uniform subset of the global epoch.
* Ordered selectors: every shard proposes its best ``B`` candidates with order
  keys; the global best ``B`` are among them (a merge, exact).
"""

from __future__ import annotations

import numpy as np


def multinomial_counts(masses: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Counts of ``n`` draws over shards with replacement: Multinomial(n, masses / sum(masses)).

    Parameters
    ----------
    masses : numpy.ndarray
        float64 ``[S]``, >= 0 with a positive sum.
    n : int
        Draws.
    rng : numpy.random.Generator
        The generator.

    Returns
    -------
    numpy.ndarray
        int64 ``[S]`` summing to ``n``.
    """
    if len(masses) == 1:  # what rng.multinomial gives, and it draws nothing from rng for one category either
        return np.array([n], dtype=np.int64)
    total = masses.sum()
    return rng.multinomial(n, masses / total)


def epoch_counts(unseen: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Counts for ``n`` draws without replacement: multivariate hypergeometric over ``unseen``.

    Parameters
    ----------
    unseen : numpy.ndarray
        ``[S]`` items left in each shard's epoch (integers).
    n : int
        Draws, ``n <= unseen.sum()``.
    rng : numpy.random.Generator
        The generator.

    Returns
    -------
    numpy.ndarray
        int64 ``[S]`` summing to ``n``, each at most ``unseen``.
    """
    return rng.multivariate_hypergeometric(unseen.astype(np.int64), n)


def merge_candidates(per_shard: list[tuple[np.ndarray, np.ndarray]], n: int) -> list[np.ndarray]:
    """Global best ``n`` of every shard's (slots, keys); returns chosen slots per shard.

    Keys are ``[k]`` or ``[k, c]`` (larger is better, compared column by
    column: a heap's second column is its tie-break, the negated stamp of
    each item's insert or latest update).  Remaining ties are broken by shard
    order, then by the shard's own order.  If fewer
    than ``n`` candidates exist, the chosen ones are repeated in order until the
    batch is full (a Fifo over 3 items sampled with B=5 gives 1,2,3,1,2).

    Parameters
    ----------
    per_shard : list of (numpy.ndarray, numpy.ndarray)
        Per shard, in shard order: its candidate slots ``[c]`` (best first)
        and their order keys ``[c]`` or ``[c, 2]``.
    n : int
        Items to choose.

    Returns
    -------
    list of numpy.ndarray
        Per shard, the chosen slots in the shard's order (empty where none;
        repeats when fewer than ``n`` candidates exist).

    Examples
    --------
    >>> import numpy as np
    >>> a = (np.array([10, 11]), np.array([5.0, 3.0]))
    >>> b = (np.array([20]), np.array([4.0]))
    >>> [c.tolist() for c in merge_candidates([a, b], 2)]
    [[10], [20]]
    """
    return merge_candidates_with_positions(per_shard, n)[0]


def merge_candidates_with_positions(
    per_shard: list[tuple[np.ndarray, np.ndarray]], n: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Like :func:`merge_candidates`, plus the batch position of every chosen slot.

    A caller gathering shard by shard can then restore the global order (a
    queue over two shards must still come out oldest first).

    Parameters
    ----------
    per_shard : list of (numpy.ndarray, numpy.ndarray)
        Per shard: candidate slots and their order keys, as for
        :func:`merge_candidates`.
    n : int
        Items to choose.

    Returns
    -------
    chosen : list of numpy.ndarray
        Per shard, the chosen slots (as :func:`merge_candidates`).
    where : list of numpy.ndarray
        Per shard, the batch position (0..n-1, best first) of each chosen
        slot.
    """
    if len(per_shard) == 1 and _best_first(per_shard[0][1]):
        # one shard whose candidates come best first (as every ordered selector gives them): the merge keeps
        # them in order, repeated to n when fewer (the lexsort below cost a local heap's batch 30 us)
        slots = per_shard[0][0]
        take = np.arange(n) % len(slots) if len(slots) else np.zeros(0, dtype=np.int64)
        return [slots[take]], [np.arange(len(take))]
    shard_of = np.concatenate([np.full(len(s), i) for i, (s, _) in enumerate(per_shard)] or [np.zeros(0, int)])
    pos = np.concatenate([np.arange(len(s)) for s, _ in per_shard] or [np.zeros(0, int)])
    cols = max((np.shape(k)[1] for _, k in per_shard if np.ndim(k) == 2), default=1)
    keys = np.concatenate(
        [np.asarray(k, dtype=np.float64).reshape(len(s), cols) for s, k in per_shard] or [np.zeros((0, cols))]
    )
    # lexsort: the last key is the primary one; order keys compare column by column
    order = np.lexsort((pos, shard_of, *(-keys[:, j] for j in reversed(range(keys.shape[1])))))[:n]
    if len(order) and len(order) < n:
        order = np.resize(order, n)
    rank = np.arange(len(order))
    chosen = [per_shard[i][0][pos[order[shard_of[order] == i]]] for i in range(len(per_shard))]
    where = [rank[shard_of[order] == i] for i in range(len(per_shard))]
    return chosen, where


def _best_first(keys) -> bool:
    """Whether order keys ``[c]`` or ``[c, 2]`` never rise from one row to the next (column by column)."""
    k = np.asarray(keys, dtype=np.float64)
    if len(k) < 2:
        return True
    if k.ndim == 1:
        return bool(np.all(k[:-1] >= k[1:]))
    a, b = k[:-1], k[1:]
    order = np.zeros(len(a), dtype=bool)  # row i decided: it comes before row i + 1, or ties it
    tied = np.ones(len(a), dtype=bool)
    for j in range(k.shape[1]):
        order |= tied & (a[:, j] > b[:, j])
        tied &= a[:, j] == b[:, j]
    return bool(np.all(order | tied))


def importance_weights(probabilities: np.ndarray, beta: float, out: np.ndarray) -> np.ndarray:
    """``(P_i)^-beta`` normalised by the batch maximum (the ``N`` factor cancels).

    Parameters
    ----------
    probabilities : numpy.ndarray
        float64 ``[B]``, each > 0 when ``beta`` is not 0.
    beta : float
        Importance-sampling exponent; 0 gives all ones.
    out : numpy.ndarray
        ``[B]`` (float32 in a SampleBuffers), written in place.

    Returns
    -------
    numpy.ndarray
        ``out``, with values in ``(0, 1]`` (the maximum is 1).
    """
    if beta == 0.0 or len(probabilities) == 0:
        out[...] = 1.0
        return out
    w = np.power(probabilities, -beta)
    out[...] = w / w.max()
    return out
