"""What a table handle knows of its shards without asking: masses to plan with, keys issued.

Both save round trips per batch: reused masses the masses request, known
keys the all-or-nothing key check before a priority update.
"""

from __future__ import annotations

import time

import numpy as np

from .. import config
from ..keys import decode


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

    def __init__(self):
        self.values = {}  # (kind, L, boundary) -> {shard: (mass, time)}

    def clear(self):
        self.values.clear()

    def fresh(self, kinds, L, boundary, shards) -> tuple[dict | None, list[int]]:
        """``(masses to plan with, shards whose mass is older than the maximum age)``.

        ``(None, [])`` when the plan must ask every shard first: nothing kept
        for this plan, a shard missing, or no mass anywhere (a shard that filled
        since must not make the sample fail).  Stale shards are still planned
        with (the reported probabilities stay those of the draw made); the
        caller refreshes them in the same round trip as the draw, for the next
        plan.
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

    def store(self, kinds, L, boundary, got: dict):
        now = time.monotonic()
        for k in kinds:
            self.values[(k, L, boundary)] = {s: (float(m), now) for s, m in got[k].items()}

    def plans(self) -> list[dict]:
        """The ``(length, boundary)`` of every sampler plan kept here, as a worker's ``update`` takes them."""
        return [{"length": int(L), "boundary": b} for (k, L, b) in self.values if k == "sampler"]

    def update_many(self, plans: list[dict], got: list[dict]) -> None:
        """Masses an ``update`` reply gave for ``plans`` (same order): this handle's own priority
        updates show in its next plan without a masses round trip."""
        for m, shards in zip(plans, got):
            for s, mass in shards.items():
                self.update(m["length"], m["boundary"], int(s), mass)

    def update(self, L, boundary, shard, mass):
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

    def __init__(self):
        self.hi: dict[int, int] = {}

    def clear(self) -> None:
        self.hi.clear()

    def note(self, keys: np.ndarray) -> None:
        """Record the keys of a sample this handle received."""
        if not len(keys):
            return
        shard, seq = decode(np.asarray(keys, dtype=np.int64))
        for s in np.unique(shard).tolist():
            m = int(seq[shard == s].max())
            if m > self.hi.get(s, -1):
                self.hi[s] = m

    def covers(self, keys: np.ndarray) -> bool:
        """Were all ``keys`` issued, as far as this handle has seen?"""
        if not len(keys):
            return True
        shard, seq = decode(np.asarray(keys, dtype=np.int64))
        return all(int(seq[shard == s].max()) <= self.hi.get(s, -1) for s in np.unique(shard).tolist())
