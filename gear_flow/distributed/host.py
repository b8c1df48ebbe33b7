"""Worker-side host of shards: plain, synchronous methods over local Shards.

One :class:`ShardHost` lives in each worker (made by the worker plugin) and
holds the shards of every distributed table placed there.  Its methods take
and return only NumPy arrays and plain Python values, so they travel over
Dask's comm as raw frames; they know nothing about Dask and are tested
without a cluster.  A co-located learner calls them in-process (no copy).

Inserts (transactions: ``stage``, ``apply``, ``abort``, ``write``,
``status``) are :class:`~gear_flow.distributed.host_writes.WritingHost`'s,
priority updates, deletes and removal (``check_keys``, ``update``, ``delete``,
``remove``) are :class:`~gear_flow.distributed.host_edits.EditingHost`'s,
checkpoints (``checkpoint``, ``restore``, ``drop_shard``) are
:class:`~gear_flow.distributed.host_checkpoints.CheckpointingHost`'s, the
planner's questions that gather nothing (``summaries``, ``candidates``,
``new_epoch``) are :class:`~gear_flow.distributed.host_selection.SelectingHost`'s,
and samples are answered by :class:`~gear_flow.distributed.host_sampling.SamplingHost`;
:class:`ShardHost` mixes them in over the tables it keeps here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from ..shard import Shard
from ..table.config import TableConfig
from .host_checkpoints import CheckpointingHost
from .host_edits import EditingHost
from .host_moves import EPOCH_ARGUMENT, UNGATED, MoveGate
from .host_sampling import SamplingHost
from .host_selection import SelectingHost
from .host_writes import WritingHost

if TYPE_CHECKING:
    from ..gpu.shared import SharedPinnedTier
    from ..storage.base import StorageTier


def shared_pinned() -> SharedPinnedTier:
    """A ``pinned`` tier whose rings are page-locked shared-memory segments (:mod:`gear_flow.gpu.shared`).

    Returns
    -------
    SharedPinnedTier
        A fresh tier; each shard gets its own (one segment set per shard).
    """
    from ..gpu.shared import SharedPinnedTier

    return SharedPinnedTier()


class HostedTable:
    """The shards of one table on one worker, plus its transactions in progress.

    Parameters
    ----------
    name : str
        The table's name.
    cfg : TableConfig
        Its validated configuration; every shard gets clones of its selectors.
    shard_ids : iterable of int
        The shards of the table placed on this worker.
    tier : str or StorageTier, optional
        Storage tier of the shards; default ``cfg.tier``.
    shared : bool, default False
        Put host and pinned rings in shared-memory segments that readers on
        this machine map (``host`` becomes ``shared``).

    Attributes
    ----------
    tier : str or StorageTier
        Where the shards' rings live, and so where gathered windows land.
    shards : dict of int to Shard
        The shards, by id.
    staged : dict of str to list
        Staged inserts by transaction: ``[(shard, EpisodeBatch), ...]``.
    applied : OrderedDict of str to dict
        Results of the last 4096 applied inserts, by transaction.
    applying : set of str
        Inserts being written now (taken from ``staged``, not yet in
        ``applied``).
    aborted : OrderedDict of str to bool
        The last 4096 inserts aborted here: a stage, write or apply of one
        that comes later (sent before the abort, delivered after) is refused.
    pending : dict of str to list
        Parts of two-phase samples awaiting ``finish_sample``, by
        transaction.
    finished : OrderedDict of str to tuple
        ``(commit, result)`` of the last 4096 finished two-phase samples, by
        transaction (a finish sent again answers as the first).
    lock : threading.Lock
        Guards ``staged``, ``applied``, ``applying``, ``aborted``, ``pending``
        and ``finished``.
    """

    def __init__(
        self,
        name: str,
        cfg: TableConfig,
        shard_ids: Iterable[int],
        tier: str | StorageTier | None = None,
        shared: bool = False,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.spec = cfg.spec
        tier = tier or cfg.tier
        if shared and tier == "host":  # the shared-memory data plane: same arrays, in named segments
            tier = "shared"
        #: where the shards' rings live, and so where their gathered windows land
        self.tier = tier
        self.shared = shared
        self.shards: dict[int, Shard] = {int(i): self.build_shard(int(i)) for i in shard_ids}
        #: shards a move is bringing here, built and not yet visible, by move id
        self.incoming: dict[str, dict[int, Shard]] = {}
        #: shards the last moves installed here, by move id
        self.installed: OrderedDict[str, list[int]] = OrderedDict()
        #: admits the table's operations; holds them while a move seals the table
        self.gate = MoveGate()
        self.staged: dict[str, list] = {}
        self.applied: OrderedDict[str, dict] = OrderedDict()
        self.applying: set[str] = set()
        self.aborted: OrderedDict[str, bool] = OrderedDict()
        self.pending: dict[str, list] = {}  # sample txn -> [(shard, slots, seqs, drawn)]
        self.finished: OrderedDict[str, tuple[bool, dict]] = OrderedDict()
        self.lock = threading.Lock()

    def build_shard(self, i: int) -> Shard:
        """A new, empty shard ``i`` of this table, on its tier (not added to :attr:`shards`).

        Parameters
        ----------
        i : int
            The shard's id.

        Returns
        -------
        Shard
            The shard, with clones of the table's selectors.
        """
        cfg = self.cfg
        tier = self.tier
        return Shard(
            cfg.spec,
            int(i),
            cfg.sampler.clone(),
            cfg.remover.clone(),
            max_times_sampled=cfg.max_times_sampled,
            tier=shared_pinned() if self.shared and tier == "pinned" else tier,  # one page-locked segment set per shard
        )

    @staticmethod
    def release_shards(shards: Iterable[Shard]) -> None:
        """Unlink the shared-memory segments of ``shards`` (shards that are not in shared memory: nothing).

        Parameters
        ----------
        shards : iterable of Shard
            The shards.
        """
        for s in shards:
            if hasattr(s.tier, "release"):
                s.tier.release()

    def release(self, shards: Iterable[int] | None = None) -> None:
        """Unlink the shared-memory segments of ``shards`` (default: all).

        Parameters
        ----------
        shards : iterable of int, optional
            Shard ids; shards not hosted or not in shared memory are skipped.
        """
        ids = sorted(self.shards if shards is None else shards)
        self.release_shards(self.shards[i] for i in ids if i in self.shards)
        if shards is None:
            for built in self.incoming.values():
                self.release_shards(built.values())

    def shard(self, i: int) -> Shard:
        """Hosted shard ``i``.

        Parameters
        ----------
        i : int
            Shard id (anything ``int()`` accepts).

        Returns
        -------
        Shard
            The shard.

        Raises
        ------
        SpecError
            The shard is not on this worker.
        """
        try:
            return self.shards[int(i)]
        except (KeyError, TypeError, ValueError):
            raise SpecError(
                f"shard {i!r} of table {self.name!r} is not on this worker (here: {sorted(self.shards)})"
            ) from None

    def locked(self, ids: Iterable[int] | None = None) -> list[threading.RLock]:
        """Acquire the locks of ``ids`` (default: all) in ascending order; returns them for release.

        Parameters
        ----------
        ids : iterable of int, optional
            Shard ids (default: every hosted shard).

        Returns
        -------
        list of lock
            The acquired locks, in acquisition order (release with
            :func:`~gear_flow.distributed.host_sampling.release`).
        """
        locks = [self.shards[i].lock for i in sorted(self.shards if ids is None else ids)]
        for lk in locks:
            lk.acquire()
        return locks

    def try_locked(self) -> list[threading.RLock] | None:
        """:meth:`locked` of every shard without waiting: None (nothing held) when one is taken.

        Returns
        -------
        list of lock or None
            The acquired locks, in acquisition order, or None.
        """
        locks = []
        for i in sorted(self.shards):
            lk = self.shards[i].lock
            if not lk.acquire(blocking=False):
                for held in reversed(locks):
                    held.release()
                return None
            locks.append(lk)
        return locks


class ShardHost(WritingHost, EditingHost, CheckpointingHost, SelectingHost, SamplingHost):
    """All hosted tables of one worker; see the module docstring.

    Attributes
    ----------
    tables : dict of str to HostedTable
        The tables with shards here, by name.

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

    def __init__(self) -> None:
        self.tables: dict[str, HostedTable] = {}
        self.lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------
    def create(self, name: str, config: dict, shard_ids: Iterable[int], tier: str | None = None) -> list[int]:
        """Host shards ``shard_ids`` of table ``name`` (idempotent for the same shards).

        Parameters
        ----------
        name : str
            The table's name.
        config : dict
            Its configuration (:meth:`TableConfig.to_dict`, plus
            ``shared_memory``).
        shard_ids : iterable of int
            Shards placed on this worker.
        tier : str, optional
            Storage tier; default the configuration's.

        Returns
        -------
        list of int
            The sorted shard ids hosted.

        Raises
        ------
        SpecError
            An invalid configuration, or the table is already here with other
            shards.
        """
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
        """Forget table ``name`` here and release its shared memory.

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        bool
            Whether the table was here.
        """
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

    def hosted(self, name: str, config: dict) -> HostedTable:
        """The hosted table ``name``, made here with no shards when it is not (a move brings it its first).

        Parameters
        ----------
        name : str
            The table's name.
        config : dict
            Its configuration (:meth:`TableConfig.to_dict`, plus
            ``shared_memory``).

        Returns
        -------
        HostedTable
            The table.
        """
        with self.lock:
            t = self.tables.get(name)
            if t is None:
                cfg = TableConfig.from_dict(config)
                t = self.tables[name] = HostedTable(name, cfg, [], shared=bool(config.get("shared_memory")))
            return t

    def call(self, op: str, args: dict) -> Any:
        """Run operation ``op`` from a thread of this process (a co-located caller's), through the table's
        gate as the plugin runs the others: it waits while a move holds the table, and a request planned at
        an older placement than this worker's shards (``epoch``) is refused.

        Parameters
        ----------
        op : str
            A key of :data:`gear_flow.distributed.plugin.OPS`.
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
        from .plugin import OPS

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
        return t.gate, isinstance(txn, str) and (txn in t.staged or txn in t.pending)

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
        from ..storage.shared import machine_id

        return {"machine": machine_id(), "shards": {i: s.shared_layout() for i, s in self.table(name).shards.items()}}

    def table(self, name: str) -> HostedTable:
        """The hosted table ``name``.

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        HostedTable
            Its shards here.

        Raises
        ------
        SpecError
            No table ``name`` here.
        """
        try:
            return self.tables[name]
        except (KeyError, TypeError):
            raise SpecError(f"no table {name!r} on this worker; tables here: {sorted(self.tables)}") from None

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
        return self.table(name).shard(shard_id)

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
        return [
            {**s.info(), "longest_episode": s.longest_episode()} for _, s in sorted(self.table(name).shards.items())
        ]

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
        parts = [s.nbytes() for s in self.table(name).shards.values()]
        return {k: sum(p[k] for p in parts) for k in ("data", "overhead")}
