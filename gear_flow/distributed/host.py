"""The worker's shard host: one facade over the parts that serve the tables placed on a worker.

One :class:`ShardHost` lives in each worker (made by the worker plugin).  Its
methods take and return only NumPy arrays and plain Python values, so they
travel over Dask's comm as raw frames; they know nothing about Dask and are
tested without a cluster.  A co-located learner calls them in-process (no
copy).  Each method hands its request to the part that owns it, all of them
over one registry of :class:`~gear_flow.distributed.host_tables.HostedTable`:

- inserts (``stage``, ``apply``, ``write``, ``status``):
  :class:`~gear_flow.distributed.host_writes.HostWriter`, over each table's
  :class:`~gear_flow.distributed.host_transactions.TransactionMemory`;
- priority updates, deletes and removal (``check_keys``, ``update``,
  ``delete``, ``remove``): :class:`~gear_flow.distributed.host_edits.HostEditor`;
- checkpoints (``checkpoint``, ``restore``):
  :class:`~gear_flow.distributed.host_checkpoints.HostCheckpointer`;
- a disk table's files (``reopen``, ``flush_disk``):
  :class:`~gear_flow.distributed.host_disk.HostDisk`;
- the planner's questions that gather nothing (``summaries``, ``candidates``,
  ``new_epoch``): :class:`~gear_flow.distributed.host_selection.HostSelection`;
- samples (``sample_part``, ``sequences``, ``finish_sample``, ``uncount``,
  ``count_drawn``, ``sample_all``): :class:`~gear_flow.distributed.host_sampling.HostSampler`;
- moves of shards to another worker: :mod:`~gear_flow.distributed.host_moves`,
  through each table's :class:`~gear_flow.distributed.host_moves.MoveGate`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..sample import SampleBuffers
from ..shard import Shard
from . import host_moves
from .facade import documented_as
from .host_checkpoints import HostCheckpointer
from .host_disk import HostDisk
from .host_edits import HostEditor
from .host_moves import MoveGate
from .host_reader import HostReader
from .host_sampling import HostSampler, check_columns
from .host_selection import HostSelection
from .host_tables import HostedTable, HostedTables, shared_pinned
from .host_writes import HostWriter
from .operations import EPOCH_ARGUMENT, UNGATED, WORKER_OPS

__all__ = ["HostedTable", "ShardHost", "shared_pinned"]


class ShardHost:
    """All hosted tables of one worker and the parts that serve them; see the module docstring.

    Parameters
    ----------
    room : callable, optional
        ``room()``: the bytes a sample's reply may still take in this
        process (:class:`HostSampler`'s bound); by default none.

    Attributes
    ----------
    tables : HostedTables
        The tables with shards here, by name.
    writer : HostWriter
        Inserts.
    editor : HostEditor
        Priority updates, deletes and removal.
    checkpointer : HostCheckpointer
        Checkpoints and restores.
    disk : HostDisk
        Disk shards reopened in place, and flushed.
    selection : HostSelection
        Summaries, candidates and epochs.
    sampler : HostSampler
        Samples and their two-phase finish.

    Examples
    --------
    >>> from gear_flow import ColumnSpec, TableSpec
    >>> from gear_flow.table.config import TableConfig
    >>> host = ShardHost()
    >>> cfg = TableConfig.build(TableSpec((ColumnSpec("x", ()),), capacity=8, num_shards=2)).to_dict()
    >>> host.create("t", cfg, [0, 1])
    [0, 1]
    >>> host.drop("t")
    True
    """

    def __init__(self, room: Callable[[], float] | None = None) -> None:
        self.tables = HostedTables()
        self.writer = HostWriter(self.tables)
        self.editor = HostEditor(self.tables)
        self.checkpointer = HostCheckpointer(self.tables)
        self.disk = HostDisk(self.tables)
        self.selection = HostSelection(self.tables)
        self.sampler = HostSampler(self.tables, self.editor, room)
        #: this host's shards mapped from their published state, drawn for readers on other hosts
        self.reader = HostReader()

    # -- lifecycle ---------------------------------------------------------------------------
    @documented_as(HostedTables.create)
    def create(self, name: str, config: dict, shard_ids: Iterable[int], tier: str | None = None) -> list[int]:
        return self.tables.create(name, config, shard_ids, tier)

    @documented_as(HostedTables.drop)
    def drop(self, name: str) -> bool:
        return self.tables.drop(name)

    @documented_as(HostedTables.close_table)
    def close_table(self, name: str) -> bool:
        return self.tables.close_table(name)

    @documented_as(HostedTables.drop_shard)
    def drop_shard(self, name: str, shard: int, epoch: int) -> bool:
        return self.tables.drop_shard(name, shard, epoch)

    @documented_as(HostedTables.close)
    def close(self) -> None:
        self.tables.close()

    @documented_as(HostedTables.hosted)
    def hosted(self, name: str, config: dict) -> HostedTable:
        return self.tables.hosted(name, config)

    @documented_as(HostedTables.table)
    def table(self, name: str) -> HostedTable:
        return self.tables.table(name)

    def shard(self, name: str, shard_id: int) -> Shard:
        """Shard ``shard_id`` of table ``name``.

        Parameters
        ----------
        name : str
            The table's name.
        shard_id : int
            The shard's id.

        Returns
        -------
        Shard
            The hosted shard.

        Raises
        ------
        SpecError
            No such table or shard here.
        """
        return self.tables.table(name).shard(shard_id)

    # -- admission: the table's gate ---------------------------------------------------------
    def call(self, op: str, args: dict) -> Any:
        """Run operation ``op`` from a thread of this process (a co-located caller's), through the table's
        gate as the plugin runs the others: it waits while a move holds the table, and a request planned at
        an older placement than this worker's shards (``epoch``) is refused.

        Parameters
        ----------
        op : str
            A key of :data:`OPS`.
        args : dict
            Its arguments, with the request's ``epoch`` (optional).

        Returns
        -------
        object
            What the operation returned.

        Raises
        ------
        ShardMovedError
            The request's placement is older than this worker's shards.
        """
        args = dict(args)
        epoch = None if op in EPOCH_ARGUMENT else args.pop("epoch", None)
        gated = self.gate_of(op, args.get("name"), args.get("txn"))
        if gated is None:
            return OPS[op](self, **args)
        gate, joins = gated
        gate.enter(op, epoch, wait=True, joins=joins)
        try:
            return OPS[op](self, **args)
        finally:
            gate.leave()

    def gate_of(self, op: str, name: object, txn: object = None) -> tuple[MoveGate, bool] | None:
        """The gate ``op`` on table ``name`` passes, and whether it joins a transaction begun here (``txn``
        staged or pending: let through while a move drains the table, which waits for it).

        Parameters
        ----------
        op : str
            The operation.
        name : object
            The table's name, as the request gave it.
        txn : object, optional
            The transaction the request names.

        Returns
        -------
        tuple of (MoveGate, bool), or None
            The table's gate and whether the request joins; None: the
            operation is not gated, or there is no such table here.
        """
        if op in UNGATED or not isinstance(name, str):
            return None
        t = self.tables.get(name)
        if t is None:
            return None
        return t.gate, t.txns.joins(txn)

    # -- what the shards hold ------------------------------------------------------------------
    def shared_layout(self, name: str) -> dict:
        """How readers on this machine map the table's shared rings.

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        dict
            ``{"machine": id of this machine, "shards": {shard: layout or
            None}}``; a layout names the shard's segments (header, one per
            column) and capacity; None where the shard is not in shared
            memory.

        Raises
        ------
        SpecError
            No table ``name`` here.
        """
        return self.tables.table(name).shared_layout()

    def info(self, name: str) -> list[dict]:
        """Sizes and counters of every hosted shard of ``name``.

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        list of dict
            Per shard, by id: ``shard``, ``size``, ``episodes``,
            ``steps_stored``, ``capacity``, ``write_pos``, its counters
            (``inserted``, ``evicted``, ``removed``, ``deleted``, ``expired``,
            ``sampled``, ``stale_updates`` ...) and ``longest_episode``.
        """
        return self.tables.table(name).info()

    def nbytes(self, name: str) -> dict:
        """Bytes the hosted shards of ``name`` hold.

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        dict
            ``{"data": bytes of the rings, "overhead": index, priorities,
            selector trees}``.
        """
        return self.tables.table(name).nbytes()

    # -- inserts -----------------------------------------------------------------------------
    @documented_as(HostWriter.stage)
    def stage(self, name: str, txn: str, parts: list[dict]) -> int:
        return self.writer.stage(name, txn, parts)

    @documented_as(HostWriter.apply)
    def apply(self, name: str, txn: str) -> dict:
        return self.writer.apply(name, txn)

    @documented_as(HostWriter.write)
    def write(self, name: str, txn: str, parts: list[dict]) -> dict:
        return self.writer.write(name, txn, parts)

    def abort(self, name: str, txn: str) -> bool:
        """Forget a staged insert, or undo a pending sample; a stage, write or apply of ``txn`` that comes
        later (sent before, delivered after) is refused.  An insert applied already stays applied.

        Parameters
        ----------
        name : str
            The table's name (an unknown one: nothing to do).
        txn : str
            The insert's or sample's transaction id.

        Returns
        -------
        bool
            True if there was something to undo.
        """
        return self.writer.forget(name, txn) or bool(self.sampler.finish_sample(name, txn, commit=False))

    @documented_as(HostWriter.status)
    def status(self, name: str, txn: str) -> dict:
        return self.writer.status(name, txn)

    # -- the planner's questions -------------------------------------------------------------
    @documented_as(HostSelection.summaries)
    def summaries(
        self, name: str, kinds: Sequence[str], length: int | None = None, boundary: str | None = None
    ) -> dict[str, dict[int, float]]:
        return self.selection.summaries(name, kinds, length, boundary)

    @documented_as(HostSelection.new_epoch)
    def new_epoch(self, name: str, txn: str | None = None) -> None:
        self.selection.new_epoch(name, txn)

    @documented_as(HostSelection.candidates)
    def candidates(
        self,
        name: str,
        n: int,
        role: str | None = None,
        length: int | None = None,
        boundary: str | None = None,
        horizon: int | None = None,
    ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        return self.selection.candidates(name, n, role, length, boundary, horizon)

    # -- samples -----------------------------------------------------------------------------
    def draw_host(self, name: str, length: int, boundary: str, columns: Sequence[str], parts: dict) -> dict:
        """Draw every part of ``parts`` (this host's workers' shards) from their published selection state,
        for a reader on another host (:mod:`~gear_flow.distributed.host_reader`).

        Parameters
        ----------
        name : str
            The table (hosted here).
        length : int
            Window length.
        boundary : str
            Boundary mode.
        columns : sequence of str
            Columns gathered.
        parts : dict
            Per worker of this host, ``layout``, ``counts``, ``scale`` and ``seed``.

        Returns
        -------
        dict
            Per shard drawn, its part (``data`` included); ``fallback``: the shards their owners draw.

        Raises
        ------
        ProtocolError
            A layout that is not one gear_flow publishes, or columns the table lacks.
        """
        t = self.tables.table(name)
        cols = check_columns(t.spec, columns, "draw_host")
        return self.reader.draw(t.spec, length, boundary, cols, parts)

    @documented_as(HostSampler.sample_part)
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
        return self.sampler.sample_part(
            name,
            length,
            boundary,
            columns,
            seed,
            counts=counts,
            scale=scale,
            slots=slots,
            txn=txn,
            record=record,
            out=out,
            offsets=offsets,
            geometry=geometry,
            updates=updates,
            by_count=by_count,
            horizon=horizon,
            seqs=seqs,
        )

    @documented_as(HostSampler.sequences)
    def sequences(self, name: str, n: int, length: int, boundary: str, seed: int, by_count: bool = False) -> dict:
        return self.sampler.sequences(name, n, length, boundary, seed, by_count)

    @documented_as(HostSampler.finish_sample)
    def finish_sample(self, name: str, txn: str, commit: bool) -> dict[int, int]:
        return self.sampler.finish_sample(name, txn, commit)

    @documented_as(HostSampler.uncount)
    def uncount(self, name: str, counts: dict[int, int]) -> None:
        self.sampler.uncount(name, counts)

    @documented_as(HostSampler.count_drawn)
    def count_drawn(self, name: str, counts: dict[int, int]) -> None:
        self.sampler.count_drawn(name, counts)

    @documented_as(HostSampler.sample_all)
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
        return self.sampler.sample_all(name, n, length, boundary, columns, seed, horizon, out, updates)

    # -- edits -------------------------------------------------------------------------------
    @documented_as(HostEditor.check_keys)
    def check_keys(self, name: str, seqs_by_shard: dict) -> None:
        self.editor.check_keys(name, seqs_by_shard)

    @documented_as(HostEditor.update)
    def update(
        self,
        name: str,
        seqs_by_shard: dict,
        prios_by_shard: dict,
        stamps_by_shard: dict | None = None,
        masses: list | None = None,
    ) -> int | dict:
        return self.editor.update(name, seqs_by_shard, prios_by_shard, stamps_by_shard, masses)

    @documented_as(HostEditor.delete)
    def delete(self, name: str, seqs_by_shard: dict) -> tuple[dict, int]:
        return self.editor.delete(name, seqs_by_shard)

    @documented_as(HostEditor.remove)
    def remove(
        self,
        name: str,
        counts: dict | None = None,
        slots: dict | None = None,
        seed: int | None = None,
        seqs: dict | None = None,
    ) -> dict:
        return self.editor.remove(name, counts, slots, seed, seqs)

    # -- checkpoints -------------------------------------------------------------------------
    @documented_as(HostCheckpointer.checkpoint)
    def checkpoint(self, name: str, directory: str | os.PathLike[str]) -> dict:
        return self.checkpointer.checkpoint(name, directory)

    @documented_as(HostCheckpointer.restore)
    def restore(
        self, name: str, config: dict, directory: str | os.PathLike[str], files: dict, tier: str | None = None
    ) -> dict:
        return self.checkpointer.restore(name, config, directory, files, tier)

    # -- a disk table's files ----------------------------------------------------------------
    @documented_as(HostDisk.reopen)
    def reopen(self, name: str, config: dict, directory: str | os.PathLike[str], shard: int) -> dict:
        return self.disk.reopen(name, config, directory, shard)

    @documented_as(HostDisk.flush)
    def flush_disk(self, name: str) -> dict:
        return self.disk.flush(name)


#: who a registry handler's first name means (:mod:`.operations` names handlers so that it imports no host code);
#: ``GearFlowWorker`` ones (``lane``, ``move_in``) need the worker itself and are run by the plugin
_OWNERS = {"ShardHost": ShardHost, "host_moves": host_moves}
#: operation name -> ShardHost method or host_moves function (what :meth:`ShardHost.call` runs)
OPS = {op.name: getattr(_OWNERS[op.owner], op.attribute) for op in WORKER_OPS.values() if op.owner in _OWNERS}
