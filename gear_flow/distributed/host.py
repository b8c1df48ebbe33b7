"""Worker-side host of shards: plain, synchronous methods over local Shards.

One :class:`ShardHost` lives in each worker (made by the worker plugin) and
holds the shards of every distributed table placed there.  Its methods take
and return only NumPy arrays and plain Python values, so they travel over
Dask's comm as raw frames; they know nothing about Dask and are tested
without a cluster.  A co-located learner calls them in-process (no copy).

Inserts are transactions: ``stage`` validates and keeps the episodes (no copy,
nothing visible), ``apply`` writes them, ``abort`` forgets them; ``write`` is
both at once for an insert that touches only this worker.  ``status`` tells
the coordinator what became of a transaction whose client went away.

Samples are answered by :class:`~gear_flow.distributed.host_sampling.SamplingHost`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ..errors import CapacityError, SpecError
from ..shard import EpisodeBatch, Shard
from ..table.config import TableConfig
from ..table.executor import evict_on, summary
from .host_sampling import SamplingHost

#: transactions whose outcome a worker remembers (for the coordinator's recovery)
_REMEMBER = 4096


def shared_pinned():
    """A ``pinned`` tier whose rings are page-locked shared-memory segments (:mod:`gear_flow.gpu.shared`)."""
    from ..gpu.shared import SharedPinnedTier

    return SharedPinnedTier()


class HostedTable:
    """The shards of one table on one worker, plus its transactions in progress."""

    def __init__(self, name: str, cfg: TableConfig, shard_ids, tier=None, shared: bool = False):
        self.name = name
        self.cfg = cfg
        self.spec = cfg.spec
        tier = tier or cfg.tier
        if shared and tier == "host":  # the shared-memory data plane: same arrays, in named segments
            tier = "shared"
        #: where the shards' rings live, and so where their gathered windows land
        self.tier = tier
        self.shards: dict[int, Shard] = {
            int(i): Shard(
                cfg.spec,
                int(i),
                cfg.sampler.clone(),
                cfg.remover.clone(),
                max_times_sampled=cfg.max_times_sampled,
                tier=shared_pinned() if shared and tier == "pinned" else tier,  # one page-locked segment set per shard
            )
            for i in shard_ids
        }
        self.staged: dict[str, list] = {}
        self.applied: OrderedDict[str, dict] = OrderedDict()
        self.pending: dict[str, list] = {}  # sample txn -> [(shard, slots, seqs, drawn)]
        self.lock = threading.Lock()

    def release(self, shards=None) -> None:
        """Unlink the shared-memory segments of ``shards`` (default: all)."""
        for i in sorted(self.shards if shards is None else shards):
            s = self.shards.get(i)
            if s is not None and hasattr(s.tier, "release"):
                s.tier.release()

    def shard(self, i) -> Shard:
        try:
            return self.shards[int(i)]
        except (KeyError, TypeError, ValueError):
            raise SpecError(
                f"shard {i!r} of table {self.name!r} is not on this worker (here: {sorted(self.shards)})"
            ) from None

    def locked(self, ids=None):
        """Acquire the locks of ``ids`` (default: all) in ascending order; returns them for release."""
        locks = [self.shards[i].lock for i in sorted(self.shards if ids is None else ids)]
        for lk in locks:
            lk.acquire()
        return locks


class ShardHost(SamplingHost):
    """All hosted tables of one worker; see the module docstring."""

    def __init__(self):
        self.tables: dict[str, HostedTable] = {}
        self.lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------
    def create(self, name: str, config: dict, shard_ids, tier: str | None = None) -> list[int]:
        cfg = TableConfig.from_dict(config)
        with self.lock:
            if name in self.tables:
                have = sorted(self.tables[name].shards)
                if have != sorted(int(i) for i in shard_ids):
                    raise SpecError(f"table {name!r} already has shards {have} on this worker")
                return have
            self.tables[name] = HostedTable(name, cfg, shard_ids, tier, shared=bool(config.get("shared_memory")))
            return sorted(self.tables[name].shards)

    def drop(self, name: str) -> bool:
        with self.lock:
            t = self.tables.pop(name, None)
        if t is not None:
            t.release()
        return t is not None

    def close(self) -> None:
        """The worker is closing: release every table's shared memory."""
        with self.lock:
            tables, self.tables = list(self.tables.values()), {}
        for t in tables:
            t.release()

    def shared_layout(self, name) -> dict:
        """For readers on this machine: ``{"machine", "shards": {shard: layout or None}}``."""
        from ..storage.shared import machine_id

        return {"machine": machine_id(), "shards": {i: s.shared_layout() for i, s in self.table(name).shards.items()}}

    def table(self, name: str) -> HostedTable:
        try:
            return self.tables[name]
        except (KeyError, TypeError):
            raise SpecError(f"no table {name!r} on this worker; tables here: {sorted(self.tables)}") from None

    def shard(self, name: str, shard_id: int) -> Shard:
        return self.table(name).shard(shard_id)

    # -- inserts: stage, apply, abort -----------------------------------------------------
    def stage(self, name, txn: str, parts: list) -> int:
        """Validate and keep ``parts`` of insert ``txn`` (nothing visible yet); returns items staged.

        Each part: ``{"shard", "chunks", "lengths", "episode_ids", "stamps", "priorities"}``.
        """
        t = self.table(name)
        batches = [self._batch(t, p) for p in parts]
        if t.cfg.lossless:  # a Queue/Stack: the ring may never overwrite an item still waiting
            steps = {}
            for sid, b in batches:
                steps[sid] = steps.get(sid, 0) + int(b.lengths.sum())
            for sid, n in steps.items():
                lost = t.shards[sid].live_overwritten(n)
                if lost:
                    raise CapacityError(
                        f"shard {sid} of table {name!r}: storing {n} more steps would overwrite {lost} items that "
                        f"were never handed out (capacity {t.spec.capacity}); give the table more capacity; "
                        "nothing was inserted"
                    )
        with t.lock:
            if txn in t.staged or txn in t.applied:
                raise SpecError(f"insert {txn!r} of table {name!r} was already staged on this worker")
            t.staged[txn] = batches
        step = t.spec.item_unit == "step"
        return int(sum(int(b.lengths.sum()) if step else len(b.lengths) for _, b in batches))

    def _batch(self, t: HostedTable, p: dict):
        s = t.shard(p["shard"])
        lengths = np.asarray(p["lengths"], dtype=np.int64)
        chunks = list(p["chunks"])
        if len(chunks) != len(lengths) or np.any(lengths < 1):
            raise SpecError(f"shard {s.shard_id}: {len(chunks)} chunks for {len(lengths)} episode lengths")
        if not len(np.asarray(p["episode_ids"])) == len(np.asarray(p["stamps"])) == len(lengths):
            raise SpecError(f"shard {s.shard_id}: one episode id and one stamp per episode are needed")
        if lengths.sum() > s.capacity:
            raise SpecError(f"shard {s.shard_id}: {int(lengths.sum())} steps exceed its capacity ({s.capacity})")
        for c, n in zip(chunks, lengths):
            for col in t.spec.columns:
                a = c.get(col.name) if hasattr(c, "get") else None
                if not isinstance(a, np.ndarray) or a.dtype != col.dtype or a.shape != (int(n), *col.shape):
                    raise SpecError(
                        f"shard {s.shard_id}: column {col.name!r} must be {col.dtype}[{int(n)}, *{col.shape}], got "
                        f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}"
                    )
        n_items = int(lengths.sum()) if t.spec.item_unit == "step" else len(lengths)
        pr = p.get("priorities")
        if pr is not None:
            pr = np.asarray(pr, dtype=np.float64)
            if pr.shape != (n_items,) or not np.all(np.isfinite(pr) & (pr >= 0)):
                raise SpecError(f"shard {s.shard_id}: priorities must be {n_items} finite values >= 0")
        batch = EpisodeBatch(
            chunks,
            lengths,
            np.asarray(p["episode_ids"], dtype=np.int64),
            np.asarray(p["stamps"], dtype=np.int64),
            pr,
        )
        return s.shard_id, batch

    def apply(self, name, txn: str) -> dict:
        """Write the staged insert ``txn``; returns ``{"first_keys": {shard: keys}, "evicted": {shard: n}}``.

        Applying a transaction twice returns the first result (the coordinator's
        recovery and the client may both ask).
        """
        t = self.table(name)
        with t.lock:
            if txn in t.applied:
                return t.applied[txn]
            try:
                batches = t.staged.pop(txn)
            except KeyError:
                raise SpecError(f"insert {txn!r} of table {name!r} is not staged on this worker") from None
        res = {"first_keys": {}, "evicted": {}, "items": {}}
        for sid, batch in batches:
            s = t.shards[sid]
            with s.lock:  # count only this insert's evictions
                before = s.counters.evicted
                fk, n = s.insert(batch)
                ev = s.counters.evicted - before
            res["first_keys"][sid] = np.concatenate([res["first_keys"][sid], fk]) if sid in res["first_keys"] else fk
            res["items"][sid] = res["items"].get(sid, 0) + int(n)
            if ev:
                res["evicted"][sid] = res["evicted"].get(sid, 0) + int(ev)
        with t.lock:
            t.applied[txn] = res
            while len(t.applied) > _REMEMBER:
                t.applied.popitem(last=False)
        return res

    def write(self, name, txn: str, parts: list) -> dict:
        """Stage and apply at once (an insert that touches only this worker)."""
        self.stage(name, txn, parts)
        return self.apply(name, txn)

    def abort(self, name, txn: str) -> bool:
        """Forget a staged insert, or undo a pending sample; True if there was something to undo."""
        t = self.tables.get(name)
        if t is None:
            return False
        with t.lock:
            staged = t.staged.pop(txn, None) is not None
        return staged or bool(self.finish_sample(name, txn, commit=False))

    def status(self, name, txn: str) -> dict:
        """What became of ``txn`` here: ``staged``, ``applied`` (with its result) or ``unknown``."""
        t = self.tables.get(name)
        if t is None:
            return {"state": "unknown"}
        with t.lock:
            if txn in t.applied:
                return {"state": "applied", "result": t.applied[txn]}
            return {"state": "staged" if txn in t.staged else "unknown"}

    # -- priorities, deletes, removal ------------------------------------------------------
    def check_keys(self, name, seqs_by_shard: dict) -> None:
        """Raise UnknownKeyError if any seq was never issued (nothing applied)."""
        t = self.table(name)
        for i, seqs in seqs_by_shard.items():
            t.shard(i).resolve(np.asarray(seqs, dtype=np.int64))

    def update(
        self,
        name,
        seqs_by_shard: dict,
        prios_by_shard: dict,
        stamps_by_shard: dict | None = None,
        masses: list | None = None,
    ) -> int | dict:
        """Apply priorities; returns the stale count, or with ``masses`` (``[{length, boundary}]``: the
        plans the caller keeps masses for) ``{"stale": n, "masses": [{shard: sampler mass}]}`` of the
        updated shards after the update, so the caller's next plan needs no masses round trip."""
        if set(seqs_by_shard) != set(prios_by_shard) or any(
            len(np.asarray(seqs_by_shard[i])) != len(np.asarray(prios_by_shard[i])) for i in seqs_by_shard
        ):
            raise SpecError("worker 'update': one priority per key, for the same shards")
        self.check_keys(name, seqs_by_shard)
        t = self.table(name)
        for i in seqs_by_shard:
            t.cfg.check_priorities(np.asarray(prios_by_shard[i], np.float64))
        st = stamps_by_shard or {}
        stale = sum(
            t.shard(i).update_priorities(
                np.asarray(seqs, np.int64), np.asarray(prios_by_shard[i], np.float64), st.get(i)
            )
            for i, seqs in seqs_by_shard.items()
        )
        if masses is None or t.cfg.selection != "weighted":
            return stale if masses is None else {"stale": stale, "masses": []}
        return {
            "stale": stale,
            "masses": [
                {int(i): summary(t.shard(i), "sampler", m["length"], m["boundary"]) for i in seqs_by_shard}
                for m in masses
            ],
        }

    def delete(self, name, seqs_by_shard: dict) -> tuple[dict, int]:
        """Returns ({shard: deleted}, stale)."""
        self.check_keys(name, seqs_by_shard)
        t = self.table(name)
        d, st = {}, 0
        for i, seqs in seqs_by_shard.items():
            a, b = t.shard(i).delete(np.asarray(seqs, np.int64))
            d[int(i)] = a
            st += b
        return d, st

    def remove(self, name, counts: dict | None = None, slots: dict | None = None, seed=None) -> dict:
        """Evict by the remover (an :class:`planner.Evict` part); returns {shard: removed}."""
        rng = np.random.default_rng(seed)
        t = self.table(name)
        if (counts is None) == (slots is None):
            raise SpecError("worker 'remove': give exactly one of counts and slots")
        for i, v in (slots or {}).items():
            if len(v) and int(np.max(v)) >= t.shard(i).capacity:
                raise SpecError(f"worker 'remove': slots of shard {i} must be below its capacity")
        for i in counts or {}:
            t.shard(i)
        out = {}
        for i, v in (slots if slots is not None else counts or {}).items():
            k = evict_on(t.shard(i), slots=v, rng=rng) if slots is not None else evict_on(t.shard(i), counts=v, rng=rng)
            if k:
                out[int(i)] = k
        return out

    # -- checkpoints --------------------------------------------------------------------------
    def checkpoint(self, name, directory) -> dict:
        """Snapshot every hosted shard (under its lock) and write it to ``directory``.

        Returns ``{shard: {"file", "sha256", "meta", "pause_s"}}``.
        """
        import time
        from pathlib import Path

        from .. import checkpoint as ck

        out = {}
        for i, s in sorted(self.table(name).shards.items()):
            t0 = time.perf_counter()
            arrays, meta = ck.snapshot_shard(s)
            pause = time.perf_counter() - t0
            f, digest = ck.write_shard_file(Path(directory), i, arrays)
            out[i] = {"file": f, "sha256": digest, "meta": meta, "pause_s": pause}
        return out

    def restore(self, name, config: dict, directory, files: dict, tier: str | None = None) -> dict:
        """Create the table's shards ``files`` (``{shard: entry}``) here from a checkpoint directory.

        Shards already hosted are replaced.  Every file is verified before any shard is built.
        """
        from pathlib import Path

        from .. import checkpoint as ck

        cfg = TableConfig.from_dict(config)
        loaded = {int(i): ck.read_shard_file(Path(directory), e["file"], e["sha256"]) for i, e in files.items()}
        with self.lock:
            old = self.tables.get(name)
            have = set(old.shards) if old is not None else set()
            t = HostedTable(name, cfg, sorted(loaded), tier)
            for i in loaded:
                ck.restore_shard(t.shards[i], loaded[i], files[i]["meta"])
            for i in have - set(loaded):  # keep shards this worker already hosts
                t.shards[i] = old.shards[i]
            self.tables[name] = t
        return {i: t.shards[i].size for i in loaded}

    def drop_shard(self, name, shard: int) -> bool:
        """Forget one shard of a table here (it was restored on another worker)."""
        with self.lock:
            t = self.tables.get(name)
            if t is None or int(shard) not in t.shards:
                return False
            t.release([int(shard)])
            return t.shards.pop(int(shard)) is not None

    def info(self, name) -> list[dict]:
        return [
            {**s.info(), "longest_episode": s.longest_episode()} for _, s in sorted(self.table(name).shards.items())
        ]

    def nbytes(self, name) -> dict:
        parts = [s.nbytes() for s in self.table(name).shards.values()]
        return {k: sum(p[k] for p in parts) for k in ("data", "overhead")}
