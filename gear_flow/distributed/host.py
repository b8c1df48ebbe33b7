"""Worker-side host of shards: plain, synchronous methods over local Shards.

One :class:`ShardHost` lives in each worker (made by the worker plugin) and
holds the shards of every distributed table placed there.  Its methods take
and return only NumPy arrays and plain Python values, so they travel over
Dask's comm as raw frames; they know nothing about Dask and are tested
without a cluster.  A co-located learner calls them in-process (no copy).
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import GearFlowError, SpecError
from ..sample import SampleBuffers
from ..selectors import OrderedSelector, from_config
from ..shard import EpisodeBatch, Shard
from ..spec import TableSpec
from ..table.local import LocalTable


class StaleSelectionError(GearFlowError):
    """Items chosen in an earlier phase of a sample were removed before the gather (retry)."""


class HostedTable:
    """The shards of one table on one worker."""

    def __init__(self, name: str, config: dict, shard_ids, tier: str | None):
        self.name = name
        self.config = config
        self.spec = TableSpec.from_dict(config["spec"])
        # the worker's shards form a LocalTable (its limiter unused: admission is global,
        # at the coordinator), so a worker holding every live shard samples in one call
        # with exactly the local two-level logic
        self.local = LocalTable(
            self.spec,
            sampler=from_config(config["sampler"]),
            remover=from_config(config["remover"]),
            max_times_sampled=config.get("max_times_sampled", 0),
            tier=tier or config.get("tier", "host"),
            shard_ids=[int(i) for i in shard_ids],
        )
        self.shards: dict[int, Shard] = {s.shard_id: s for s in self.local.shards}


class ShardHost:
    """All hosted tables of one worker; see the module docstring."""

    def __init__(self):
        self.tables: dict[str, HostedTable] = {}
        self.lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------
    def create(self, name: str, config: dict, shard_ids, tier: str | None = None) -> list[int]:
        with self.lock:
            if name in self.tables:
                have = sorted(self.tables[name].shards)
                if have != sorted(int(i) for i in shard_ids):
                    raise SpecError(f"table {name!r} already has shards {have} on this worker")
                return have
            self.tables[name] = HostedTable(name, config, shard_ids, tier)
            return sorted(self.tables[name].shards)

    def drop(self, name: str) -> bool:
        with self.lock:
            return self.tables.pop(name, None) is not None

    def table(self, name: str) -> HostedTable:
        try:
            return self.tables[name]
        except KeyError:
            raise SpecError(f"no table {name!r} on this worker; tables here: {sorted(self.tables)}") from None

    def shard(self, name: str, shard_id: int) -> Shard:
        t = self.table(name)
        try:
            return t.shards[int(shard_id)]
        except KeyError:
            raise SpecError(
                f"shard {shard_id} of table {name!r} is not on this worker (here: {sorted(t.shards)})"
            ) from None

    # -- writing ----------------------------------------------------------------------
    def insert(self, name, shard_id, chunks: list, lengths, episode_ids, stamps, priorities=None) -> dict:
        """Store validated episodes; ``chunks`` are column dicts written back to back."""
        s = self.shard(name, shard_id)
        batch = EpisodeBatch(
            list(chunks),
            np.asarray(lengths, dtype=np.int64),
            np.asarray(episode_ids, dtype=np.int64),
            np.asarray(stamps, dtype=np.int64),
            None if priorities is None else np.asarray(priorities, dtype=np.float64),
        )
        with s.lock:  # concurrent inserts: count only this one's evictions
            before = s.counters.evicted
            first_keys, n_items = s.insert(batch)
            evicted = s.counters.evicted - before
            size = s.size
        return {"first_keys": first_keys, "num_items": n_items, "evicted": evicted, "size": size}

    # -- selection ----------------------------------------------------------------------
    def masses(self, name, length, boundary, kind: str = "sampler") -> dict:
        """Per shard: ``sampler`` valid mass, ``unseen`` epoch items, ``remover`` mass, or ``size``."""
        out = {}
        for i, s in self.table(name).shards.items():
            if kind == "sampler":
                out[i] = s.valid_mass(length, boundary)
            elif kind == "unseen":
                out[i] = float(s.unseen(length, boundary))
            elif kind == "remover":
                out[i] = s.remover.mass
            else:
                out[i] = float(s.size)
        return out

    def new_epoch(self, name) -> None:
        for s in self.table(name).shards.values():
            s.new_epoch()

    def candidates(self, name, n, length, boundary) -> dict:
        return {i: s.candidates(n, length, boundary) for i, s in self.table(name).shards.items()}

    def sample_part(
        self,
        name,
        counts: dict,
        length,
        boundary,
        columns,
        seed,
        masses: dict | None = None,
        slots: dict | None = None,
        out: dict | None = None,
        offsets: dict | None = None,
    ) -> dict:
        """Draw ``counts[shard]`` items (or take the given ``slots``) and gather their windows.

        Returns per shard the window data (unless ``out`` receives it in place at
        ``offsets[shard]``), keys, local probabilities ``w / m'`` (``m'`` the
        shard's valid mass at the draw), episode ids, timesteps and mask geometry.
        """
        rng = np.random.default_rng(seed)
        t = self.table(name)
        res = {}
        for i in sorted(counts if slots is None else slots):
            s = t.shards[int(i)]
            with s.lock:
                if slots is None:
                    c = int(counts[i])
                    if c == 0:
                        continue
                    m = None if masses is None else masses.get(i)
                    if s.sampler.without_replacement:
                        m = float(s.unseen(length, boundary))
                    sl, q = s.draw(c, length, boundary, rng, mass=m)
                else:
                    sl = np.asarray(slots[i], dtype=np.int64)
                    if not s.active[sl].all():
                        raise StaleSelectionError(f"shard {i}: a chosen item was removed before the gather")
                    q = np.ones(len(sl))
                n = len(sl)
                if out is None:
                    buf = {c: np.empty((n, length, max(t.spec.column(c).nbytes, 1)), dtype=np.uint8) for c in columns}
                    off = 0
                else:
                    buf = out
                    off = offsets[i]
                before = s.counters.expired
                win = s.take(sl, length, boundary, rng, buf, off, columns)
                r = {
                    "seqs": win.seqs,
                    "q": q,
                    "episode_ids": win.episode_ids,
                    "timesteps": win.timesteps,
                    "dst_offset": win.dst_offset,
                    "n_valid": win.n_valid,
                    "expired": s.counters.expired - before,
                }
                if out is None:
                    r["data"] = buf
                res[int(i)] = r
        return res

    def sample_all(self, name, n, length, boundary, columns, seed, out: SampleBuffers | None = None) -> dict:
        """The whole two-level sample over this worker's shards (when they are all the live ones)."""
        t = self.table(name)
        buf = SampleBuffers(t.spec, columns, n, length) if out is None else out
        locks = [s.lock for _, s in sorted(t.shards.items())]
        for lk in locks:  # concurrent samples: count only this one's expirations
            lk.acquire()
        try:
            before = {i: s.counters.expired for i, s in t.shards.items()}
            t.local._sample_into(buf, n, length, boundary, tuple(columns), np.random.default_rng(seed))
            expired = {i: s.counters.expired - before[i] for i, s in t.shards.items() if s.counters.expired - before[i]}
        finally:
            for lk in reversed(locks):
                lk.release()
        res = {"expired": expired}
        if out is None:
            res.update(
                data=buf.bytes,
                keys=buf.keys,
                probabilities=buf.probabilities,
                weights=buf.weights,
                mask=buf.mask,
                episode_ids=buf.episode_ids,
                timesteps=buf.timesteps,
            )
        return res

    # -- priorities, deletes, removal ------------------------------------------------------
    def check_keys(self, name, seqs_by_shard: dict) -> None:
        """Raise UnknownKeyError if any seq was never issued (nothing applied)."""
        t = self.table(name)
        for i, seqs in seqs_by_shard.items():
            t.shards[int(i)].resolve(np.asarray(seqs, dtype=np.int64))

    def update(self, name, seqs_by_shard: dict, prios_by_shard: dict) -> int:
        self.check_keys(name, seqs_by_shard)
        t = self.table(name)
        return sum(
            t.shards[int(i)].update_priorities(np.asarray(seqs, np.int64), np.asarray(prios_by_shard[i], np.float64))
            for i, seqs in seqs_by_shard.items()
        )

    def delete(self, name, seqs_by_shard: dict) -> tuple[dict, int]:
        """Returns ({shard: deleted}, stale)."""
        self.check_keys(name, seqs_by_shard)
        t = self.table(name)
        d, st = {}, 0
        for i, seqs in seqs_by_shard.items():
            a, b = t.shards[int(i)].delete(np.asarray(seqs, np.int64))
            d[int(i)] = a
            st += b
        return d, st

    def remover_candidates(self, name, n) -> dict:
        t = self.table(name)
        return {i: s.remover_candidates(n) for i, s in t.shards.items() if isinstance(s.remover, OrderedSelector)}

    def remove(self, name, counts: dict | None = None, slots: dict | None = None, seed=None) -> dict:
        """Evict by the remover; returns {shard: removed}."""
        rng = np.random.default_rng(seed)
        t = self.table(name)
        k = {}
        if slots is not None:
            for i, sl in slots.items():
                sl = np.unique(np.asarray(sl, dtype=np.int64))
                if len(sl):
                    k[int(i)] = t.shards[int(i)].remove_by_remover(len(sl), rng, slots=sl)
        else:
            for i, c in counts.items():
                if c:
                    k[int(i)] = t.shards[int(i)].remove_by_remover(int(c), rng)
        return k

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

        loaded = {int(i): ck.read_shard_file(Path(directory), e["file"], e["sha256"]) for i, e in files.items()}
        with self.lock:
            old = self.tables.get(name)
            have = set(old.shards) if old is not None else set()
            ids = sorted(have | set(loaded))
            t = HostedTable(name, config, ids, tier)
            for i in ids:
                if i in loaded:
                    ck.restore_shard(t.shards[i], loaded[i], files[i]["meta"])
                else:  # keep shards this worker already hosts
                    t.local.shards[t.local.shards.index(t.shards[i])] = old.shards[i]
                    t.shards[i] = old.shards[i]
            self.tables[name] = t
        return {i: t.shards[i].size for i in loaded}

    def info(self, name) -> list[dict]:
        return [{**s.info(), "longest_episode": s.longest_episode()} for s in self.table(name).shards.values()]

    def nbytes(self, name) -> dict:
        parts = [s.nbytes() for s in self.table(name).shards.values()]
        return {k: sum(p[k] for p in parts) for k in ("data", "overhead")}
