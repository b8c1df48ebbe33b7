"""Carrying out plans on shards in this process (the local table, a worker's host).

:class:`InProcess` answers the planner's requests (:mod:`gear_flow.table.planner`)
with direct calls on :class:`~gear_flow.shard.Shard` objects.  The caller holds
the shards' locks for a whole sample, so a plan executed here sees one
consistent state; the distributed handle answers the same requests over the
comm (:mod:`gear_flow.distributed.sampling`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from ..errors import nothing_to_sample
from . import planner, two_level

if TYPE_CHECKING:
    from ..sample import SampleBuffers
    from ..shard import Shard


def summary(shard: Shard, kind: str, L: int = 1, boundary: str = "pad_tail") -> float:
    """One number a plan asks of a shard (see :class:`planner.Summaries`).

    Parameters
    ----------
    shard : Shard
        The shard (its lock held by the caller).
    kind : {"sampler", "unseen", "remover", "size", "valid", "goes"}
        Sampling mass of the windows that fit; epoch items not yet seen;
        remover mass (0 for a remover without one); items stored; items
        whose window fits; the times those may still go
        (:meth:`~gear_flow.shard.Shard.goes_left`).
    L : int, default 1
        Window length, in steps.
    boundary : str, default "pad_tail"
        Boundary mode (which windows fit).

    Returns
    -------
    float
        The number.

    Raises
    ------
    ValueError
        An unknown ``kind``.
    """
    if kind == "sampler":
        return shard.valid_mass(L, boundary)
    if kind == "unseen":
        return float(shard.unseen(L, boundary))
    if kind == "remover":
        with shard.lock:  # (an eviction plan holds no shard lock: a consistent read, not one mid-insert)
            return float(shard.remover.mass) if hasattr(shard.remover, "mass") else 0.0
    if kind == "size":
        return float(shard.size)
    if kind == "valid":
        return float(shard.valid_count(L, boundary))
    if kind == "goes":
        return float(shard.goes_left(L, boundary))
    raise ValueError(f"unknown summary kind {kind!r}")


def evict_on(
    shard: Shard,
    counts: int | None = None,
    slots: ArrayLike | None = None,
    rng: np.random.Generator | None = None,
    seqs: ArrayLike | None = None,
) -> int:
    """Carry out an :class:`planner.Evict` part on one shard.

    Parameters
    ----------
    shard : Shard
        The shard.
    counts : int, optional
        Items for the shard's remover to choose (random removers).
    slots : array_like of int, optional
        Exact slots to remove (ordered removers, after a global merge);
        duplicates count once.  Wins over ``counts``.
    rng : numpy.random.Generator, optional
        For random removers.
    seqs : array_like of int, optional
        The seq of the item meant at each of ``slots``: slots written over
        since are spared.

    Returns
    -------
    int
        Items removed.
    """
    if slots is not None:
        sl, first = np.unique(np.asarray(slots, dtype=np.int64), return_index=True)
        sq = None if seqs is None else np.asarray(seqs, dtype=np.int64)[first]
        return shard.remove_by_remover(len(sl), rng, slots=sl, seqs=sq) if len(sl) else 0
    return shard.remove_by_remover(int(counts), rng) if counts else 0


class InProcess:
    """Answers plan requests with in-process shards, gathering into ``out`` (a SampleBuffers).

    Called with each request of a plan (:func:`planner.run`); the caller holds
    the shards' locks.

    Parameters
    ----------
    shards : dict
        shard id -> Shard.
    rng : numpy.random.Generator or None
        Draws items and random evictions.
    out : SampleBuffers, optional
        The batch to gather into (None for eviction plans).
    L : int, default 1
        Window length, in steps.
    boundary : str, default "pad_tail"
        Boundary mode.
    columns : iterable of str, default ()
        Columns to gather.
    horizon : int, optional
        Ordered samples see only items stamped before it (see ``Shard.candidates``).

    Attributes
    ----------
    expired : dict of int to int
        Items expired per shard by the gathers so far (``max_times_sampled``).
    """

    def __init__(
        self,
        shards: dict,
        rng: np.random.Generator | None,
        out: SampleBuffers | None = None,
        L: int = 1,
        boundary: str = "pad_tail",
        columns: Iterable[str] = (),
        horizon: int | None = None,
    ) -> None:
        self.shards = shards
        self.rng = rng
        self.out = out
        self.L = L
        self.boundary = boundary
        self.columns = tuple(columns)
        self.horizon = horizon
        self.expired = {}
        #: each shard's valid sampling mass as the last summary answered it (the next draw need not ask again)
        self.masses = {}

    def __call__(self, req):
        if isinstance(req, planner.Summaries):
            got = {k: {i: summary(s, k, self.L, self.boundary) for i, s in self.shards.items()} for k in req.kinds}
            self.masses.update(got.get("sampler", {}))
            return got
        if isinstance(req, planner.Candidates):
            if req.role == "remover":
                return {i: s.remover_candidates(req.n) for i, s in self.shards.items()}
            return {i: s.candidates(req.n, self.L, self.boundary, self.horizon) for i, s in self.shards.items()}
        if isinstance(req, planner.Draw):
            return self.draw(req)
        if isinstance(req, planner.Sequences):
            return {
                i: s.draw_sequence(req.n, self.L, self.boundary, self.rng, req.by_count) for i, s in self.shards.items()
            }
        if isinstance(req, planner.Take):  # (in process, under the shards' locks: no slot changed since)
            offs = planner.offsets(req.slots)
            for i in sorted(offs):
                slots = np.asarray(req.slots[i], dtype=np.int64)
                p = np.ones(len(slots)) if req.probs is None else np.asarray(req.probs[i], dtype=np.float64)
                self._gather(i, slots, p, offs[i])
            return None
        if isinstance(req, planner.NewEpoch):
            for s in self.shards.values():
                s.new_epoch()
            return None
        if isinstance(req, planner.Evict):
            parts = req.slots if req.slots is not None else req.counts
            k = 0
            for i in sorted(parts):
                if req.slots is not None:
                    k += evict_on(self.shards[i], slots=parts[i], rng=self.rng)
                else:
                    k += evict_on(self.shards[i], counts=parts[i], rng=self.rng)
            return k
        raise TypeError(f"unknown plan request {req!r}")

    def draw(self, req: planner.Draw) -> None:
        """Answer a :class:`planner.Draw`: each shard's items drawn and gathered at the rows the plan gives them.

        Parameters
        ----------
        req : planner.Draw
            Counts, shares of the mass and the first row.
        """
        off = req.base
        counts = req.counts
        for i in sorted(counts) if len(counts) > 1 else counts:  # (planner.offsets' order: positive ints)
            n = counts[i]
            if not n:
                continue
            # the mass as just summarised (under the same locks), once: a later round asks again
            mass = self.masses.pop(i, None)
            mass = None if req.by_count else mass
            slots, q = self.shards[i].draw(n, self.L, self.boundary, self.rng, mass)
            self._gather(i, slots, q, off, req.scale[i])
            off += n

    def _gather(self, i: int, slots: np.ndarray, p: np.ndarray, off: int, scale: float = 1.0) -> None:
        n = take_into(self.shards[i], slots, p, scale, self.L, self.boundary, self.rng, self.out, off, self.columns)
        if n:
            self.expired[i] = self.expired.get(i, 0) + n


def take_into(
    shard: Shard, slots: np.ndarray, probs: np.ndarray, scale: float, L: int, boundary: str,
    rng: np.random.Generator, out: SampleBuffers, off: int, columns: tuple[str, ...],
) -> int:  # fmt: skip
    """:meth:`~gear_flow.shard.Shard.take_rows` of drawn ``slots`` into ``out`` from row ``off``.

    Parameters
    ----------
    shard : Shard
        The shard drawn from (its lock held by the caller).
    slots : numpy.ndarray
        int64 drawn slots.
    probs : numpy.ndarray
        float64 each draw's probability within the shard.
    scale : float
        The shard's share of the batch's mass.
    L : int
        Window length, in steps.
    boundary : str
        Boundary mode.
    rng : numpy.random.Generator
        Places windows within episode items.
    out : SampleBuffers
        The batch.
    off : int
        Its first row for these windows.
    columns : tuple of str
        Columns to gather.

    Returns
    -------
    int
        Items the take expired (``max_times_sampled``).
    """
    before = shard.counters.expired
    shard.take_rows(slots, probs, scale, L, boundary, rng, out, off, columns)
    return shard.counters.expired - before


def sample_shards(
    shards: dict,
    selection: str,
    out: SampleBuffers,
    B: int,
    L: int,
    boundary: str,
    columns: tuple[str, ...],
    rng: np.random.Generator,
    beta: float,
    who: str,
    horizon: int | None = None,
) -> dict:
    """A whole two-level sample of ``B`` windows over in-process ``shards`` (their locks held by the caller).

    Fills ``out`` in the batch's final order, with importance weights.

    Parameters
    ----------
    shards : dict
        shard id -> Shard.
    selection : {"weighted", "epoch", "ordered", "sequential"}
        The sample plan (:attr:`TableConfig.plan`).
    out : SampleBuffers
        The batch, ``B`` rows of ``L`` steps.
    B : int
        Batch size.
    L : int
        Window length, in steps.
    boundary : str
        Boundary mode.
    columns : tuple of str
        Columns to gather.
    rng : numpy.random.Generator
        Draws shards and items.
    beta : float
        Importance-weight exponent (0: all weights 1).
    who : str
        Names the table in an error message.
    horizon : int, optional
        Ordered samples see only items stamped before it.

    Returns
    -------
    dict of int to int
        Items expired per shard by this sample.

    Raises
    ------
    EmptyTableError
        Nothing can be sampled (empty, or no window fits).
    """
    if selection == "weighted" and len(shards) == 1:
        ((i, s),) = shards.items()
        mass = s.valid_mass(L, boundary)
        if mass > 0:  # planner.weighted_draw's one shard: every row its own, all the mass (no Draw, no executor)
            slots, q = s.draw(B, L, boundary, rng, mass)
            n = take_into(s, slots, q, 1.0, L, boundary, rng, out, 0, columns)
            two_level.importance_weights(out.probabilities, beta, out.weights)
            return {i: n} if n else {}
    ex = InProcess(shards, rng, out, L, boundary, columns, horizon)
    try:
        draw = None
        if selection == "weighted":  # its plan's one draw, straight: the summary it asks, then the rule
            ex.masses = {i: s.valid_mass(L, boundary) for i, s in shards.items()}  # (summary's "sampler")
            draw = planner.weighted_draw(ex.masses, B, rng)
        if draw is None:
            layout = planner.run(planner.sample(selection, B, rng), ex)
        else:
            ex.draw(draw)  # (every row in place: no layout)
            layout = None
    except planner.NothingToSample:
        size = sum(s.size for s in shards.values())
        longest = max((s.longest_episode() for s in shards.values()), default=0)
        raise nothing_to_sample(who, size, longest, L, boundary) from None
    if layout is not None and layout.rows_at is not None:
        out.permute(planner.sources(layout.rows_at))
    two_level.importance_weights(out.probabilities, beta, out.weights)
    return ex.expired


def evict_shards(shards: dict, excess: int, ordered: bool, rng: np.random.Generator) -> int:
    """Remove ``excess`` items from in-process ``shards`` as the remover says.

    Parameters
    ----------
    shards : dict
        shard id -> Shard (their locks not held: each shard locks itself).
    excess : int
        Items to remove.
    ordered : bool
        Whether the remover is deterministic (Fifo, Lifo, heaps: a global
        merge of candidates) or random (counts split by remover mass).
    rng : numpy.random.Generator
        For random removers.

    Returns
    -------
    int
        Items removed (fewer than ``excess`` only when the shards ran out).
    """
    return planner.run(planner.evict(excess, ordered, rng), InProcess(shards, rng))
