"""The worker's sampling: answers to the planner's draws and takes over local shards, and their two-phase finish.

A ``Draw`` uses each shard's mass at the draw (the probability reported is the
probability of the draw made); a ``Take`` checks that the chosen items are
still there (:class:`StaleSelectionError` otherwise, and the caller retries).
A sample over several workers of a table whose samples change the table
(expiry, epochs) gathers first (``record=False``) and is committed or undone by
:meth:`HostSampler.finish_sample`, so an abandoned attempt changes nothing.
The planner's questions that gather nothing (``Summaries``, ``Candidates``,
``NewEpoch``) are answered by
:class:`~gear_flow.distributed.host_selection.HostSelection`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import backend
from ..errors import CapacityError, EmptyTableError, GearFlowError, ProtocolError
from ..ops.seeds import generator
from ..sample import SampleBuffers
from ..shard import Shard
from ..table.executor import sample_shards
from ..table.planner import ShortOfItems, short_not_empty
from ..table.validate import check_sample_args

if TYPE_CHECKING:
    from ..spec import TableSpec
    from .host_edits import HostEditor
    from .host_tables import HostedTable, HostedTables


class StaleSelectionError(GearFlowError):
    """Items chosen in an earlier phase of a sample were removed before the gather (retry)."""


class ShortBatchError(StaleSelectionError):
    """The items left may go fewer times than the batch has rows (``max_times_sampled``; a queue's items
    deleted or lost since its grant): nothing was taken, and the caller gives the admission back and waits
    for items to arrive (:class:`~gear_flow.table.planner.ShortOfItems` of a worker's one-call sample)."""


def release(locks: Sequence[threading.Lock | threading.RLock]) -> None:
    """Release ``locks`` in reverse order (they were taken in shard order).

    Parameters
    ----------
    locks : sequence of locks
        What :meth:`HostedTable.locked` returned.
    """
    for lk in reversed(locks):
        lk.release()


def check_columns(spec: TableSpec, columns: Sequence[str], op: str) -> tuple[str, ...]:
    """The requested columns as a tuple, or a ProtocolError.

    Parameters
    ----------
    spec : TableSpec
        The table's spec.
    columns : sequence of str
        Requested column names.
    op : str
        The worker operation, for the message.

    Returns
    -------
    tuple of str
        ``columns``, in the order given.

    Raises
    ------
    ProtocolError
        Empty, duplicated, or naming a column the spec lacks.
    """
    unknown = [c for c in columns if c not in spec.names]
    if unknown or not columns or len(set(columns)) != len(columns):
        raise ProtocolError(f"worker {op!r}: columns {list(columns)} must be distinct columns of {list(spec.names)}")
    return tuple(columns)


def check_out(
    spec: TableSpec,
    out: Mapping[str, Any],
    offsets: Mapping[int, int] | None,
    sizes: dict[int, int],
    columns: Sequence[str],
    length: int,
    op: str,
    tier: str = "host",
) -> None:
    """Check a co-located caller's output buffers before anything is gathered into them.

    ``out[c]`` must hold every part's rows at its offset: ``uint8[rows,
    length, row bytes]``, in the memory the ``tier``'s gathers write (device
    memory for the GPU tiers).

    Parameters
    ----------
    spec : TableSpec
        The table's spec (row bytes of each column).
    out : mapping of str to array
        ``{column: uint8 [rows, length, row bytes]}``, NumPy or CuPy.
    offsets : mapping of int to int or None
        First row of each shard's part in ``out``.
    sizes : dict of int to int
        Rows of each shard's part.
    columns : sequence of str
        Columns gathered.
    length : int
        Window length, in steps.
    op : str
        The worker operation, for the message.
    tier : str, default "host"
        The table's storage tier (decides host or device memory).

    Raises
    ------
    ProtocolError
        A missing offset, a buffer of the wrong dtype, shape, contiguity or
        memory, or a part that does not fit at its offset.
    """
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


@dataclass(frozen=True)
class PartRequest:
    """One ``sample_part`` request, checked against its table: which items each shard gives, and where
    their windows go.

    Parameters
    ----------
    length : int
        Window length, in steps.
    boundary : str
        Boundary mode.
    columns : tuple of str
        Columns to gather.
    ids : tuple of int
        The part's shards, ascending (their locks are taken in this order).
    counts : dict or None
        Items to draw per shard (a draw); None for a take.
    scale : dict or None
        First-level probability of each counted shard.
    slots : dict or None
        Exact slots per shard (a take); None for a draw.
    txn : str or None
        The sample's transaction.
    record : bool
        Count samples now; False: at :meth:`HostSampler.finish_sample`.
    out : dict or None
        A co-located caller's buffers.
    offsets : dict or None
        First row of each shard's part in ``out``.
    geometry : bool
        Gather nothing; report where the windows are.
    by_count : bool
        The plan weighed shards by valid count.
    horizon : int or None
        A take's: the stamp its candidates were chosen below.
    seqs : dict or None
        A take's: the sequence number each slot must still hold.

    Examples
    --------
    >>> from gear_flow import ColumnSpec, TableSpec
    >>> from gear_flow.distributed.host_tables import HostedTable
    >>> from gear_flow.table.config import TableConfig
    >>> t = HostedTable("t", TableConfig.build(TableSpec((ColumnSpec("x", ()),), capacity=8)), [0])
    >>> req = PartRequest.checked(t, 1, "pad_tail", ["x"], {0: 2}, {0: 1.0}, None, None, True)
    >>> req.ids, req.draws
    ((0,), True)
    """

    length: int
    boundary: str
    columns: tuple[str, ...]
    ids: tuple[int, ...]
    counts: dict | None
    scale: dict | None
    slots: dict | None
    txn: str | None
    record: bool
    out: dict | None
    offsets: dict | None
    geometry: bool
    by_count: bool
    horizon: int | None
    seqs: dict | None

    @classmethod
    def checked(
        cls,
        t: HostedTable,
        length: int,
        boundary: str,
        columns: Sequence[str],
        counts: dict | None = None,
        scale: dict | None = None,
        slots: dict | None = None,
        txn: str | None = None,
        record: bool | None = True,
        out: dict | None = None,
        offsets: dict | None = None,
        geometry: bool | None = None,
        by_count: bool | None = None,
        horizon: int | None = None,
        seqs: dict | None = None,
    ) -> PartRequest:
        """The request, once its arguments agree with each other and with table ``t``.

        Parameters
        ----------
        t : HostedTable
            The table sampled.
        length, boundary, columns, counts, scale, slots, txn, record, out, offsets, geometry, by_count, horizon, seqs
            As :meth:`HostSampler.sample_part` takes them.

        Returns
        -------
        PartRequest
            The checked request.

        Raises
        ------
        ProtocolError
            As :meth:`HostSampler.sample_part` raises it.
        SpecError
            A shard of the part is not here, or ``length`` is longer than a
            shard holds.
        """
        name = t.name
        check_sample_args(1, length, boundary, t.spec.capacity)  # (as the public sample: no window past a shard)
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
        ids = tuple(sorted(int(i) for i in part))
        for i in ids:
            t.shard(i)
        if out is not None:
            sizes = {i: int(counts[i]) if slots is None else len(slots[i]) for i in ids}
            check_out(t.spec, out, offsets, sizes, columns, length, "sample_part", t.tier)
        return cls(
            length=length, boundary=boundary, columns=columns, ids=ids, counts=counts, scale=scale, slots=slots,
            txn=txn, record=record, out=out, offsets=offsets, geometry=bool(geometry), by_count=bool(by_count),
            horizon=horizon, seqs=seqs,
        )  # fmt: skip

    @property
    def draws(self) -> bool:
        """Whether the part draws by ``counts`` (else it takes ``slots``)."""
        return self.slots is None


def _serve_part(t: HostedTable, req: PartRequest, rng: np.random.Generator) -> dict:
    """Choose and gather each shard's items under the part's shard locks; undo every draw if one fails."""
    res: dict = {}
    drawn: list[tuple[int, np.ndarray]] = []
    locks = t.locked(req.ids)
    try:
        for i in req.ids:
            s = t.shards[i]
            chosen = _choose(t, s, i, req, rng)
            if chosen is None:
                continue
            sl, p = chosen
            drawn.append((i, sl))
            res[i] = _gather(t, s, sl, p, req, rng, *_buffers(t, s, i, len(sl), req))
        if not req.record:
            t.txns.add_pending(req.txn, [(i, sl, res[i]["seqs"], req.draws) for i, sl in drawn])
    except BaseException:
        _undo(t, drawn, req)
        raise
    finally:
        release(locks)
    return res


def _finish_parts(t: HostedTable, parts: list, commit: bool) -> dict[int, int]:
    """Commit or undo a sample's pending ``parts``; ``{shard: items expired}`` or ``{shard: items undone}``."""
    out: dict[int, int] = {}
    for i, sl, seqs, drawn in parts:
        s = i if isinstance(i, Shard) else t.shards[i]  # a copy replaced since the draw: finished on it
        i = s.shard_id
        if commit:
            k = s.record_samples(sl, seqs)
            if k:
                out[i] = out.get(i, 0) + k
        else:
            if drawn:
                s.unconsume(sl, seqs)
            out[i] = out.get(i, 0) + len(sl)
    return out


def _choose(
    t: HostedTable, s: Shard, i: int, req: PartRequest, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray] | None:
    """Shard ``i``'s slots and their probabilities: drawn at the shard's mass now, or taken as they were
    chosen if still there; None when it draws nothing."""
    if req.draws:
        c = int(req.counts[i])
        if c <= 0:
            return None
        mass = s.valid_mass(req.length, req.boundary) if t.cfg.selection == "weighted" else None
        if mass is not None and not mass > 0 and not req.by_count:
            raise StaleSelectionError(f"shard {i}: no weight left since the plan")
        try:
            sl, q = s.draw(c, req.length, req.boundary, rng, mass=mass)
        except GearFlowError as e:  # emptied since the plan was made
            raise StaleSelectionError(f"shard {i}: {e}") from None
        return sl, q * float(req.scale[i])
    sl = np.asarray(req.slots[i], dtype=np.int64)
    if np.any((sl < 0) | (sl >= s.capacity)) or not s.active[sl].all():
        raise StaleSelectionError(f"shard {i}: a chosen item was removed before the gather")
    # every item stamped below the horizon was in place before the candidates were listed, and a slot is
    # taken over only by an insert (stamped at or above it): such an item is the candidate
    if req.horizon is not None and np.any(s.item_stamps(sl) >= req.horizon):
        raise StaleSelectionError(f"shard {i}: a chosen item was overwritten before the gather")
    if req.seqs is not None and not np.array_equal(s.slot_seqs(sl), np.asarray(req.seqs.get(i, ()))):
        raise StaleSelectionError(f"shard {i}: a drawn item was written over before the gather")
    return sl, np.ones(len(sl))


def _buffers(t: HostedTable, s: Shard, i: int, n: int, req: PartRequest) -> tuple[dict | None, int]:
    """Where shard ``i``'s ``n`` windows go, and at which row: nowhere (geometry), new buffers, or the caller's."""
    if req.geometry:
        return None, 0
    if req.out is None:  # device buffers on the GPU tiers: they travel as CUDA frames (UCX) or via host (TCP)
        return {c: s.tier.empty_output((n, req.length, max(t.spec.column(c).nbytes, 1))) for c in req.columns}, 0
    return req.out, req.offsets[i]


def _gather(
    t: HostedTable,
    s: Shard,
    sl: np.ndarray,
    p: np.ndarray,
    req: PartRequest,
    rng: np.random.Generator,
    buf: dict | None,
    off: int,
) -> dict:
    """Gather the windows of slots ``sl`` into ``buf`` at row ``off``, counting them unless the sample is
    two-phase; the shard's answer."""
    before = s.counters.expired
    prio = s.priority[sl].copy()  # Reverb's SampleInfo: the priority when sampled
    times = s.sample_counts(sl)  # times sampled including this draw (a two-phase sample records it at the commit)
    win = s.take(sl, req.length, req.boundary, rng, buf, off, req.columns, record=req.record, gather=not req.geometry)
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
    if req.draws:  # the shard's mass now, for the sampler's next plan (no extra round trip)
        r["mass"] = (
            s.unseen(req.length, req.boundary) if t.cfg.selection == "epoch" else s.valid_mass(req.length, req.boundary)
        )
    if req.geometry:
        r["src_abs"] = win.src_abs
    elif req.out is None:
        r["data"] = buf
    return r


def _undo(t: HostedTable, drawn: list[tuple[int, np.ndarray]], req: PartRequest) -> None:
    """Undo the epoch bookkeeping and the counts of draws that will not be handed out."""
    for i, sl in drawn:
        if req.draws:
            t.shards[i].unconsume(sl, t.shards[i].slot_seqs(sl))
        if req.record:
            t.shards[i].uncount(len(sl))


#: bytes a reply holds per window besides its columns: seqs, probabilities, episode ids, timesteps, offsets,
#: valid steps, priorities and times sampled, a word each
_ROW_BYTES = 64
#: a reply this small is not weighed against the worker's memory: that reads the process's size (~12 us, more
#: than a small part's draw), and a worker that cannot find this much is at its end whatever it serves
_SMALL_REPLY = 64 << 20


class HostSampler:
    """Samples of the tables a worker hosts: draws, takes and gathers, and the finish of two-phase ones.

    Parameters
    ----------
    tables : HostedTables
        The worker's hosted tables.
    editor : HostEditor
        Applies the priority updates that ride on a sample request.
    room : callable, optional
        ``room()``: the bytes a reply's batch may still take in this process
        (the worker's: :func:`gear_flow.distributed.plugin.reply_room`); by
        default no bound.

    Examples
    --------
    >>> from gear_flow.distributed.host_edits import HostEditor
    >>> from gear_flow.distributed.host_tables import HostedTables
    >>> tables = HostedTables()
    >>> HostSampler(tables, HostEditor(tables)).finish_sample("t", "txn", commit=True)
    {}
    """

    def __init__(self, tables: HostedTables, editor: HostEditor, room: Callable[[], float] | None = None) -> None:
        self.tables = tables
        self.editor = editor
        self.room = room

    def _fits(self, t: HostedTable, rows: int, length: int, columns: Sequence[str]) -> None:
        """Refuse, before anything is drawn, a reply whose batch would not fit this process: a batch past the
        worker's memory had its nanny kill it, and the shards it held were lost."""
        need = rows * (length * t.spec.batch_step_nbytes(columns) + _ROW_BYTES)
        if self.room is None or need <= _SMALL_REPLY:
            return
        room = self.room()
        if need > room:
            raise CapacityError(
                f"a batch part of {rows} windows x {length} steps ({need / 2**20:.1f} MiB) does not fit this "
                f"worker's memory ({max(room, 0.0) / 2**20:.1f} MiB left for a reply): sample smaller batches"
            )

    def sequences(self, name: str, n: int, length: int, boundary: str, seed: int, by_count: bool = False) -> dict:
        """Each of this worker's shards' own item-by-item draws (:meth:`gear_flow.shard.Shard.draw_sequence`),
        recording nothing: the first phase of a weighted table's sample with ``max_times_sampled``.

        Parameters
        ----------
        name : str
            The table.
        n : int
            Draws per shard at most.
        length : int
            Window length, in steps.
        boundary : str
            Boundary mode.
        seed : int
            Seeds the draws' generator.
        by_count : bool, default False
            The plan found no weight anywhere: only uniform draws over the
            items whose window fits.

        Returns
        -------
        dict
            ``{shard: (slots, probs, masses, seqs, slots0, probs0, counts0,
            seqs0)}``: the draws by weight, then the uniform ones over the
            items of weight 0 (:class:`~gear_flow.table.planner.Sequences`).

        Raises
        ------
        ProtocolError
            The table's sample plan is not sequential (a weighted sampler with
            ``max_times_sampled``).
        StaleSelectionError
            ``by_count``, and a shard has weight again since the plan.
        """
        t = self.tables.table(name)
        if t.cfg.plan != "sequential":
            raise ProtocolError(f"worker 'sequences': table {name!r} samples by {t.cfg.plan!r}, not item by item")
        rng = generator(seed)
        locks = t.locked()
        try:
            if by_count and any(s.valid_mass(length, boundary) > 0 for s in t.shards.values()):
                raise StaleSelectionError("a shard has weight again since the plan found none")
            return {
                i: s.draw_sequence(int(n), length, boundary, rng, bool(by_count)) for i, s in sorted(t.shards.items())
            }
        finally:
            release(locks)

    def sample_part(
        self,
        name: str,
        length: int,
        boundary: str,
        columns: Sequence[str],
        seed: int,
        counts: dict | None = None,
        scale: dict | None = None,
        slots: dict | None = None,
        txn: str | None = None,
        record: bool = True,
        out: dict | None = None,
        offsets: dict | None = None,
        geometry: bool | None = None,
        updates: dict | None = None,
        by_count: bool | None = None,
        horizon: int | None = None,
        seqs: dict | None = None,
    ) -> dict:
        """Draw ``counts[shard]`` items or take exactly ``slots[shard]``, and gather their windows.

        A draw uses the shard's mass at the draw: the probability reported is
        ``scale[shard] * w / m'``.  Taken slots report probability 1.

        Parameters
        ----------
        name : str
            The table.
        length : int
            Window length, in steps.
        boundary : str
            Boundary mode.
        columns : sequence of str
            Columns to gather.
        seed : int
            Seeds the draw's generator.
        counts : dict of int to int, optional
            Items to draw per shard (weighted and epoch selection).
        scale : dict of int to float, optional
            First-level probability of each counted shard; required with
            ``counts``.
        slots : dict of int to array, optional
            Exact slots per shard (ordered selection).  Give exactly one of
            ``counts`` and ``slots``.
        txn : str, optional
            The sample's transaction; required when ``record`` is False.
        record : bool, default True
            Count samples (and expire) now; False: nothing changes until
            :meth:`finish_sample` commits ``txn``.
        out : dict of str to array, optional
            A co-located caller's ``uint8`` batch buffers: rows go there at
            ``offsets[shard]`` (see :func:`check_out`).
        offsets : dict of int to int, optional
            First row of each shard's part in ``out``.
        geometry : bool, optional
            Gather nothing; return ``src_abs`` (absolute ring position of
            each window's first step) for a reader that maps the shared rings.
        updates : dict, optional
            Priority updates riding on this request (the fields of
            :meth:`HostEditor.update`): applied before the draw, their result
            returned under ``"updated"``.
        by_count : bool, optional
            The plan weighed shards by valid count (no item had weight):
            shards draw uniformly.  Otherwise a weighted shard without
            weight at the draw (zeroed since the plan) is a stale selection.
        horizon : int, optional
            A take's: the stamp its candidates were chosen below.  A taken
            slot whose item is stamped at or above it holds an item inserted
            since (the candidate was overwritten): a stale selection.
        seqs : dict of int to array, optional
            A take's: the sequence number each slot must still hold (a
            sequential draw's items); another item there is a stale selection.

        Returns
        -------
        dict
            Per shard: ``seqs``, ``p`` (float64 probabilities), ``episode_ids``,
            ``timesteps``, ``dst_offset``, ``n_valid``, ``expired`` (items
            expired by this part), ``priorities`` (at the draw),
            ``times_sampled`` (this draw included; None when not counted);
            ``mass`` (the shard's mass after a draw); ``data`` (``{column:
            uint8 [n, length, row bytes]}``) unless ``out`` or ``geometry``;
            ``src_abs`` with ``geometry``.

        Raises
        ------
        ProtocolError
            Inconsistent arguments (both or neither of counts and slots,
            counts on an ordered table, ``scale`` missing a shard,
            ``record=False`` without ``txn``, bad columns or ``out``).
        CapacityError
            The windows, gathered here, would not fit this worker's memory
            (nothing drawn).
        StaleSelectionError
            A shard emptied since the plan, or a chosen slot was removed:
            the caller retries.
        """
        t = self.tables.table(name)
        rng = generator(seed)
        req = PartRequest.checked(
            t,
            length,
            boundary,
            columns,
            counts,
            scale,
            slots,
            txn,
            record,
            out,
            offsets,
            geometry,
            by_count,
            horizon,
            seqs,
        )
        if req.out is None and not req.geometry:  # (the caller's buffers, or no gather: nothing made here)
            rows = sum(int(c) for c in req.counts.values()) if req.counts is not None else 0
            rows += sum(len(x) for x in req.slots.values()) if req.slots is not None else 0
            self._fits(t, rows, req.length, req.columns)
        updated = self._ride_along(name, updates)
        res = {} if updated is None else {"updated": updated}
        res.update(_serve_part(t, req, rng))
        return res

    def _ride_along(self, name: str, updates: dict | None) -> dict | None:
        """Apply priority updates that came with a sample request (``update_priorities(wait=False)``):
        before the draw, all or nothing; returns ``update``'s result (stale count, masses)."""
        if not updates:
            return None
        return self.editor.update(
            name, updates["seqs_by_shard"], updates["prios_by_shard"], masses=updates.get("masses") or []
        )

    def finish_sample(self, name: str, txn: str, commit: bool) -> dict[int, int]:
        """Commit (count, expire) or undo (epoch bookkeeping) a sample gathered with ``record=False``.

        Parameters
        ----------
        name : str
            The table (an unknown one: nothing to do).
        txn : str
            The sample's transaction id.
        commit : bool
            True: count the samples and expire what reached
            ``max_times_sampled``; False: give the draws back.

        Returns
        -------
        dict of int to int
            ``{shard: items expired}`` on commit, ``{shard: items undone}``
            otherwise; empty when ``txn`` is unknown here.  A finish sent
            again (its reply lost) returns the first one's result and changes
            nothing.
        """
        t = self.tables.get(name)
        if t is None:
            return {}
        parts, done = t.txns.take_pending(txn, commit)
        if parts is None:
            return done
        out: dict | None = None
        try:
            out = _finish_parts(t, parts, commit)
        finally:  # its items are released to the deletes waiting for them, applied or not
            t.txns.finished(txn, commit, out)
        return out

    def uncount(self, name: str, counts: dict[int, int]) -> None:
        """Forget samples counted by parts of a sample that was retried (tables without expiry).

        Parameters
        ----------
        name : str
            The table.
        counts : dict of int to int
            ``{shard: samples to forget}``.

        Raises
        ------
        ProtocolError
            A shard has counted fewer samples than that (nothing changed).
        """
        t = self.tables.table(name)
        for i, n in counts.items():
            if int(n) > t.shard(i).counters.sampled:
                raise ProtocolError(f"worker 'uncount': shard {i} has counted fewer than {n} samples")
        for i, n in counts.items():
            t.shard(i).uncount(int(n))

    def count_drawn(self, name: str, counts: dict[int, int]) -> None:
        """Count samples that readers on this host drew from the shards' published states themselves
        (:mod:`~gear_flow.distributed.reader_draw`); shards no longer here are skipped (their counts left
        with them).

        Parameters
        ----------
        name : str
            The table.
        counts : dict of int to int
            ``{shard: samples drawn}``.
        """
        t = self.tables.table(name)
        for i, n in counts.items():
            if int(i) in t.shards:
                t.shards[int(i)].count_drawn(int(n))

    def sample_all(
        self,
        name: str,
        n: int,
        length: int,
        boundary: str,
        columns: Sequence[str],
        seed: int,
        horizon: int | None = None,
        out: SampleBuffers | None = None,
        updates: dict | None = None,
    ) -> dict:
        """The whole two-level sample over this worker's shards (when they are all the live ones).

        Parameters
        ----------
        name : str
            The table.
        n : int
            Batch size.
        length : int
            Window length, in steps.
        boundary : str
            Boundary mode.
        columns : sequence of str
            Columns to gather.
        seed : int
            Seeds the sample's generator.
        horizon : int, optional
            Ordered selection: only items stamped before it.
        out : SampleBuffers, optional
            A co-located caller's buffers, filled in place.
        updates : dict, optional
            Priority updates riding on this request, applied before the
            draw (as in :meth:`sample_part`).

        Returns
        -------
        dict
            ``expired`` (``{shard: items expired}``); ``updated`` with
            ``updates``; without ``out`` also
            the batch's ``data`` (``{column: uint8 [n, length, row bytes]}``),
            ``keys``, ``probabilities``, ``weights``, ``mask``,
            ``episode_ids``, ``timesteps``, ``priorities``,
            ``times_sampled``.

        Raises
        ------
        SpecError
            Invalid ``n``, ``length`` or ``boundary``.
        ProtocolError
            Bad ``columns`` or ``out``.
        CapacityError
            The batch, gathered here, would not fit this worker's memory
            (nothing drawn).
        EmptyTableError
            Nothing can be sampled from the items stored.
        ShortBatchError
            The items left may go fewer than ``n`` times (``max_times_sampled``;
            a queue's below ``horizon``), or a delete took every item since the
            admission: nothing taken, the admission is given back and waits for
            items to arrive.
        """
        t = self.tables.table(name)
        check_sample_args(n, length, boundary, t.spec.capacity)
        columns = check_columns(t.spec, columns, "sample_all")
        if out is not None and not (isinstance(out, SampleBuffers) and out.matches(columns, n, length, t.tier, t.spec)):
            raise ProtocolError(
                f"worker 'sample_all': out must be SampleBuffers for these columns, n and length, in "
                f"{'device' if backend.output_on_device(t.tier) else 'host'} memory for a {t.tier!r} table"
            )
        if out is None:  # the reply's buffers: large ones come back to a pool once sent (no fresh pages)
            self._fits(t, n, length, columns)
            shard = next(iter(t.shards.values()), None)  # (none here: the draw below says so)
            empty = None if shard is None else shard.tier.empty_output
            buf = SampleBuffers(t.spec, columns, n, length, tier=t.tier, empty=empty)
        else:
            buf = out
        updated = self._ride_along(name, updates)
        locks = t.locked()
        try:
            expired = sample_shards(
                t.shards,
                t.cfg.plan,
                buf,
                n,
                length,
                boundary,
                tuple(columns),
                generator(seed),
                t.cfg.beta,
                f"table {name!r}",
                horizon,
            )
        except ShortOfItems as e:
            raise ShortBatchError(f"table {name!r}: the items left may go {e.have} times, for a batch of {n}") from None
        except EmptyTableError:
            if not short_not_empty(sum(s.size for s in t.shards.values()), length, boundary):
                raise
            raise ShortBatchError(
                f"table {name!r}: the items it was admitted for are gone, for a batch of {n}"
            ) from None
        finally:
            release(locks)
        res = {"expired": expired}
        if updated is not None:
            res["updated"] = updated
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
