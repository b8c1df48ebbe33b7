"""Shard masses a distributed sampler may reuse between batches (one round trip per batch)."""

from __future__ import annotations

import time

from .. import config


class MassCache:
    """The shards' sampling masses a planner used last, refreshed by every draw's reply.

    A plan may use masses that are a little old without losing exactness: the
    shard is chosen with the masses the plan used (that first-level
    probability is what gets reported) and the item with the shard's mass at
    the draw.  Reusing them saves the masses round trip, so a steady-state
    batch costs one round trip, and only to the workers it draws from.  They
    are refreshed by every draw's reply and fetched again once any is older
    than ``distributed.mass-max-age`` seconds (so a shard that was empty, or
    no batch drew from, is not left out for long).
    """

    def __init__(self):
        self.values = {}  # (kind, L, boundary) -> {shard: (mass, time)}

    def clear(self):
        self.values.clear()

    def fresh(self, kinds, L, boundary, shards):
        age = config.get("distributed.mass-max-age") or 0.0
        if age <= 0 or len(kinds) != 1 or kinds[0] not in ("sampler",):
            return None
        got = self.values.get((kinds[0], L, boundary))
        now = time.monotonic()
        if not got or set(got) != set(shards) or any(now - ts > age for _, ts in got.values()):
            return None
        return {kinds[0]: {s: m for s, (m, _) in got.items()}}

    def store(self, kinds, L, boundary, got: dict):
        now = time.monotonic()
        for k in kinds:
            self.values[(k, L, boundary)] = {s: (float(m), now) for s, m in got[k].items()}

    def update(self, L, boundary, shard, mass):
        d = self.values.get(("sampler", L, boundary))
        if d is not None and shard in d:
            d[shard] = (float(mass), time.monotonic())
