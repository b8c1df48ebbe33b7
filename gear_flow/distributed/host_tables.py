"""The tables a worker hosts: each one's shards, gate and transaction memory, and the registry of them by name.

A :class:`HostedTable` owns the shards of one table placed on this worker (and
those a move is bringing here), the :class:`~gear_flow.distributed.host_moves.MoveGate`
its operations pass, and its :class:`~gear_flow.distributed.host_transactions.TransactionMemory`.
:class:`HostedTables` is the worker's registry of them; the writer, editor,
checkpointer, selection and sampler parts of the
:class:`~gear_flow.distributed.host.ShardHost` are each handed it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..shard import Shard
from ..table.admission import acquire_all
from ..table.config import TableConfig
from . import disk_files
from .host_moves import MoveGate
from .host_transactions import TransactionMemory

if TYPE_CHECKING:
    from ..gpu.shared import SharedPinnedTier
    from ..storage.base import StorageTier

#: moves undone on this worker that it remembers (a copy one of them was still building when undone is let go)
UNDONE_KEPT = 256


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
    """The shards of one table on one worker, with its gate and its transaction memory.

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
    disk_path : str, optional
        A ``disk`` table's root directory, the same on every worker (what
        ``create`` was given as ``path``); None: this worker's config
        ``gear-flow.disk.path`` (:mod:`~gear_flow.distributed.disk_files`).

    Attributes
    ----------
    tier : str or StorageTier
        Where the shards' rings live, and so where gathered windows land.
    shards : dict of int to Shard
        The shards, by id.
    incoming : dict of str to dict
        Shards a move is bringing here, built and not yet visible, by move id.
    installed : OrderedDict of str to list
        Shards the last moves installed here, by move id.
    gate : MoveGate
        Admits the table's operations; holds them while a move seals the table.
    txns : TransactionMemory
        Its inserts and two-phase samples in progress, and their outcomes.
    lock : threading.Lock
        Guards the shard sets: ``shards``' membership, ``incoming``,
        ``installed`` and ``shared_files``.
    shared_files : dict of str to set of int
        Disk shards whose files the other end of a move maps too, by move:
        the shards this worker hands over in place (its source) or reopened
        in place for it (its destination).  Letting one of them go here
        leaves the files alone (:data:`~gear_flow.distributed.disk_files.KEEP`).

    Examples
    --------
    >>> from gear_flow import ColumnSpec, TableSpec
    >>> t = HostedTable("t", TableConfig.build(TableSpec((ColumnSpec("x", ()),), capacity=8, num_shards=2)), [1])
    >>> sorted(t.shards), len(t.staged)
    ([1], 0)
    """

    def __init__(
        self,
        name: str,
        cfg: TableConfig,
        shard_ids: Iterable[int],
        tier: str | StorageTier | None = None,
        shared: bool = False,
        disk_path: str | None = None,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.spec = cfg.spec
        tier = tier or cfg.tier
        if shared and tier == "host":  # the shared-memory data plane: same arrays, in named segments
            tier = "shared"
        self.tier = tier
        self.shared = shared
        self.disk_path = disk_path
        self.incoming: dict[str, dict[int, Shard]] = {}
        self.installed: OrderedDict[str, list[int]] = OrderedDict()
        self.shared_files: dict[str, set[int]] = {}
        self._installed_mapped: dict[str, set[int]] = {}  # of the moves in ``installed``: which came in place
        self.gate = MoveGate()
        self.txns = TransactionMemory(name, step=cfg.spec.item_unit == "step")
        self.lock = threading.Lock()
        self.shards: dict[int, Shard] = {}
        try:
            for i in shard_ids:
                self.shards[int(i)] = self.build_shard(int(i))
        except BaseException:  # all or nothing: a disk shard built before the failure leaves no directory
            self.release_shards(self.shards.values())
            raise

    @classmethod
    def from_config(
        cls, name: str, config: dict, shard_ids: Iterable[int], tier: str | StorageTier | None = None
    ) -> HostedTable:
        """The table as a worker is told of it: its configuration's dict, with the distributed settings.

        Parameters
        ----------
        name : str
            The table's name.
        config : dict
            :meth:`TableConfig.to_dict`, plus ``shared_memory`` and
            ``disk_path`` (both optional).
        shard_ids : iterable of int
            The shards to build here.
        tier : str or StorageTier, optional
            Storage tier; default the configuration's.

        Returns
        -------
        HostedTable
            The table, its shards built.

        Raises
        ------
        SpecError
            An invalid configuration, or a shard that cannot be built here.
        """
        return cls(
            name,
            TableConfig.from_dict(config),
            shard_ids,
            tier,
            shared=bool(config.get("shared_memory")),
            disk_path=config.get("disk_path"),
        )

    @property
    def staged(self) -> Mapping[str, list]:
        """A read-only view of the inserts staged here (:attr:`TransactionMemory.staged`)."""
        return self.txns.staged

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
        tier = self.tier
        if disk_files.is_disk(tier):  # its own files: <root>/<table>/shard-<id>
            tier = disk_files.new_tier(self.name, self.disk_path, int(i))
        elif self.shared and tier == "pinned":
            tier = shared_pinned()  # one page-locked segment set per shard
        try:
            return self.make_shard(i, tier)
        except BaseException:
            if disk_files.is_disk(tier):  # a shard that was never built leaves no directory
                tier.release()
                disk_files.remove_files(tier.directory)
            raise

    def make_shard(self, i: int, tier: str | StorageTier) -> Shard:
        """Shard ``i`` of this table on ``tier`` as it is given (a new one, or one reopening its files).

        Parameters
        ----------
        i : int
            The shard's id.
        tier : str or StorageTier
            Its storage (a tier object is the shard's own).

        Returns
        -------
        Shard
            The shard, with clones of the table's selectors.
        """
        cfg = self.cfg
        return Shard(
            cfg.spec,
            int(i),
            cfg.sampler.clone(),
            cfg.remover.clone(),
            max_times_sampled=cfg.max_times_sampled,
            tier=tier,
        )

    @staticmethod
    def release_shards(shards: Iterable[Shard], files: str = disk_files.REMOVE) -> None:
        """Unlink the shared-memory segments of ``shards`` and unmap disk shards (other shards: nothing).

        Parameters
        ----------
        shards : iterable of Shard
            The shards.
        files : {"remove", "keep", "flush"}, default "remove"
            What becomes of a disk shard's files
            (:func:`~gear_flow.distributed.disk_files.let_go`): removed, as a
            memory tier's memory is freed, unless a caller says otherwise.
        """
        for s in shards:
            if s.published is not None:  # readers on this host stop drawing from it, before its segments go
                with s.lock:
                    s.published.retire()
            if s.store is not None:
                disk_files.let_go(s, files)
            elif hasattr(s.tier, "release"):
                s.tier.release()

    def release(self, shards: Iterable[int] | None = None, files: str = disk_files.REMOVE) -> None:
        """Unlink the shared-memory segments of ``shards`` (default: all, and those a move is bringing here) and
        let their disk shards' files go as ``files`` says, but those the other end of a move maps too
        (:attr:`shared_files`), which stay as they are.

        Parameters
        ----------
        shards : iterable of int, optional
            Shard ids; shards not hosted or not in shared memory are skipped.
        files : {"remove", "keep", "flush"}, default "remove"
            What becomes of the hosted disk shards' files
            (:func:`~gear_flow.distributed.disk_files.let_go`); a move's
            copy that is not installed yet has its files removed.
        """
        ids = sorted(self.shards if shards is None else shards)
        # handed over in place by the move sealing the table (a seal whose lease ran out lends nothing)
        lent = self.shared_files.get(self.gate.sealed, set()) if self.gate.sealed is not None else set()
        for i in ids:
            if i in self.shards:
                self.release_shards([self.shards[i]], disk_files.KEEP if i in lent else files)
        if shards is None:
            for move, built in self.incoming.items():
                self._discard(move, built)

    def _discard(self, move: str, built: dict[int, Shard]) -> None:
        """Let go of the shards built here for ``move`` that it did not install: those reopened in place from
        the source's files keep them, copies leave none."""
        mapped = self.shared_files.get(move, set())
        for i, s in built.items():
            self.release_shards([s], disk_files.KEEP if i in mapped else disk_files.REMOVE)

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
        acquire_all(locks)
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

    # -- what the shards hold ----------------------------------------------------------------
    def info(self) -> list[dict]:
        """Sizes and counters of every hosted shard, by id.

        Returns
        -------
        list of dict
            As :meth:`gear_flow.shard.Shard.info`, with ``longest_episode``.
        """
        return [{**s.info(), "longest_episode": s.longest_episode()} for _, s in sorted(self.shards.items())]

    def nbytes(self) -> dict:
        """Bytes the hosted shards hold.

        Returns
        -------
        dict
            ``{"data": bytes of the rings, "overhead": index, priorities,
            selector trees}``.
        """
        parts = [s.nbytes() for s in self.shards.values()]
        return {k: sum(p[k] for p in parts) for k in ("data", "overhead")}

    def shared_layout(self) -> dict:
        """How readers on this machine map the shards' shared rings.

        Returns
        -------
        dict
            ``{"machine": id of this machine, "shards": {shard: layout or
            None}}``; a layout names the shard's segments (header, one per
            column) and capacity; None where the shard is not in shared
            memory.
        """
        from ..storage.shared import machine_id

        # (a copy: a move in another thread may add or drop a shard while a layout waits for a shard's lock)
        return {"machine": machine_id(), "shards": {i: s.shared_layout() for i, s in list(self.shards.items())}}

    # -- the shard set: hand-overs -----------------------------------------------------------
    def hosting(self, ids: Iterable[int]) -> list[int]:
        """The shards among ``ids`` hosted here.

        Parameters
        ----------
        ids : iterable of int
            Shard ids.

        Returns
        -------
        list of int
            Those hosted, sorted.
        """
        with self.lock:
            return sorted({int(s) for s in ids} & set(self.shards))

    def remove_shards(self, ids: Iterable[int]) -> list[int]:
        """Forget the shards among ``ids`` hosted here and release their shared memory and disk files
        (those the other end of a move maps stay, :meth:`release`).

        Parameters
        ----------
        ids : iterable of int
            Shard ids; those not hosted are skipped.

        Returns
        -------
        list of int
            The shards removed, sorted.
        """
        with self.lock:
            gone = [i for i in sorted({int(s) for s in ids}) if i in self.shards]
            self.release(gone)
            for i in gone:
                del self.shards[i]
        return gone

    def lend(self, move: str, ids: Iterable[int]) -> None:
        """Disk shards ``ids`` hosted here are handed over in place by ``move``: the destination maps their files.

        Until the move ends (:meth:`end_move`), letting one of them go here
        leaves its files as they are.

        Parameters
        ----------
        move : str
            The move's id.
        ids : iterable of int
            The shards.
        """
        with self.lock:
            self.shared_files[move] = {int(i) for i in ids}

    def end_move(self, move: str) -> set[int]:
        """``move`` is over here (released, thawed or undone): forget which of its shards' files it shared.

        Parameters
        ----------
        move : str
            The move's id.

        Returns
        -------
        set of int
            The shards whose files it shared.
        """
        with self.lock:
            return self.shared_files.pop(move, set())

    def set_aside(self, move: str, built: dict[int, Shard], mapped: Iterable[int] = ()) -> None:
        """Keep ``built`` for ``move`` without hosting them yet (a copy built for it before is released).

        Parameters
        ----------
        move : str
            The move's id.
        built : dict of int to Shard
            The shards built for it.
        mapped : iterable of int, optional
            Those among them reopened in place from the source's files
            (a disk shard moving on one machine).
        """
        with self.lock:
            old = self.incoming.pop(move, None)
            old_mapped = self.shared_files.pop(move, set())
            self.incoming[move] = built
            if mapped:
                self.shared_files[move] = {int(i) for i in mapped}
        if old:
            for i, s in old.items():
                self.release_shards([s], disk_files.KEEP if i in old_mapped else disk_files.REMOVE)

    def built_for(self, move: str) -> tuple[dict[int, Shard] | None, list[int] | None]:
        """The shards set aside for ``move``, and those it installed.

        Parameters
        ----------
        move : str
            The move's id.

        Returns
        -------
        tuple of (dict or None, list or None)
            Set aside (None: nothing), installed (None: not installed).
        """
        with self.lock:
            return self.incoming.get(move), self.installed.get(move)

    def install(self, move: str, built: dict[int, Shard], keep: int) -> list[int]:
        """Host ``built``, the shards set aside for ``move``, remembering the last ``keep`` moves installed.

        Parameters
        ----------
        move : str
            The move's id.
        built : dict of int to Shard
            What :meth:`built_for` gave for it.
        keep : int
            Moves whose installed shards are remembered.

        Returns
        -------
        list of int
            The shards installed, sorted.
        """
        with self.lock:
            self.incoming.pop(move, None)
            # the files are this worker's now (the source lets go of them), unless the move is undone after all
            self._installed_mapped[move] = self.shared_files.pop(move, set())
            self.shards.update(built)
            self.installed[move] = sorted(built)
            while len(self.installed) > keep:
                self._installed_mapped.pop(self.installed.popitem(last=False)[0], None)
        return sorted(built)

    def uninstall(self, move: str) -> bool:
        """Forget the shards built for ``move``, set aside or installed, and release them.

        Parameters
        ----------
        move : str
            The move's id.

        Returns
        -------
        bool
            Whether anything was built for it here.
        """
        with self.lock:
            built = self.incoming.pop(move, None)
            # installed, and the coordinator could not place them here after all: they leave again (the
            # placement still names the source, which kept them)
            done = [i for i in self.installed.pop(move, ()) if i in self.shards]
            gone = {i: self.shards.pop(i) for i in done}
            mapped = self.shared_files.pop(move, set()) | self._installed_mapped.pop(move, set())
        # a disk shard that came in place maps the source's files, which the source serves on from
        for i, s in {**(built or {}), **gone}.items():
            self.release_shards([s], disk_files.KEEP if i in mapped else disk_files.REMOVE)
        return built is not None or bool(done)


class HostedTables(Mapping):
    """The tables with shards on one worker, by name: a read-only mapping that changes only through its methods.

    Examples
    --------
    >>> from gear_flow import ColumnSpec, TableSpec
    >>> tables = HostedTables()
    >>> cfg = TableConfig.build(TableSpec((ColumnSpec("x", ()),), capacity=8, num_shards=2)).to_dict()
    >>> tables.create("t", cfg, [0, 1])
    [0, 1]
    >>> sorted(tables), tables.drop("t")
    (['t'], True)
    """

    def __init__(self) -> None:
        self._tables: dict[str, HostedTable] = {}
        self._lock = threading.Lock()
        self._undone: OrderedDict[str, None] = OrderedDict()

    def undo_move(self, name: str, move: str) -> bool:
        """Forget the shards ``move`` built here for table ``name``, set aside or installed
        (:meth:`HostedTable.uninstall`), and remember the move undone: a copy still being built for it
        (its coordinator gave up waiting for it) is let go once built, not set aside for good.

        Parameters
        ----------
        name : str
            The table's name.
        move : str
            The move's id.

        Returns
        -------
        bool
            Whether anything was built for it here.
        """
        with self._lock:  # first: a build that sets its copy aside after this sees the move undone
            self._undone[move] = None
            while len(self._undone) > UNDONE_KEPT:
                self._undone.popitem(last=False)
            t = self._tables.get(name)
        return t is not None and t.uninstall(move)

    def was_undone(self, move: str) -> bool:
        """Whether ``move`` was undone here (:meth:`undo_move`).

        Parameters
        ----------
        move : str
            The move's id.

        Returns
        -------
        bool
            True for one of the last moves undone.
        """
        with self._lock:
            return move in self._undone

    def __getitem__(self, name: str) -> HostedTable:
        return self._tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

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
            return self._tables[name]
        except (KeyError, TypeError):
            raise SpecError(f"no table {name!r} on this worker; tables here: {sorted(self._tables)}") from None

    def create(self, name: str, config: dict, shard_ids: Iterable[int], tier: str | None = None) -> list[int]:
        """Host shards ``shard_ids`` of table ``name`` (idempotent for the same shards).

        Parameters
        ----------
        name : str
            The table's name.
        config : dict
            Its configuration (:meth:`TableConfig.to_dict`, plus
            ``shared_memory`` and ``disk_path``).
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
            An invalid configuration, the table is already here with other
            shards, or a disk table's shard cannot have its files here (no
            directory for disk tables, or one left there); nothing is built.
        """
        TableConfig.from_dict(config)
        with self._lock:
            if name in self._tables:
                have = sorted(self._tables[name].shards)
                if have != sorted(int(i) for i in shard_ids):
                    raise SpecError(f"table {name!r} already has shards {have} on this worker")
                return have
            self._tables[name] = HostedTable.from_config(name, config, shard_ids, tier)
            return sorted(self._tables[name].shards)

    def hosted(self, name: str, config: dict) -> HostedTable:
        """The hosted table ``name``, made here with no shards when it is not (a move brings it its first).

        Parameters
        ----------
        name : str
            The table's name.
        config : dict
            Its configuration (:meth:`TableConfig.to_dict`, plus
            ``shared_memory`` and ``disk_path``).

        Returns
        -------
        HostedTable
            The table.
        """
        with self._lock:
            t = self._tables.get(name)
            if t is None:
                t = self._tables[name] = HostedTable.from_config(name, config, [])
            return t

    def adopt(
        self, name: str, fresh: Callable[[], HostedTable], build: Callable[[HostedTable], dict[int, Shard]]
    ) -> HostedTable:
        """Host the shards ``build(t)`` makes in table ``name`` (``t``: the table hosted now, or ``fresh()``), atomically.

        Shards already hosted are replaced; the table's other shards are
        kept, and so are its inserts staged and samples pending here (a
        pending sample's parts drawn from a replaced shard finish on the copy
        they were drawn from).  A replaced disk shard's files are removed.
        When ``build`` raises, nothing changes (``build`` lets go of what it
        built itself).

        Parameters
        ----------
        name : str
            The table's name.
        fresh : callable
            Makes the table with no shards, when it is not hosted here.
        build : callable
            Builds the shards for the table it is given, under the
            registry's lock: ``{shard: Shard}``.

        Returns
        -------
        HostedTable
            The table.
        """
        with self._lock:
            old = self._tables.get(name)
            t = old if old is not None else fresh()
            # built into the table hosted here, not a new one: its inserts staged and its two-phase samples drawn
            # on the other shards go on (a new table's memory would answer their apply and finish as unknown, and
            # a queue's items handed out would never expire)
            built = build(t)
            with t.lock:
                replaced = {i: t.shards[i] for i in built if i in t.shards}
                t.txns.retire(replaced)
                t.shards.update(built)
            self._tables[name] = t
        t.release_shards(replaced.values())
        return t

    def drop(self, name: str) -> bool:
        """Forget table ``name`` here, release its shared memory and remove its disk shards' files.

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        bool
            Whether the table was here.
        """
        with self._lock:
            t = self._tables.pop(name, None)
        if t is not None:
            t.release()
        return t is not None

    def close_table(self, name: str) -> bool:
        """Close table ``name`` here and keep its shards (``close(drop=False)``): its gate refuses the data path
        from now on (:class:`~gear_flow.errors.TableClosedError`), and readers on this host stop drawing from
        its published state, so that their draws come here and are refused too.

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        bool
            Whether the table was here.
        """
        with self._lock:
            t = self._tables.get(name)
        if t is None:
            return False
        t.gate.close(name)
        for s in list(t.shards.values()):
            if s.published is not None:
                with s.lock:
                    s.published.hold()
        return True

    def drop_shard(self, name: str, shard: int, epoch: int) -> bool:
        """Forget one shard of a table here, release its shared memory and remove its files (a disk shard).

        Parameters
        ----------
        name : str
            The table's name.
        shard : int
            The shard's id.
        epoch : int
            The placement version at which the shard left this worker (a restore put it elsewhere): a request
            planned before it is refused as stale (ShardMovedError, which its handle retries where the shard
            is now), as after a move; it met a bare SpecError ("not on this worker").

        Returns
        -------
        bool
            Whether the shard was here.
        """
        with self._lock:
            t = self._tables.get(name)
        if t is None:
            return False
        t.gate.advance(epoch)  # (waits for the requests in progress: none planned before sees the shard gone)
        return bool(t.remove_shards([int(shard)]))

    def close(self) -> None:
        """Forget every table and release its shared memory (the worker is closing).

        Disk shards are flushed and their files stay: a worker that can see
        them reopens them in place (``restore_shard``).
        """
        with self._lock:
            tables, self._tables = list(self._tables.values()), {}
        for t in tables:
            t.release(files=disk_files.FLUSH)
