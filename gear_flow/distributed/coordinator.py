"""Scheduler plugin: the one place that holds a distributed table's global state.

Every client and every worker can reach the scheduler, so the coordinator
lives there: the table's configuration and shard placement, the global rate
limiter (Reverb semantics across all shards, with timeouts), the table size
as the limiter sees it, episode ids and insertion stamps, and lost shards.
Data never passes through it: callers ask it for admission, then talk to the
shard workers directly.
"""

from __future__ import annotations

import asyncio
import logging

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol import to_serialize

from ..errors import RateLimitTimeout, SpecError, TableClosedError
from ..rate_limiters import MinSize, from_config, to_config

logger = logging.getLogger(__name__)

COORDINATOR_NAME = "gear-flow-coordinator"


class TableState:
    """Global state of one table (lives on the scheduler)."""

    def __init__(self, name: str, config: dict, placement: dict):
        self.name = name
        self.config = config
        self.placement = {int(k): v for k, v in placement.items()}
        self.limiter = from_config(config["rate_limiter"])
        self.size = 0
        #: items per shard, as reported by the callers (what a lost shard held)
        self.shard_size = {s: 0 for s in self.placement}
        self.next_episode_id = 0
        self.next_stamp = 0
        self.lost: dict[int, dict] = {}
        #: items ever inserted per shard (what a lost shard had received since a checkpoint)
        self.shard_inserted = {s: 0 for s in self.placement}
        #: bumped whenever placement or lost shards change, so handles know to refresh
        self.version = 0
        self.closed = False
        self.cond = asyncio.Condition()

    def public(self) -> dict:
        return {
            "name": self.name,
            "config": self.config,
            "placement": self.placement,
            "size": self.size,
            "shard_size": dict(self.shard_size),
            "rate_limiter": self.limiter.info(),
            "rate_limiter_config": to_config(self.limiter),
            "lost": self.lost,
            "shard_inserted": dict(self.shard_inserted),
            "next_episode_id": self.next_episode_id,
            "next_stamp": self.next_stamp,
            "version": self.version,
            "closed": self.closed,
        }


class GearFlowCoordinator(SchedulerPlugin):
    """Registers the ``gear_flow_coord`` handler on the scheduler.

    Examples
    --------
    >>> client.register_plugin(GearFlowCoordinator())  # doctest: +SKIP
    """

    name = COORDINATOR_NAME
    idempotent = True

    async def start(self, scheduler):
        self.scheduler = scheduler
        self.tables: dict[str, TableState] = {}
        scheduler.handlers["gear_flow_coord"] = self.handle

    async def handle(self, comm=None, action=None, name=None, **kw):
        op = action
        ops = {
            "register": self._register,
            "lookup": self._lookup,
            "admit_insert": self._admit_insert,
            "rollback_insert": self._rollback_insert,
            "admit_sample": self._admit_sample,
            "rollback_sample": self._rollback_sample,
            "count_samples": self._count_samples,
            "removed": self._removed,
            "mark_lost": self._mark_lost,
            "restore_state": self._restore_state,
            "shard_restored": self._shard_restored,
            "close": self._close,
            "drop": self._drop,
            "list": self._list,
        }
        try:
            if op not in ops:
                raise ValueError(f"unknown coordinator op {op!r}")
            return {"status": "OK", "result": to_serialize(await ops[op](name, **kw))}
        except Exception as e:
            return {"status": "error", "error": to_serialize(e)}

    def _table(self, name) -> TableState:
        try:
            return self.tables[name]
        except KeyError:
            raise SpecError(f"no distributed table {name!r}; tables: {sorted(self.tables)}") from None

    async def _register(self, name, config, placement):
        if name in self.tables and not self.tables[name].closed:
            raise SpecError(f"a distributed table named {name!r} already exists")
        self.tables[name] = TableState(name, config, placement)
        return True

    async def _lookup(self, name):
        return self._table(name).public()

    async def _list(self, name=None):
        return sorted(self.tables)

    async def _admit(self, t: TableState, pred, apply, timeout, what):
        """Wait until ``pred()`` holds, then run ``apply()`` under the same hold of the lock.

        Checking and applying in one hold keeps the limiter's bounds: released in
        between, every waiter woken by one notify could pass the check before any
        of them applied its count (room for one insert admitted all of them).
        """
        async with t.cond:
            try:
                await asyncio.wait_for(t.cond.wait_for(lambda: t.closed or pred()), timeout)
            except asyncio.TimeoutError:
                raise RateLimitTimeout(
                    f"{what} on table {t.name!r} was not admitted by {t.limiter!r} within {timeout} s "
                    f"(size {t.size}, inserts {t.limiter.state.inserts}, samples {t.limiter.state.samples})"
                ) from None
            if t.closed:
                raise TableClosedError(f"table {t.name!r} is closed")
            out = apply()
            t.cond.notify_all()
            return out

    async def _admit_insert(self, name, n, episodes, per_shard=None, timeout=None):
        t = self._table(name)

        def apply():
            t.limiter.on_insert(n)
            t.size += n
            for s, k in (per_shard or {}).items():
                t.shard_size[int(s)] = t.shard_size.get(int(s), 0) + int(k)
                t.shard_inserted[int(s)] = t.shard_inserted.get(int(s), 0) + int(k)
            first_id, first_stamp = t.next_episode_id, t.next_stamp
            t.next_episode_id += episodes
            t.next_stamp += n
            return {"first_episode_id": first_id, "first_stamp": first_stamp, "version": t.version}

        return await self._admit(t, lambda: t.limiter.can_insert(n, t.size), apply, timeout, f"an insert of {n} items")

    async def _rollback_insert(self, name, n, per_shard=None):
        t = self._table(name)
        async with t.cond:
            t.limiter.state.inserts -= n
            # a lost shard's items already left the size when it was marked lost
            t.size -= n - sum(int(k) for s, k in (per_shard or {}).items() if int(s) in t.lost)
            for s, k in (per_shard or {}).items():
                if int(s) not in t.lost:
                    t.shard_size[int(s)] -= int(k)
                t.shard_inserted[int(s)] -= int(k)
            t.cond.notify_all()
        return True

    async def _admit_sample(self, name, n, timeout=None, done=0, lease=0):
        """Admit a sample of ``n``; ``done`` counts leased samples already served.

        With a MinSize limiter (no sample/insert ratio to keep) the caller may be
        granted a *lease* of up to ``lease`` further batches of ``n``, served
        without asking again while the lease lasts (a co-located learner then
        pays no scheduler round trip per batch); their counts come back in
        ``done`` with the next request.
        """
        t = self._table(name)

        def apply():
            t.limiter.on_sample(n + done)
            grant = lease if isinstance(t.limiter, MinSize) and lease > 0 else 0
            return {"version": t.version, "lease": grant}

        return await self._admit(t, lambda: t.limiter.can_sample(n, t.size), apply, timeout, f"a sample of {n}")

    async def _count_samples(self, name, n):
        """Samples already served under a lease (no admission check)."""
        t = self._table(name)
        async with t.cond:
            t.limiter.on_sample(n)
            t.cond.notify_all()
        return True

    async def _rollback_sample(self, name, n):
        t = self._table(name)
        async with t.cond:
            t.limiter.state.samples -= n
            t.cond.notify_all()
        return True

    async def _removed(self, name, k, per_shard=None):
        t = self._table(name)
        async with t.cond:
            t.size -= k - sum(int(j) for s, j in (per_shard or {}).items() if int(s) in t.lost)
            for s, j in (per_shard or {}).items():
                if int(s) not in t.lost:
                    t.shard_size[int(s)] -= int(j)
            t.limiter.on_delete(k)
            t.cond.notify_all()
        return t.size

    async def _mark_lost(self, name, shard, detail=""):
        t = self._table(name)
        async with t.cond:
            if int(shard) not in t.lost:
                size = t.shard_size.get(int(shard), 0)
                t.lost[int(shard)] = {
                    "size_at_loss": int(size),
                    "inserted_at_loss": int(t.shard_inserted.get(int(shard), 0)),
                    "detail": detail,
                }
                t.size -= int(size)
                t.shard_size[int(shard)] = 0
                t.version += 1
            t.cond.notify_all()
        return t.lost

    async def _restore_state(self, name, state):
        """Counters of a restored table (from its checkpoint)."""
        t = self._table(name)
        async with t.cond:
            t.size = int(state["size"])
            t.shard_size = {int(k): int(v) for k, v in state["shard_size"].items()}
            t.shard_inserted = {int(k): int(v) for k, v in state["shard_inserted"].items()}
            t.next_episode_id = int(state["next_episode_id"])
            t.next_stamp = int(state["next_stamp"])
            t.cond.notify_all()
        return True

    async def _shard_restored(self, name, shard, worker, size, inserted):
        """A lost shard was rebuilt on ``worker`` from a checkpoint holding ``size`` items."""
        t = self._table(name)
        async with t.cond:
            lost = t.lost.pop(int(shard), None)
            if lost is not None:
                # inserts in flight when the shard was lost are rolled back after the loss was
                # marked; the count now is what the shard really had received
                lost["inserted_at_loss"] = int(t.shard_inserted.get(int(shard), 0))
            t.placement[int(shard)] = worker
            t.shard_size[int(shard)] = int(size)
            t.size += int(size)
            t.shard_inserted[int(shard)] = int(inserted)
            t.version += 1
            t.cond.notify_all()
        return lost

    async def _close(self, name):
        t = self._table(name)
        async with t.cond:
            t.closed = True
            t.cond.notify_all()
        return True

    async def _drop(self, name):
        t = self.tables.pop(name, None)
        if t is not None:
            async with t.cond:
                t.closed = True
                t.cond.notify_all()
        return True

    def state(self, name) -> dict:
        return self._table(name).public()

    def limiter_config(self, name) -> dict:
        return to_config(self._table(name).limiter)
