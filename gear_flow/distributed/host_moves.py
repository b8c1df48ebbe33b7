"""Handing shards from one worker to another: the worker's side of a move, and the gate that makes it exact.

A move copies a shard whole (rings, priorities, episode index, times-sampled
counters, stamps, selector trees: what a checkpoint holds) from its worker,
the *source*, to another, the *destination*, so that its keys stay valid; a
``disk`` shard moving between two workers of one machine is not copied, its
files are reopened in place by the destination (into new files of the
destination's when it is on another machine).  The
coordinator drives it (:mod:`~gear_flow.distributed.moves`); this module is
what each worker does:

1. the destination pulls the shards (``move_in``): the source *seals* them
   (``move_out``: no new operation on the table enters, those in progress and
   the inserts and samples with parts staged on the moving shards finish),
   snapshots them and keeps them sealed; the destination builds them aside;
2. the destination installs them at the coordinator's new placement version
   (``move_commit``), the coordinator moves the placement, and the source drops
   them (``move_release``): the operations it held are refused as stale
   (:class:`~gear_flow.errors.ShardMovedError`), their handles look the
   placement up and send them where the shards are now;
3. a move that fails anywhere before the destination installs is undone: the
   destination forgets its copy (``move_abort``), the source thaws
   (``move_thaw``) and serves as if nothing happened.

Every table operation a handle sends carries the placement version it was
planned at (``epoch``).  A worker whose shard set changed at a newer version
refuses older ones, so that no request planned for the old placement is
answered from the new one (a shard missing from, or added to, a worker's
summaries); the P2P shuffle refuses a stale run's messages the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .. import config
from ..errors import ShardMovedError, SpecError, TableClosedError
from . import disk_files
from .operations import AFTER_CLOSE, THROUGH

if TYPE_CHECKING:
    from .host import ShardHost
    from .host_tables import HostedTable

logger = logging.getLogger(__name__)

#: moves whose installed shards a destination remembers (to undo, or to take a later version)
INSTALLED_KEPT = 64
#: seconds a seal's lease outlasts the move's timeout (the install, placement and release steps)
LEASE_MARGIN_S = 120.0
#: seconds a waiting thread looks again whether a seal's lease ran out
LEASE_POLL_S = 0.1
#: seconds a source waits for the operations and parts in progress on its moving shards to finish
DRAIN_S = 10.0


def seal_lease() -> float:
    """Seconds a source stays sealed without hearing from the move again: the coordinator's whole move
    (``distributed.move-timeout``) and its last steps; the coordinator gives a move up before that.

    The coordinator reads it from its own configuration and sends it with the move (``lease``): the source
    must not time the seal with its own ``move-timeout``, which may be shorter, or a long copy would outlast
    the seal and the source would take writes the move then leaves behind.

    Returns
    -------
    float
        Seconds.
    """
    return float(config.get("distributed.move-timeout")) + LEASE_MARGIN_S


class MoveGate:
    """Admits the operations of one hosted table, and holds them while a move seals the table.

    Attributes
    ----------
    epoch : int
        The placement version this worker's shard set of the table is at:
        set when shards arrive or leave; requests planned at an older one are
        refused.
    sealed : str or None
        The move holding the table, if any.
    closed : str or None
        Why the table refuses its data path (:meth:`close`), if it does.
    """

    def __init__(self) -> None:
        self.closed: str | None = None
        self._cv = threading.Condition()
        self._active = 0
        self._draining: str | None = None
        self.sealed: str | None = None
        self._lease_end = 0.0
        self.epoch = 0

    def enter(self, op: str, epoch: int | None, wait: bool, joins: bool = False) -> bool:
        """Let operation ``op`` in (the caller calls :meth:`leave` when it is done).

        Parameters
        ----------
        op : str
            The operation.
        epoch : int or None
            The placement version the request was planned at (None: not
            checked).
        wait : bool
            Wait while a move holds the table (a thread); False: return False
            instead (the event loop, which polls).
        joins : bool, default False
            It goes on with a transaction that has parts here (a sample's
            later request): let through while the table drains, which waits
            for that transaction.

        Returns
        -------
        bool
            Whether it entered.

        Raises
        ------
        ShardMovedError
            ``epoch`` is older than this worker's shard set.
        TableClosedError
            The table is closed and ``op`` is neither one of
            :data:`~gear_flow.distributed.operations.AFTER_CLOSE` nor a later
            step of a transaction begun before.
        """
        with self._cv:
            while True:
                self._expire()
                through = op in THROUGH or joins
                if self.closed is not None and not through and op not in AFTER_CLOSE:
                    raise TableClosedError(self.closed)
                if not through and epoch is not None and epoch < self.epoch:
                    raise ShardMovedError(self.epoch, "this worker's shards of the table changed since the request")
                held = self.sealed is not None or (self._draining is not None and not through)
                if not held:
                    self._active += 1
                    return True
                if not wait:
                    return False
                self._cv.wait(LEASE_POLL_S)  # (the seal's lease may run out meanwhile)

    def _expire(self) -> None:
        """A seal no move step came back for within its lease ends (its coordinator is gone, or the steps
        were sent by hand): the table serves on, as after a thaw (called under the gate's lock)."""
        if self.sealed is not None and time.monotonic() > self._lease_end:
            logger.warning("move %s: neither released nor thawed within its lease; the table serves on", self.sealed)
            self.sealed = None
            self._cv.notify_all()

    def close(self, name: str) -> None:
        """Refuse the table's data path from now on (``close(drop=False)``); operations in progress finish.

        Parameters
        ----------
        name : str
            The table's name, for the message.
        """
        with self._cv:
            self.closed = f"table {name!r} is closed"
            self._cv.notify_all()  # (a request waiting out a move is refused now, not after it)

    def leave(self) -> None:
        """An operation let in by :meth:`enter` is done."""
        with self._cv:
            self._active -= 1
            if self._draining is not None:  # only a seal waits for operations to finish (every request leaves)
                self._cv.notify_all()

    def seal(self, move: str, quiet: Callable[[], bool], timeout: float, lease: float) -> None:
        """Hold every operation for ``move``: new ones wait, those in progress finish, and so do the
        transactions ``quiet()`` reports busy (their apply, abort and finish still enter).

        Parameters
        ----------
        move : str
            The move's id.
        quiet : callable
            ``quiet()`` is True once no staged, applying or pending part
            touches the moving shards (called under this gate's lock).
        timeout : float
            Seconds to wait for that.
        lease : float
            Seconds the seal lasts without a later step of the move
            (:func:`seal_lease`, the coordinator's).

        Raises
        ------
        SpecError
            Another move holds the table, or the table did not become quiet
            in time (nothing is held then).
        """
        deadline = time.monotonic() + timeout
        with self._cv:
            if self.sealed is not None or self._draining is not None:
                raise SpecError(f"the table is already being moved ({self.sealed or self._draining})")
            self._draining = move
            try:
                while not (self._active == 0 and quiet()):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SpecError(
                            f"the table's operations in progress did not finish within {timeout} s; not moved"
                        )
                    self._cv.wait(min(left, 0.01))  # parts finish under the table's lock, not this one: polled
            except BaseException:
                self._draining = None
                self._cv.notify_all()
                raise
            self._draining = None
            self.sealed = move
            self._lease_end = time.monotonic() + lease

    def thaw(self, move: str, epoch: int | None = None) -> bool:
        """Let the held operations go on; with ``epoch``, at that placement version (the stale ones are
        refused then).

        Parameters
        ----------
        move : str
            The move that sealed the table.
        epoch : int, optional
            The new placement version of this worker's shard set.

        Returns
        -------
        bool
            Whether ``move`` held the table.
        """
        with self._cv:
            if self.sealed != move:
                return False
            if epoch is not None:
                self.epoch = max(self.epoch, int(epoch))
            self.sealed = None
            self._cv.notify_all()
            return True

    def advance(self, epoch: int) -> None:
        """This worker's shard set changed at placement version ``epoch`` (shards arrived).

        Waits for the operations in progress, so that none planned at the old
        placement sees the new shard set.

        Parameters
        ----------
        epoch : int
            The new placement version.
        """
        with self._cv:
            while self.sealed is not None or self._draining is not None:
                self._cv.wait()
            self._draining = "advance"  # new operations wait, so that those in progress come to an end
            try:
                while self._active:
                    self._cv.wait()
                self.epoch = max(self.epoch, int(epoch))
            finally:
                self._draining = None
                self._cv.notify_all()


def move_out(
    host: ShardHost, name: str, shards: list[int], move: str, lease: float, machine: str | None = None
) -> dict:
    """Seal table ``name`` here and snapshot ``shards`` for a move (the source's first step).

    A disk shard moving to a worker on this machine is not copied: the
    destination reopens its files in place (they are whole: every change
    commits its header), and this worker leaves them alone when it lets the
    shard go (:meth:`HostedTable.lend <gear_flow.distributed.host_tables.HostedTable.lend>`).

    Parameters
    ----------
    host : ShardHost
        This worker's host.
    name : str
        The table's name.
    shards : list of int
        The shards that move.
    move : str
        The move's id.
    lease : float
        Seconds the table stays sealed without a later step of the move
        (:func:`seal_lease`, as the coordinator reads it).
    machine : str, optional
        The destination's machine
        (:func:`~gear_flow.storage.shared.machine_id`); None: another one.

    Returns
    -------
    dict
        ``{shard: {"arrays": ..., "meta": ...}}``, as
        :func:`gear_flow.checkpoint.snapshot_shard` makes them, or
        ``{shard: {"disk": its directory}}`` for a disk shard handed over in
        place.

    Raises
    ------
    SpecError
        A shard is not here, the table is being moved already, or its
        operations in progress did not finish in time (nothing is held).
    """
    from .. import checkpoint as ck
    from ..storage.shared import machine_id

    t = host.table(name)
    ids = sorted({int(s) for s in shards})
    for i in ids:
        t.shard(i)

    t.gate.seal(move, lambda: not t.txns.touches(set(ids)), DRAIN_S, lease)
    try:
        hold(t, ids)  # readers on this host leave these shards' draws to this worker while they move
        in_place = [i for i in ids if t.shards[i].store is not None and machine == machine_id()]
        t.lend(move, in_place)
        out = {}
        for i in ids:
            if i in in_place:
                out[i] = {"disk": str(t.shards[i].tier.directory)}
            else:
                arrays, meta = ck.snapshot_shard(t.shards[i])
                out[i] = {"arrays": arrays, "meta": meta}
    except BaseException:
        resume(t)
        t.end_move(move)
        t.gate.thaw(move)
        raise
    return out


def hold(t: HostedTable, ids: Iterable[int]) -> None:
    """Hold the published selection states of shards ``ids`` of ``t`` (a move out starts).

    Parameters
    ----------
    t : HostedTable
        The table.
    ids : iterable of int
        Its shards that move.
    """
    for i in ids:
        s = t.shards[i]
        if s.published is not None:
            with s.lock:
                s.published.hold()


def resume(t: HostedTable) -> None:
    """Readers may draw again from every shard of ``t`` still here (a move out failed).

    Parameters
    ----------
    t : HostedTable
        The table.
    """
    for s in list(t.shards.values()):
        if s.published is not None:
            with s.lock:
                s.published.resume()


def move_thaw(host: ShardHost, name: str, move: str) -> bool:
    """Undo ``move`` on its source: the held operations go on, the shards stay (the move failed).

    Parameters
    ----------
    host : ShardHost
        This worker's host.
    name : str
        The table's name.
    move : str
        The move's id.

    Returns
    -------
    bool
        Whether the move held the table here.
    """
    t = host.tables.get(name)
    if t is None:
        return False
    if t.gate.sealed == move:
        resume(t)
        t.end_move(move)  # the files of shards handed over in place are this worker's again
    return t.gate.thaw(move)


def move_release(host: ShardHost, name: str, shards: list[int], move: str, epoch: int) -> bool:
    """The move is done: drop ``shards`` here, and refuse what was planned before placement version ``epoch``.

    Parameters
    ----------
    host : ShardHost
        This worker's host.
    name : str
        The table's name.
    shards : list of int
        The shards that moved.
    move : str
        The move's id.
    epoch : int
        The placement version with the shards at their destination.

    Returns
    -------
    bool
        Whether the move held the table here.
    """
    t = host.tables.get(name)
    if t is None or t.gate.sealed != move:
        return False
    t.remove_shards(shards)  # a disk shard's files: kept where the destination maps them, removed where copied
    t.end_move(move)
    return t.gate.thaw(move, epoch)


def move_in(host: ShardHost, name: str, config: dict, move: str, snapshot: dict) -> dict:
    """Build the shards of ``snapshot`` aside for ``move`` (the destination's first step; nothing visible).

    Parameters
    ----------
    host : ShardHost
        This worker's host.
    name : str
        The table's name.
    config : dict
        Its configuration (:meth:`TableConfig.to_dict`, plus
        ``shared_memory``).
    move : str
        The move's id.
    snapshot : dict
        What the source's :func:`move_out` answered: a disk shard handed
        over in place is reopened from its files
        (:func:`~gear_flow.distributed.disk_files.open_shard`), the others
        are built from their copies (a disk shard in new files here).

    Returns
    -------
    dict of int to int
        Items per shard built.

    Raises
    ------
    SpecError
        A shard of the snapshot is hosted here already, or a disk shard
        cannot have its files here.
    CheckpointError
        The snapshot does not fit the table's spec, or a disk shard's
        files fail a check.
    """
    from .. import checkpoint as ck

    check_absent(host, name, snapshot, move)
    t = host.hosted(name, config)
    in_place = {int(i) for i, part in snapshot.items() if "disk" in part}
    built = {}
    try:
        for i, part in sorted(snapshot.items()):
            if int(i) in in_place:
                built[int(i)] = disk_files.open_shard(t, int(i), part["disk"])
                continue
            s = t.build_shard(int(i))
            built[int(i)] = s
            ck.restore_shard(s, part["arrays"], part["meta"])
    except BaseException:
        for i, s in built.items():  # the source's files stay as they are: it serves on from them
            t.release_shards([s], disk_files.KEEP if i in in_place else disk_files.REMOVE)
        raise
    t.set_aside(move, built, in_place)
    if host.tables.was_undone(move):  # while it was built (its coordinator gave up waiting): let go, not kept
        t.uninstall(move)
        raise SpecError(f"move {move!r} of table {name!r} was undone while its copy was built here; not kept")
    return {i: s.size for i, s in built.items()}


def check_absent(host: ShardHost, name: str, shards: Iterable[int], move: str) -> None:
    """Refuse ``move`` onto this worker of ``shards`` it hosts already, or once the move was undone here (its
    coordinator gave up before the request to build reached this worker: the source would be sealed for
    nothing).

    Parameters
    ----------
    host : ShardHost
        This worker's host.
    name : str
        The table's name.
    shards : iterable of int
        The shards that would arrive.
    move : str
        The move's id.

    Raises
    ------
    SpecError
        One of them is hosted here, or the move was undone here.
    """
    t = host.tables.get(name)
    have = [] if t is None else t.hosting(shards)
    if have:
        raise SpecError(f"shard(s) {have} of table {name!r} are on this worker already")
    if host.tables.was_undone(move):
        raise SpecError(f"move {move!r} of table {name!r} was undone on this worker; not begun")


def move_commit(host: ShardHost, name: str, move: str, epoch: int) -> list[int]:
    """Install the shards built for ``move`` at placement version ``epoch`` (the destination's last step).

    Parameters
    ----------
    host : ShardHost
        This worker's host.
    name : str
        The table's name.
    move : str
        The move's id.
    epoch : int
        The placement version with the shards here.

    Returns
    -------
    list of int
        The shards installed.

    Raises
    ------
    SpecError
        Nothing was built here for ``move``.
    """
    t = host.table(name)
    built, done = t.built_for(move)
    if built is None and done is not None:  # again, at a later version (the coordinator's moved meanwhile)
        t.gate.advance(epoch)
        return list(done)
    if built is None:
        raise SpecError(f"no shards of table {name!r} were built on this worker for move {move!r}")
    t.gate.advance(epoch)  # no request planned before it sees the new shards: those that come now are refused
    return t.install(move, built, INSTALLED_KEPT)


def move_abort(host: ShardHost, name: str, move: str) -> bool:
    """Forget the shards built for ``move``, installed or not (it failed before the coordinator placed them);
    a copy still being built for it is let go once built.

    Parameters
    ----------
    host : ShardHost
        This worker's host.
    name : str
        The table's name.
    move : str
        The move's id.

    Returns
    -------
    bool
        Whether anything was built for it here.
    """
    return host.tables.undo_move(name, move)
