"""The sampling side of a worker's host: answers to the planner's requests over local shards.

A ``Draw`` uses each shard's mass at the draw (the probability reported is the
probability of the draw made); a ``Take`` checks that the chosen items are
still there (:class:`StaleSelectionError` otherwise, and the caller retries).
A sample over several workers of a table whose samples change the table
(expiry, epochs) gathers first (``record=False``) and is committed or undone by
:meth:`SamplingHost.finish_sample`, so an abandoned attempt changes nothing.
"""

from __future__ import annotations

import numpy as np

from ..errors import GearFlowError
from ..sample import SampleBuffers
from ..table import planner
from ..table.executor import InProcess, sample_shards, summary
from ..table.validate import check_sample_args


class StaleSelectionError(GearFlowError):
    """Items chosen in an earlier phase of a sample were removed before the gather (retry)."""


def release(locks):
    for lk in reversed(locks):
        lk.release()


class SamplingHost:
    """Sampling methods of :class:`~gear_flow.distributed.host.ShardHost` (needs ``self.table(name)``)."""

    # -- selection ----------------------------------------------------------------------
    def summaries(self, name, kinds, length=1, boundary="pad_tail") -> dict:
        t = self.table(name)
        return {k: {i: summary(s, k, length, boundary) for i, s in t.shards.items()} for k in kinds}

    def new_epoch(self, name) -> None:
        for s in self.table(name).shards.values():
            s.new_epoch()

    def candidates(self, name, n, role="sampler", length=1, boundary="pad_tail", horizon=None) -> dict:
        ex = InProcess(self.table(name).shards, None, None, length, boundary, horizon=horizon)
        return ex(planner.Candidates(int(n), role))

    def sample_part(
        self,
        name,
        length,
        boundary,
        columns,
        seed,
        counts: dict | None = None,
        scale: dict | None = None,
        slots: dict | None = None,
        txn: str | None = None,
        record: bool = True,
        out: dict | None = None,
        offsets: dict | None = None,
    ) -> dict:
        """Draw ``counts[shard]`` items (mass at the draw; probability ``scale[shard] * w / m'``)
        or take exactly ``slots[shard]``, and gather their windows.

        Returns per shard: ``data`` (unless ``out`` receives the rows at
        ``offsets[shard]``), ``seqs``, ``p``, ``episode_ids``, ``timesteps``,
        ``dst_offset``, ``n_valid`` and ``expired``.  ``record=False``: nothing
        changes until :meth:`finish_sample` commits (``txn`` names the sample).
        """
        t = self.table(name)
        rng = np.random.default_rng(seed)
        part = counts if slots is None else slots
        ids = sorted(int(i) for i in part)
        for i in ids:
            t.shard(i)
        res = {}
        drawn = []
        locks = t.locked(ids)
        try:
            for i in ids:
                s = t.shards[i]
                if slots is None:
                    c = int(counts[i])
                    if c <= 0:
                        continue
                    try:
                        sl, q = s.draw(c, length, boundary, rng)
                    except GearFlowError as e:  # emptied since the plan was made
                        raise StaleSelectionError(f"shard {i}: {e}") from None
                    p = q * float(scale[i])
                else:
                    sl = np.asarray(slots[i], dtype=np.int64)
                    if np.any((sl < 0) | (sl >= s.capacity)) or not s.active[sl].all():
                        raise StaleSelectionError(f"shard {i}: a chosen item was removed before the gather")
                    p = np.ones(len(sl))
                drawn.append((i, sl))
                n = len(sl)
                if out is None:
                    buf = {c: np.empty((n, length, max(t.spec.column(c).nbytes, 1)), dtype=np.uint8) for c in columns}
                    off = 0
                else:
                    buf, off = out, offsets[i]
                before = s.counters.expired
                win = s.take(sl, length, boundary, rng, buf, off, columns, record=record)
                r = {
                    "seqs": win.seqs,
                    "p": p,
                    "episode_ids": win.episode_ids,
                    "timesteps": win.timesteps,
                    "dst_offset": win.dst_offset,
                    "n_valid": win.n_valid,
                    "expired": s.counters.expired - before,
                }
                if out is None:
                    r["data"] = buf
                res[i] = r
            if not record:
                with t.lock:
                    t.pending.setdefault(txn, []).extend((i, sl, res[i]["seqs"], slots is None) for i, sl in drawn)
        except BaseException:
            for i, sl in drawn:  # undo the epoch bookkeeping of draws that will not be handed out
                if slots is None:
                    t.shards[i].unconsume(sl, t.shards[i].slot_seqs(sl))
                if record:
                    t.shards[i].uncount(len(sl))
            raise
        finally:
            release(locks)
        return res

    def finish_sample(self, name, txn: str, commit: bool) -> dict:
        """Commit (count, expire) or undo (epoch bookkeeping) a sample gathered with ``record=False``.

        Returns ``{shard: items expired}`` on commit, ``{shard: items undone}``
        otherwise; empty when ``txn`` is unknown here.
        """
        t = self.tables.get(name)
        if t is None:
            return {}
        with t.lock:
            parts = t.pending.pop(txn, None) or []
        out = {}
        for i, sl, seqs, drawn in parts:
            s = t.shards[i]
            if commit:
                k = s.record_samples(sl, seqs)
                if k:
                    out[i] = out.get(i, 0) + k
            else:
                if drawn:
                    s.unconsume(sl, seqs)
                out[i] = out.get(i, 0) + len(sl)
        return out

    def uncount(self, name, counts: dict) -> None:
        """Forget samples counted by parts of a sample that was retried (tables without expiry)."""
        t = self.table(name)
        for i, n in counts.items():
            t.shard(i).uncount(int(n))

    def sample_all(
        self, name, n, length, boundary, columns, seed, horizon=None, out: SampleBuffers | None = None
    ) -> dict:
        """The whole two-level sample over this worker's shards (when they are all the live ones)."""
        t = self.table(name)
        check_sample_args(n, length, boundary)
        buf = SampleBuffers(t.spec, columns, n, length) if out is None else out
        locks = t.locked()
        try:
            expired = sample_shards(
                t.shards,
                t.cfg.selection,
                buf,
                n,
                length,
                boundary,
                tuple(columns),
                np.random.default_rng(seed),
                t.cfg.beta,
                f"table {name!r}",
                horizon,
            )
        finally:
            release(locks)
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
