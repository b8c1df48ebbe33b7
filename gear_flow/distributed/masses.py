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
    are refreshed by every draw's reply and by this handle's priority updates,
    and used for at most ``distributed.mass-max-age`` seconds: once one is
    older (a pause; a shard no batch drew from lately, whose writers may have
    filled it), the next plan asks every shard first.  Planned with, an old
    mass would make the draw's first level follow the shards' sizes at some
    earlier batch, however long ago: the reported probabilities those of the
    draw made, but not the table's distribution.
    """

    def __init__(self) -> None:
        self.values: dict[tuple[str, int, str], dict[int, tuple[float, float]]] = {}  # -> {shard: (mass, time)}

    def clear(self) -> None:
        """Forget every mass (placement changed, or this handle wrote: the next plan asks)."""
        self.values.clear()

    def fresh(self, kinds: Sequence[str], L: int, boundary: str, shards: Iterable[int]) -> dict | None:
        """The masses to plan with, or None when the plan must ask every shard first.

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
        dict or None
            ``{"sampler": {shard: mass}}``; None when none are :meth:`kept` for this plan or one is older
            than ``distributed.mass-max-age`` (<= 0: caching off).
        """
        age = config.get("distributed.mass-max-age") or 0.0
        if age <= 0 or not self.kept(kinds, L, boundary, shards):
            return None
        got = self.values[(kinds[0], L, boundary)]
        now = time.monotonic()
        if any(now - ts > age for _, ts in got.values()):
            return None
        return {kinds[0]: {s: m for s, (m, _) in got.items()}}

    def kept(self, kinds: Sequence[str], L: int, boundary: str, shards: Iterable[int]) -> bool:
        """Whether masses for this plan are kept, of any age: for each of ``shards`` and one positive at least.

        None are after :meth:`clear` (the placement changed, or this handle wrote), for a plan that asks for
        more than the sampler's masses, or when no mass was positive (a shard that filled since must not make
        the sample fail).

        Parameters
        ----------
        kinds, L, boundary, shards
            As :meth:`fresh` takes them.

        Returns
        -------
        bool
        """
        if len(kinds) != 1 or kinds[0] not in ("sampler",):
            return False
        got = self.values.get((kinds[0], L, boundary))
        return bool(got) and set(got) == set(shards) and any(m > 0 for m, _ in got.values())

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
