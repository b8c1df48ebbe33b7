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

from .. import backend
from ..errors import GearFlowError, ProtocolError
from ..sample import SampleBuffers
from ..table import planner
from ..table.executor import InProcess, sample_shards, summary
from ..table.validate import check_sample_args


class StaleSelectionError(GearFlowError):
    """Items chosen in an earlier phase of a sample were removed before the gather (retry)."""


def release(locks):
    for lk in reversed(locks):
        lk.release()


def check_columns(spec, columns, op: str) -> tuple:
    unknown = [c for c in columns if c not in spec.names]
    if unknown or not columns or len(set(columns)) != len(columns):
        raise ProtocolError(f"worker {op!r}: columns {list(columns)} must be distinct columns of {list(spec.names)}")
    return tuple(columns)


def check_out(spec, out, offsets, sizes: dict, columns, length: int, op: str, tier: str = "host") -> None:
    """``out[c]`` must hold every part's rows at its offset: ``uint8[rows, length, row bytes]``,
    in the memory the ``tier``'s gathers write (device memory for the GPU tiers)."""
    if offsets is None or not set(sizes) <= set(offsets):
        raise ProtocolError(f"worker {op!r}: out needs an offset for every part (shards {sorted(sizes)})")
    for c in columns:
        a = out.get(c) if hasattr(out, "get") else None
        nb = max(spec.column(c).nbytes, 1)
        dev = backend.is_device_array(a)  # a co-located learner's device batch (GPU tiers)
        if not (isinstance(a, np.ndarray) or dev) or a.dtype != np.uint8 or a.ndim != 3 or a.shape[1:] != (length, nb):
            raise ProtocolError(f"worker {op!r}: out[{c!r}] must be uint8[rows, {length}, {nb}]")
        if not a.flags.c_contiguous or not (dev or a.flags.writeable):
            raise ProtocolError(f"worker {op!r}: out[{c!r}] must be a writeable C-contiguous array")
        if dev != backend.output_on_device(tier):
            where = "device" if backend.output_on_device(tier) else "host"
            raise ProtocolError(f"worker {op!r}: out[{c!r}] must be in {where} memory for a {tier!r} table")
        for i, n in sizes.items():
            if not 0 <= int(offsets[i]) <= a.shape[0] - n:
                raise ProtocolError(
                    f"worker {op!r}: shard {i}'s {n} rows at offset {offsets[i]} do not fit out[{c!r}] "
                    f"of {a.shape[0]} rows"
                )


class SamplingHost:
    """Sampling methods of :class:`~gear_flow.distributed.host.ShardHost` (needs ``self.table(name)``)."""

    # -- selection ----------------------------------------------------------------------
    def summaries(self, name, kinds, length=None, boundary=None) -> dict:
        t = self.table(name)
        if ("sampler" in kinds or "unseen" in kinds) and t.cfg.selection == "ordered":
            raise ProtocolError(f"worker 'summaries': table {name!r} has an ordered sampler, no sampling mass")
        if "unseen" in kinds and t.cfg.selection != "epoch":
            raise ProtocolError(f"worker 'summaries': table {name!r} samples without epochs (no 'unseen')")
        length, boundary = length or 1, boundary or "pad_tail"
        return {k: {i: summary(s, k, length, boundary) for i, s in t.shards.items()} for k in kinds}

    def new_epoch(self, name) -> None:
        for s in self.table(name).shards.values():
            s.new_epoch()

    def candidates(self, name, n, role=None, length=None, boundary=None, horizon=None) -> dict:
        t = self.table(name)
        role = role or "sampler"
        sel = t.cfg.sampler if role == "sampler" else t.cfg.remover
        if not sel.deterministic:
            raise ProtocolError(f"worker 'candidates': the {role} of table {name!r} ({sel!r}) is not ordered")
        ex = InProcess(t.shards, None, None, length or 1, boundary or "pad_tail", horizon=horizon)
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
        geometry: bool | None = None,
    ) -> dict:
        """Draw ``counts[shard]`` items (mass at the draw; probability ``scale[shard] * w / m'``)
        or take exactly ``slots[shard]``, and gather their windows.

        Returns per shard: ``data`` (unless ``out`` receives the rows at
        ``offsets[shard]``), ``seqs``, ``p``, ``episode_ids``, ``timesteps``,
        ``dst_offset``, ``n_valid`` and ``expired``.  ``record=False``: nothing
        changes until :meth:`finish_sample` commits (``txn`` names the sample).
        ``geometry=True``: no data; ``src_abs`` (absolute ring position of each
        window's first step) instead, for a reader that maps the shared rings.
        """
        t = self.table(name)
        rng = np.random.default_rng(seed)
        columns = check_columns(t.spec, columns, "sample_part")
        record = True if record is None else bool(record)
        if slots is None and t.cfg.selection == "ordered":
            raise ProtocolError(f"worker 'sample_part': table {name!r} has an ordered sampler: give slots, not counts")
        if (counts is None) == (slots is None):
            raise ProtocolError("worker 'sample_part': give exactly one of counts and slots")
        if counts is not None and (scale is None or set(scale) != set(counts)):
            raise ProtocolError(
                "worker 'sample_part': scale must give the first-level probability of every counted shard"
            )
        if not record and txn is None:
            raise ProtocolError("worker 'sample_part': record=False needs the sample's txn")
        part = counts if slots is None else slots
        ids = sorted(int(i) for i in part)
        for i in ids:
            t.shard(i)
        if out is not None:
            sizes = {i: int(counts[i]) if slots is None else len(slots[i]) for i in ids}
            check_out(t.spec, out, offsets, sizes, columns, length, "sample_part", t.tier)
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
                if geometry:
                    buf, off = None, 0
                elif out is None:  # device buffers on the GPU tiers: they travel as CUDA frames (UCX) or via host (TCP)
                    buf = {c: s.tier.empty_output((n, length, max(t.spec.column(c).nbytes, 1))) for c in columns}
                    off = 0
                else:
                    buf, off = out, offsets[i]
                before = s.counters.expired
                prio = s.priority[sl].copy()  # Reverb's SampleInfo: the priority when sampled
                win = s.take(sl, length, boundary, rng, buf, off, columns, record=record, gather=not geometry)
                # times sampled including this draw (a two-phase sample records it at the commit)
                times = None if s.times_sampled is None else s.times_sampled[sl].astype(np.int64) + (not record)
                r = {
                    "seqs": win.seqs,
                    "p": p,
                    "episode_ids": win.episode_ids,
                    "timesteps": win.timesteps,
                    "dst_offset": win.dst_offset,
                    "n_valid": win.n_valid,
                    "expired": s.counters.expired - before,
                    "priorities": prio,
                    "times_sampled": times,
                }
                if slots is None:  # the shard's mass now, for the sampler's next plan (no extra round trip)
                    r["mass"] = (
                        s.unseen(length, boundary) if t.cfg.selection == "epoch" else s.valid_mass(length, boundary)
                    )
                if geometry:
                    r["src_abs"] = win.src_abs
                elif out is None:
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
            if int(n) > t.shard(i).counters.sampled:
                raise ProtocolError(f"worker 'uncount': shard {i} has counted fewer than {n} samples")
        for i, n in counts.items():
            t.shard(i).uncount(int(n))

    def sample_all(
        self, name, n, length, boundary, columns, seed, horizon=None, out: SampleBuffers | None = None
    ) -> dict:
        """The whole two-level sample over this worker's shards (when they are all the live ones)."""
        t = self.table(name)
        check_sample_args(n, length, boundary)
        columns = check_columns(t.spec, columns, "sample_all")
        if out is not None and not (isinstance(out, SampleBuffers) and out.matches(columns, n, length, t.tier)):
            raise ProtocolError(
                f"worker 'sample_all': out must be SampleBuffers for these columns, n and length, in "
                f"{'device' if backend.output_on_device(t.tier) else 'host'} memory for a {t.tier!r} table"
            )
        buf = SampleBuffers(t.spec, columns, n, length, tier=t.tier) if out is None else out
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
                priorities=buf.priorities,
                times_sampled=buf.times_sampled,
            )
        return res
