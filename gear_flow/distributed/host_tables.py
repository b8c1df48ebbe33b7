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
from ..table.config import TableConfig
from .host_moves import MoveGate
from .host_transactions import TransactionMemory

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
        Guards the shard sets: ``shards``' membership, ``incoming`` and
        ``installed``.

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
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.spec = cfg.spec
        tier = tier or cfg.tier
        if shared and tier == "host":  # the shared-memory data plane: same arrays, in named segments
            tier = "shared"
        self.tier = tier
        self.shared = shared
        self.shards: dict[int, Shard] = {int(i): self.build_shard(int(i)) for i in shard_ids}
        self.incoming: dict[str, dict[int, Shard]] = {}
        self.installed: OrderedDict[str, list[int]] = OrderedDict()
        self.gate = MoveGate()
        self.txns = TransactionMemory(name, step=cfg.spec.item_unit == "step")
        self.lock = threading.Lock()

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
            if s.published is not None:  # readers on this host stop drawing from it, before its segments go
                with s.lock:
                    s.published.retire()
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

        return {"machine": machine_id(), "shards": {i: s.shared_layout() for i, s in self.shards.items()}}

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
        """Forget the shards among ``ids`` hosted here and release their shared memory.

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

    def set_aside(self, move: str, built: dict[int, Shard]) -> None:
        """Keep ``built`` for ``move`` without hosting them yet (a copy built for it before is released).

        Parameters
        ----------
        move : str
            The move's id.
        built : dict of int to Shard
            The shards built for it.
        """
        with self.lock:
            old = self.incoming.pop(move, None)
            self.incoming[move] = built
        if old:
            self.release_shards(old.values())

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
            self.shards.update(built)
            self.installed[move] = sorted(built)
            while len(self.installed) > keep:
                self.installed.popitem(last=False)
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
            gone = [self.shards.pop(i) for i in done]
        if built:
            self.release_shards(built.values())
        self.release_shards(gone)
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
        with self._lock:
            if name in self._tables:
                have = sorted(self._tables[name].shards)
                if have != sorted(int(i) for i in shard_ids):
                    raise SpecError(f"table {name!r} already has shards {have} on this worker")
                return have
            self._tables[name] = HostedTable(name, cfg, shard_ids, tier, shared=bool(config.get("shared_memory")))
            return sorted(self._tables[name].shards)

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
        with self._lock:
            t = self._tables.get(name)
            if t is None:
                cfg = TableConfig.from_dict(config)
                t = self._tables[name] = HostedTable(name, cfg, [], shared=bool(config.get("shared_memory")))
            return t

    def replace(self, name: str, build: Callable[[HostedTable | None], HostedTable]) -> HostedTable:
        """Put ``build(old)`` in place of table ``name`` (``old``: the table hosted now, or None), atomically.

        Parameters
        ----------
        name : str
            The table's name.
        build : callable
            Makes the new table from the old one, under the registry's lock.

        Returns
        -------
        HostedTable
            The new table.
        """
        with self._lock:
            t = self._tables[name] = build(self._tables.get(name))
            return t

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
        with self._lock:
            t = self._tables.pop(name, None)
        if t is not None:
            t.release()
        return t is not None

    def drop_shard(self, name: str, shard: int) -> bool:
        """Forget one shard of a table here and release its shared memory.

        Parameters
        ----------
        name : str
            The table's name.
        shard : int
            The shard's id.

        Returns
        -------
        bool
            Whether the shard was here.
        """
        with self._lock:
            t = self._tables.get(name)
            return t is not None and bool(t.remove_shards([int(shard)]))

    def close(self) -> None:
        """Forget every table and release its shared memory (the worker is closing)."""
        with self._lock:
            tables, self._tables = list(self._tables.values()), {}
        for t in tables:
            t.release()
