"""What a table handle knows of its shards without asking: masses to plan with, keys issued.

Both save round trips per batch: reused masses the masses request, known
keys the all-or-nothing key check before a priority update.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import numpy as np

from .. import config
from ..keys import highest_seqs


class MassCache:
    """The shards' sampling masses a planner used last, refreshed by every draw's reply.

    A plan may use masses that are a little old without losing exactness: the
    shard is chosen with the masses the plan used (that first-level
    probability is what gets reported) and the item with the shard's mass at
    the draw.  Reusing them saves the masses round trip, so a steady-state
    batch costs one round trip, and only to the workers it draws from.  They
    are refreshed by every draw's reply and by this handle's priority updates;
    one older than ``distributed.mass-max-age`` seconds (a shard no batch drew
    from lately, whose writers may have filled it) is asked for again in the
    same round trip as the next draw, so a sample never waits for masses
    while it has some to plan with.
    """

    def __init__(self) -> None:
        self.values: dict[tuple[str, int, str], dict[int, tuple[float, float]]] = {}  # -> {shard: (mass, time)}

    def clear(self) -> None:
        """Forget every mass (placement changed, or this handle wrote: the next plan asks)."""
        self.values.clear()

    def fresh(
        self, kinds: Sequence[str], L: int, boundary: str, shards: Iterable[int]
    ) -> tuple[dict | None, list[int]]:
        """``(masses to plan with, shards whose mass is older than the maximum age)``.

        Stale shards are still planned with (the reported probabilities stay
        those of the draw made); the caller refreshes them in the same round
        trip as the draw, for the next plan.

        Parameters
        ----------
        kinds : sequence of str
            Summaries the plan asks for; only ``("sampler",)`` is ever cached.
        L : int
            Window length of the sample, in steps.
        boundary : str
            Its boundary mode (masses depend on which windows fit).
        shards : iterable of int
            The live shards the plan covers.

        Returns
        -------
        masses : dict or None
            ``{"sampler": {shard: mass}}`` to plan with; None when the plan
            must ask every shard first: caching off
            (``distributed.mass-max-age`` <= 0), nothing kept for this plan, a
            shard missing, or no mass anywhere (a shard that filled since must
            not make the sample fail).
        stale : list of int
            Sorted shards whose mass is older than the maximum age (empty
            when ``masses`` is None).
        """
        age = config.get("distributed.mass-max-age") or 0.0
        if age <= 0 or len(kinds) != 1 or kinds[0] not in ("sampler",):
            return None, []
        got = self.values.get((kinds[0], L, boundary))
        if not got or set(got) != set(shards) or not any(m > 0 for m, _ in got.values()):
            return None, []
        now = time.monotonic()
        stale = sorted(s for s, (_, ts) in got.items() if now - ts > age)
        return {kinds[0]: {s: m for s, (m, _) in got.items()}}, stale

    def store(self, kinds: Sequence[str], L: int, boundary: str, got: dict[str, dict[int, float]]) -> None:
        """Keep the masses the workers just reported, stamped now.

        Parameters
        ----------
        kinds : sequence of str
            Summary kinds in ``got`` to keep.
        L : int
            Window length they were computed for.
        boundary : str
            Boundary mode they were computed for.
        got : dict
            ``{kind: {shard: mass}}``, as the ``summaries`` request returns.
        """
        now = time.monotonic()
        for k in kinds:
            self.values[(k, L, boundary)] = {s: (float(m), now) for s, m in got[k].items()}

    def plans(self) -> list[dict]:
        """The ``(length, boundary)`` of every sampler plan kept here, as a worker's ``update`` takes them.

        Returns
        -------
        list of dict
            ``[{"length": int, "boundary": str}, ...]``, one per cached plan.
        """
        # a copy first: a caller's thread reads this while the event loop may store masses
        return [{"length": int(L), "boundary": b} for (k, L, b) in list(self.values) if k == "sampler"]

    def update_many(self, plans: list[dict], got: list[dict]) -> None:
        """Masses an ``update`` reply gave for ``plans`` (same order).

        This handle's own priority updates show in its next plan without a
        masses round trip.

        Parameters
        ----------
        plans : list of dict
            What :meth:`plans` returned when the update was sent.
        got : list of dict
            Per plan, ``{shard: mass}`` of the updated shards.
        """
        for m, shards in zip(plans, got):
            for s, mass in shards.items():
                self.update(m["length"], m["boundary"], int(s), mass)

    def update(self, L: int, boundary: str, shard: int, mass: float) -> None:
        """Set one shard's cached mass for a plan, stamped now (ignored when not cached).

        Parameters
        ----------
        L : int
            Window length of the plan.
        boundary : str
            Boundary mode of the plan.
        shard : int
            Shard id.
        mass : float
            Its sampling mass now.
        """
        d = self.values.get(("sampler", L, boundary))
        if d is not None and shard in d:
            d[shard] = (float(mass), time.monotonic())


class IssuedKeys:
    """The highest item seq this handle has seen each shard issue (in its samples).

    A shard issues seqs in increasing order and only ever rejects as unknown a
    seq at or above its next one, so keys at or below the highest seen can never
    be unknown: a priority update made only of those needs no key check on the
    workers first.  Cleared when the placement changes (a restored shard may
    have issued fewer).
    """

    def __init__(self) -> None:
        self.hi: dict[int, int] = {}

    def clear(self) -> None:
        """Forget every seq seen (the placement changed)."""
        self.hi.clear()

    def note(self, keys: np.ndarray) -> None:
        """Record the keys of a sample this handle received.

        Parameters
        ----------
        keys : numpy.ndarray
            int64 item keys, any shape.
        """
        top = highest_seqs(keys)
        for s in np.flatnonzero(top >= 0).tolist():
            m = int(top[s])
            if m > self.hi.get(s, -1):
                self.hi[s] = m

    def covers(self, keys: np.ndarray) -> bool:
        """Were all ``keys`` issued, as far as this handle has seen?

        Parameters
        ----------
        keys : numpy.ndarray
            int64 item keys, validated (each names a shard of the table).

        Returns
        -------
        bool
            True when every key's seq is at or below the highest this handle
            has seen its shard issue (also for no keys); False means the
            workers must check them.
        """
        top = highest_seqs(keys)
        return all(int(top[s]) <= self.hi.get(s, -1) for s in np.flatnonzero(top >= 0).tolist())
