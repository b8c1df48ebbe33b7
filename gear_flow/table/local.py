"""A table of in-process shards: the single-process (and per-worker) view.

Inserts are validated whole, routed to shards (episodes never split) and
admitted by the rate limiter atomically; sampling is two-level (shard masses
→ per-shard counts → local selection and gather) and returns the true
probability of every item.  Thread-safe: concurrent writers and samplers are
allowed; a sample holds every shard's lock while it selects and gathers, so
the probabilities it reports are those of one consistent state.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from .. import config
from ..errors import CapacityError, EmptyTableError, SpecError
from ..interrupts import holds_interrupts
from ..keys import decode, shard_parts, shards_present
from ..rate_limiters import RateLimiter
from ..rate_limiters import to_config as limiter_to_config
from ..sample import SampleBatch, SampleBuffers
from ..selectors import Selector
from ..shard import EpisodeBatch, Shard
from ..spec import TableSpec
from . import planner
from .admission import Admission, acquire_all, through_interrupts, timeout_error
from .config import TableConfig, check_timeout, queue_setup
from .datasets import DatasetMethods
from .executor import evict_shards, sample_shards
from .results import InsertResult, UpdateResult
from .routing import item_rows, pick, route
from .validate import (
    as_episode_list,
    check_batch,
    check_episodes,
    check_keys,
    check_priorities,
    check_rng,
    check_sample_args,
    insert_priorities,
    sample_columns,
    seeded_rng,
)

if TYPE_CHECKING:
    from ..writer import EpisodeWriter

logger = logging.getLogger(__name__)


#: a disk table's record of an insert across shards under way (one per insert, named by its first episode id:
#: inserts from several threads at once each keep their own), removed once every shard has its part
_INTENT = "insert-{}.intent"
#: the record's name before it was one per insert (a table cut short by a kill then may still hold one)
_ONE_INTENT = "insert.intent"
#: a disk table's record of its creation under way (the shard directories it makes), removed once its manifest
#: is written: a creation cut short (a kill) left shard files that no manifest described, which open() refused
#: (no manifest) and a new table refused to overwrite (a shard there); the next creation removes them
_CREATING = "creating.json"


def _lock_directory(root):
    """An exclusive lock on a disk table's directory (``flock`` of its ``.lock`` file), held while a table has
    it open: a second table on the same files, in this process or another, would hand out the same keys and
    episode ids and write the same ring slots.  Released when the returned file is closed (or its process
    ends).

    Parameters
    ----------
    root : pathlib.Path
        The table's directory.

    Returns
    -------
    file
        The open ``.lock`` file: closing it releases the lock.

    Raises
    ------
    CheckpointError
        A table has the directory open.
    """
    import fcntl

    from ..checkpoint import file_mode
    from ..errors import CheckpointError

    # (private, as every file of the table: its files hold replay data)
    f = os.fdopen(os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, file_mode()), "r+b")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise CheckpointError(f"{root} is open in another table (in this process or another); close it first") from None
    _HELD_LOCKS.add(f)
    return f


#: the directory locks this process holds: a forked child (a DataLoader's worker) closes its copies at once,
#: for a flock belongs to every copy of its descriptor and the directory would stay locked while any child
#: lived, after the table was closed or its process killed (a child that execs has them closed by O_CLOEXEC)
_HELD_LOCKS: weakref.WeakSet = weakref.WeakSet()


def _drop_inherited_locks() -> None:
    for f in list(_HELD_LOCKS):
        f.close()  # (the child's copy of the descriptor: the parent's lock stays while it holds its own)
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


_HOST = contextlib.nullcontext()  # host buffers gather in no stream (one reusable context, not one a sample)


#: what a disk shard's files are laid out for (its layout records them; the manifest must agree)
_LAID_OUT = ("spec", "sampler", "remover", "max_times_sampled")


def _begin_creation(root, dirs: list[str]) -> None:
    """Record that a disk table is being created in ``root`` (whose lock the caller holds) with shard
    directories ``dirs``, after removing what a creation there cut short left (the shard directories its
    record names; nothing else is touched).

    Raises
    ------
    SpecError
        ``root`` holds a table (a manifest) after all: one created since the caller looked.
    """
    import shutil

    from .. import checkpoint as ck
    from ..errors import SpecError

    if (root / "manifest.json").exists():
        raise SpecError(f"{root} already holds a table; open it with LocalTable.open({str(root)!r})")
    rec = root / _CREATING
    if rec.exists():
        try:
            left = json.loads(rec.read_text())["dirs"]
        except (OSError, ValueError, KeyError, TypeError):
            left = []
        for name in left:
            if isinstance(name, str) and name.startswith("shard-") and "/" not in name:
                shutil.rmtree(root / name, ignore_errors=True)
    ck.atomic_write(rec, json.dumps({"dirs": dirs}))


#: the counts a disk table's manifest keeps of its shards when it took its limiter's (see LocalTable.open)
_COUNTED = ("inserts", "samples", "deletes", "unsampled")


def _count_of(state: dict, key: str) -> int:
    """A disk table's counter from its manifest: an int >= 0 (ValueError otherwise, named)."""
    v = state[key]
    if type(v) is not int or v < 0:
        raise ValueError(f"state {key!r} is {v!r}, not a count")
    return v


class LocalTable(DatasetMethods):
    """Replay table whose shards live in this process.

    Parameters
    ----------
    spec : TableSpec
        Columns, capacity per shard, number of shards, item unit, max_size.
    sampler : Selector, default Uniform()
        How items are sampled.
    remover : Selector, default Fifo()
        Which items are evicted when the table exceeds ``max_size``.
    rate_limiter : RateLimiter, default MinSize(1)
        Global across the shards.
    max_times_sampled : int, default 0
        Remove an item after this many samples (0: never; at most 2**31 - 1).
    boundary : {"strict", "pad_tail", "pad_head"}, optional
        Default window boundary mode for ``sample`` (config ``table.boundary``).
    tier : {"host", "pinned", "device", "disk"}, optional
        Storage tier of the shards (config ``table.tier``).  ``disk``: each
        shard's arrays are memory-mapped files under ``path`` (see
        :mod:`gear_flow.storage.disk_state`), reopened by :meth:`open`.
    path : str or os.PathLike, optional
        The directory of a ``disk`` table (config ``disk.path``); it must not
        hold a table yet.
    routing : {"balanced", "round_robin"}, optional
    timeout : float, optional
        Default seconds a blocking call waits (None: forever).
    seed : int, optional
        Seeds the table's random generator (sampling, routing ties); config
        ``table.seed`` when None.
    shard_ids : iterable of int, optional
        Ids of the shards to build (default ``0 .. num_shards - 1``); a
        restore passes the checkpoint's.  Item keys encode the shard id.

    Raises
    ------
    SpecError
        An invalid argument (named in the message, with what is allowed).

    Examples
    --------
    >>> import numpy as np
    >>> from gear_flow import ColumnSpec, TableSpec, LocalTable, Prioritized
    >>> spec = TableSpec((ColumnSpec("obs", (3,), np.float32), ColumnSpec("reward", (), np.float32)),
    ...                  capacity=1000)
    >>> table = LocalTable(spec, sampler=Prioritized(alpha=0.6, beta=0.4), seed=0)
    >>> _ = table.insert({"obs": np.zeros((10, 3)), "reward": np.ones(10)})
    >>> batch = table.sample(batch_size=4, length=5)
    >>> tuple(batch["obs"].shape), tuple(batch.mask.shape)
    ((4, 5, 3), (4, 5))
    """

    #: its calls hold an interrupt that finds them changing the table to their end (a writer's own step after an
    #: insert holds it with them; a distributed table's blocking call must stay interruptible while it waits)
    _holds_interrupts = True

    def __init__(
        self,
        spec: TableSpec,
        *,
        sampler: Selector | None = None,
        remover: Selector | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int = 0,
        boundary: str | None = None,
        tier: str | None = None,
        path: str | os.PathLike[str] | None = None,
        routing: str | None = None,
        timeout: float | None = None,
        seed: int | None = None,
        shard_ids: Iterable[int] | None = None,
        _open: bool = False,
    ) -> None:
        cfg = TableConfig.build(
            spec,
            sampler=sampler,
            remover=remover,
            rate_limiter=rate_limiter,
            max_times_sampled=max_times_sampled,
            boundary=boundary,
            routing=routing,
            tier=tier,
            timeout=timeout,
        )
        self.cfg = cfg
        self.spec = spec
        self.rate_limiter = copy.deepcopy(cfg.rate_limiter)  # a limiter given to two tables: counters each
        self.sampler_proto = cfg.sampler
        self.remover_proto = cfg.remover
        self.max_times_sampled = cfg.max_times_sampled
        self.boundary = cfg.boundary
        self.routing = cfg.routing
        self.timeout = cfg.timeout
        ids = list(range(spec.num_shards)) if shard_ids is None else list(shard_ids)
        self.path = None
        tiers = {i: cfg.tier for i in ids}
        if cfg.tier == "disk":
            tiers = self._disk_tiers(path, ids, _open)
        self.shards = [
            Shard(
                spec,
                i,
                cfg.sampler.clone(),
                cfg.remover.clone(),
                max_times_sampled=cfg.max_times_sampled,
                tier=tiers[i],
            )
            for i in ids
        ]
        self._by_id = {s.shard_id: s for s in self.shards}
        self._locks = tuple(s.lock for s in self.shards)  # a sample takes them all, in this order
        self.rng = seeded_rng(seed, "table.seed")
        self._admission = Admission()
        self._cond = self._admission.cond
        self._rr = 0
        self._next_episode_id = 0
        self._stamp = 0
        self._evict_lock = threading.Lock()
        self._page_ins = None  # (time, bytes read from storage) at the last info(): the page-in rate
        self._rolled_back = 0  # (a reopened disk table's: see _roll_back_cut_insert)
        self._checked = {}  # sample arguments checked once: (B, L, boundary, columns) -> (columns, its buffers)
        self._settled = None  # a disk table's counts at a moment no call was under way (see _write_manifest)
        if self.path is not None and not _open:
            self._write_manifest()
            os.unlink(self.path / _CREATING)  # (the manifest describes the table now)

    def _disk_tiers(self, path, ids: list[int], opening: bool) -> dict:
        """One :class:`~gear_flow.storage.disk.DiskTier` per shard, under ``path`` (config ``disk.path``)."""
        from pathlib import Path

        from ..checkpoint import make_dir
        from ..errors import SpecError
        from ..storage.disk import DiskTier

        path = config.get("disk.path", path)
        if path is None:
            raise SpecError("a disk table needs a directory: pass path= (or set gear-flow.disk.path)")
        root = Path(path).absolute()
        if not opening and (root / "manifest.json").exists():
            raise SpecError(f"{root} already holds a table; open it with LocalTable.open({str(root)!r})")
        if not opening:
            make_dir(root)
        self._dir_lock = _lock_directory(root)
        try:
            if not opening:
                _begin_creation(root, [f"shard-{i}" for i in ids])
            tiers = {i: DiskTier(root / f"shard-{i}", create=not opening) for i in ids}
        except BaseException:
            self._dir_lock.close()
            raise
        self.path = root
        return tiers

    def _write_manifest(self, settled: bool = False) -> None:
        """The table's manifest in its directory (a disk table): configuration, limiter and table counters.

        The limiter's counts go beside the shards' counts of the same moment, one at which no call was under
        way (``settled``: the table's creation, a restore's end, an open; else the last such moment's): a
        reopen after a kill adds to the former what the shards committed since (their headers are committed
        with every change, the manifest only here).  Taken while a call was under way, the two disagreed (an
        insert admitted counts in the limiter before its shards store it) and a reopen counted it twice.
        """
        from .. import checkpoint as ck

        if settled or self._settled is None:
            self._settle()
        with self._cond:
            state = {"next_episode_id": self._next_episode_id, "stamp": self._stamp, "rr": self._rr}
            cfg = self.config()
            cfg["rate_limiter"] = {**cfg["rate_limiter"], "state": dict(self._settled[0])}
            state["counted"] = dict(self._settled[1])
        files = {str(s.shard_id): {"dir": s.tier.directory.name} for s in self.shards}
        ck.atomic_write(self.path / "manifest.json", json.dumps(ck.new_manifest("disk", cfg, state, files), indent=1))

    def _settle(self) -> None:
        """Take the limiter's and the shards' counts as they are (no call under way) for the next manifests."""
        with self._cond:
            self._settled = (limiter_to_config(self.rate_limiter)["state"], self._limiter_counts())

    def _limiter_counts(self) -> dict[str, int]:
        """What the limiter counts, as the shards count it: items inserted, handed out and removed (evicted by
        a ring's overwrite or the remover, deleted, expired)."""
        c = [s.counters for s in self.shards]
        return {
            "inserts": sum(x.inserted for x in c),
            "samples": sum(x.sampled for x in c),
            "deletes": sum(x.evicted + x.removed + x.deleted + x.expired for x in c),
            # of those, the ones that left unsampled (a queue no longer counts them as waiting: forget())
            "unsampled": sum(x.evicted + x.removed + x.deleted for x in c),
        }

    # -- construction helpers ------------------------------------------------------
    @classmethod
    def queue(cls, spec: TableSpec, size: int, **kw: Any) -> LocalTable:
        """A FIFO queue of ``size`` items: each sampled once, inserts block when full.

        Sets ``sampler`` and ``remover`` to ``Fifo()``, ``max_times_sampled``
        to 1 and the rate limiter to ``Queue(size)``: samples block while the
        queue is empty.

        Parameters
        ----------
        spec : TableSpec
            Columns and shards; its ``max_size`` is set to ``size``.
        size : int
            Items the queue holds at most.
        **kw
            Other keyword arguments of :class:`LocalTable` (``timeout``,
            ``seed`` ...); not the selectors, limiter or
            ``max_times_sampled``.

        Returns
        -------
        LocalTable
            The queue.

        Raises
        ------
        SpecError
            ``size`` or another argument is invalid.
        """
        spec, args = queue_setup(spec, size)
        return cls(spec, **args, **kw)

    @classmethod
    def stack(cls, spec: TableSpec, size: int, **kw: Any) -> LocalTable:
        """A LIFO stack of ``size`` items: each sampled once, newest first.

        As :meth:`queue`, with ``Lifo()`` selectors and a ``Stack(size)``
        limiter.

        Parameters
        ----------
        spec : TableSpec
            Columns and shards; its ``max_size`` is set to ``size``.
        size : int
            Items the stack holds at most.
        **kw
            Other keyword arguments of :class:`LocalTable`.

        Returns
        -------
        LocalTable
            The stack.

        Raises
        ------
        SpecError
            ``size`` or another argument is invalid.
        """
        spec, args = queue_setup(spec, size, lifo=True)
        return cls(spec, **args, **kw)

    # -- state ---------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Items currently in the table."""
        if len(self.shards) == 1:
            return self.shards[0].size
        return sum(s.size for s in self.shards)

    def __len__(self) -> int:
        """Items in the table (:attr:`size`)."""
        return self.size

    def close(self) -> None:
        """Refuse further calls and wake every blocked caller with TableClosedError.

        A disk table is flushed first (:meth:`flush`) and its files stay:
        :meth:`open` reopens it.  A table on a ``shared`` tier unlinks its
        named segments (the memory goes with the last mapping).
        """
        with self._cond:
            closed = self._admission.closed
            self._admission.close()
        if self.path is None and not closed:  # named memory outlives the process's references otherwise
            for s in self.shards:
                release = getattr(s.tier, "release", None)
                if release is not None:
                    release()
        if self.path is not None and not closed:
            try:
                self._flush()
                for s in self.shards:
                    s.tier.release()
            finally:
                self._dir_lock.close()  # (another table may open the directory now)

    def flush(self) -> dict:
        """Make a disk table durable: its files hold everything inserted so far, checksummed (no pickle).

        A disk table is its own checkpoint: each shard's dirty pages are
        written, the checksums of what changed since the last flush
        recorded and its header committed and fsync'ed, one shard at a time
        under its lock (inserts and samples of the other shards go on).
        Without a flush, what was committed survives the process (the page
        cache keeps it), not the machine.

        Returns
        -------
        dict
            ``seconds`` (float, wall time) and ``bytes_checksummed`` (int).

        Raises
        ------
        SpecError
            The table is not on the ``disk`` tier.
        """
        from ..errors import SpecError

        if self.path is None:
            raise SpecError(f"flush() is for disk tables; this one is on the {self.cfg.tier!r} tier (see checkpoint())")
        self._check_open()
        return self._flush()

    def _flush(self) -> dict:
        t0, done = time.perf_counter(), 0
        for s in self.shards:
            with s.lock:
                done += s.store.flush()["bytes_checksummed"]
        self._write_manifest()
        return {"seconds": time.perf_counter() - t0, "bytes_checksummed": done}

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        verify: str = "quick",
        seed: int | None = None,
        timeout: float | None = None,
    ) -> LocalTable:
        """Reopen a disk table from its files, in place (nothing is copied; pages are read when sampled).

        Every shard's layout, header and file sizes are checked before any
        is mapped.  A shard whose process was killed comes back with every
        insert that completed; an insert cut short is dropped, with the
        episodes it was overwriting (``recovered`` in :meth:`info`).

        Parameters
        ----------
        path : str or os.PathLike
            The table's directory (``LocalTable(..., tier="disk", path=...)``).
        verify : {"quick", "full"}, default "quick"
            ``full`` also recomputes the checksum of every MiB unchanged
            since the last flush (reads the whole table).
        seed : int, optional
            Seeds the table's random generator.
        timeout : float, optional
            Default seconds a blocking call waits (config ``table.timeout``).

        Returns
        -------
        LocalTable
            The table, on the ``disk`` tier.

        Raises
        ------
        CheckpointError
            No disk table at ``path``, or a file that fails verification
            (corrupted, truncated, another version); nothing is opened.
        SpecError
            ``verify`` is not ``quick`` or ``full``.
        """
        from pathlib import Path

        from .. import checkpoint as ck
        from ..errors import CheckpointError, SpecError
        from ..storage import disk_state

        if verify not in ("quick", "full"):
            raise SpecError(f"verify ({verify!r}) must be 'quick' or 'full'")
        root = Path(path).absolute()
        if (root / _CREATING).exists() and not (root / "manifest.json").exists():
            raise CheckpointError(
                f"{root}: the creation of a disk table there was cut short (its process ended before the table "
                "was made); it holds no data: create the table again with this path"
            )
        m = ck.read_manifest(root)
        if m.get("kind") != "disk":
            raise CheckpointError(f"{root} holds a {m.get('kind')!r} checkpoint, not a disk table (LocalTable.restore)")
        cfg = m["table"]
        try:  # everything checked before any shard is mapped: a refused open writes nothing
            next_id, stamp, rr = (_count_of(m["state"], k) for k in ("next_episode_id", "stamp", "rr"))
            counted = m["state"].get("counted")  # (none in a manifest of an older release; nor "unsampled")
            counted = None if counted is None else {k: _count_of(counted, k) for k in _COUNTED if k in counted}
            shard_ids = sorted(int(k) for k in m["files"])
            n = int(cfg["spec"]["num_shards"])
            if shard_ids != list(range(n)):
                raise CheckpointError(f"{root}: the manifest lists shards {shard_ids} of a table of {n}")
            headers = {}
            for i in shard_ids:
                d = root / m["files"][str(i)]["dir"]
                layout, headers[i] = disk_state.check(d)
                # the spec and selectors a shard's files were laid out for (trees, counts), as the manifest says
                other = [k for k in _LAID_OUT if layout["table"].get(k) != cfg.get(k)]
                if layout["shard"] != i or other:
                    why = f" (laid out for another {other[0].replace('_', ' ')})" if other else ""
                    raise CheckpointError(f"{d} is not shard {i} of the table at {root}{why}")
                if verify == "full":  # the files as the last commit left them, before a reopen changes any
                    disk_state.verify_files(d, layout, headers[i])
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{root}: the manifest does not describe a table ({e})") from None
        try:
            table = cls._from_config(
                cfg, tier="disk", path=root, timeout=timeout, seed=seed, shard_ids=shard_ids, _open=True
            )
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{root}: the manifest does not describe a table ({e})") from None
        table._rolled_back, cut_end = table._roll_back_cut_insert()  # (before the limiter's counts are taken)
        table._next_episode_id = max([next_id, cut_end] + [int(h["episode_id_end"]) for h in headers.values()])
        table._stamp = max([stamp] + [s._clock for s in table.shards])
        table._rr = rr % len(table.shards)
        if counted is not None:  # what the shards committed after the manifest was written (a kill since)
            now, lim = table._limiter_counts(), table.rate_limiter
            lim.restore({k: getattr(lim.state, k) + now[k] - counted[k] for k in ("inserts", "samples", "deletes")})
            if "unsampled" in counted:  # items deleted or evicted since: a queue's wait no more, as they would have
                lim.forget(now["unsampled"] - counted["unsampled"])
        # an insert whose shards committed before a kill that came before the table evicted down to max_size
        table._enforce_max_size()
        table._settle()
        return table

    def __enter__(self) -> LocalTable:
        """The table itself; it is closed on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the table (:meth:`close`)."""
        self.close()

    def _check_open(self):
        self._admission.check_open()

    def _wait(self, kind: str, pred, timeout, what: str, reported: float | None = None):
        """Wait (holding ``self._cond``) until this call heads its kind's line and ``pred()``;
        raise on timeout or close.  The caller applies its admission, then ``_admission.done(kind)``.
        ``reported``: the timeout the error names (a call waiting again: its whole, not what was left)."""
        make = timeout_error(what, self.rate_limiter, lambda: self.size)
        timed_out = make if reported is None else (lambda _left: make(reported))
        self._admission.wait(kind, pred, self.timeout if timeout is None else check_timeout(timeout), timed_out)

    @property
    def admitted_size(self) -> int:
        """Items stored plus items of admitted inserts still being written (what insert admission sees)."""
        return self.size + self._admission.in_flight

    # -- writing --------------------------------------------------------------------------
    @holds_interrupts
    def insert(
        self,
        episodes: Mapping | Sequence[Mapping],
        priorities: ArrayLike | Sequence[ArrayLike] | float | None = None,
        *,
        timeout: float | None = None,
        shard: int | None = None,
    ) -> InsertResult:
        """Insert whole episodes, all or nothing.

        Blocks until the rate limiter admits every item (or ``timeout``);
        episodes are routed to shards (never split).  When the table then
        exceeds ``max_size``, the remover evicts the excess.

        Parameters
        ----------
        episodes : mapping or sequence of mappings
            Each maps every column to an array ``[T, *shape]`` (T >= 1).
        priorities : None, float, array or list of arrays
            Per item: None (the shard's running max priority, as in PER), one
            value for all, a flat array over all items of all episodes, or one
            array per episode.
        timeout : float, optional
            Seconds to wait for the rate limiter.
        shard : int, optional
            Put every episode on this shard (writer affinity).

        Returns
        -------
        InsertResult
            Episode ids, the key of each episode's first item, each
            episode's shard and the number of items created.

        Raises
        ------
        InvalidDataError
            Episodes that do not match the spec, or not one priority per
            item.
        InvalidPriorityError
            A priority that is NaN, infinite or negative, or one the sampler
            or remover cannot represent.
        CapacityError
            An episode longer than a shard's capacity, more steps on one
            shard in one call than its capacity (insert fewer per call), or
            (queue, stack) an insert that would overwrite items not yet
            handed out.
        SpecError
            ``shard`` out of range, or more items than the limiter admits at
            once.
        RateLimitTimeout
            Not admitted within ``timeout``.
        TableClosedError
            The table is closed.
        """
        self._check_open()
        checked, lengths = check_episodes(self.spec, as_episode_list(episodes))
        return self._insert(lengths, partial(pick, checked), priorities, timeout, shard)

    @holds_interrupts
    def insert_batch(
        self,
        columns: Mapping[str, ArrayLike],
        priorities: ArrayLike | float | None = None,
        *,
        timeout: float | None = None,
        shard: int | None = None,
    ) -> InsertResult:
        """Insert ``B`` trajectories of ``T`` steps given as ``[B, T, *shape]`` arrays, all or nothing.

        What a vectorised collector produces (``B`` environments, ``T`` steps
        each; TorchRL's ``extend`` of a ``[B, T]`` batch).  Each column is
        validated once and written with one copy per shard it lands on, so on
        the GPU tiers collection runs at copy bandwidth: device arrays (CuPy,
        trajectories an actor made on its GPU) stay on the device, host arrays
        cross once.  Episode ``b`` is row ``b``; each becomes one episode as
        with :meth:`insert`.

        Parameters
        ----------
        columns : mapping of str to array
            Every column, ``[B, T, *shape]`` (NumPy or CuPy), ``B, T >= 1``.
        priorities : None, float or array
            As :meth:`insert`: None, one value, or one per item (``B * T`` for
            step items, ``B`` for episode items), in row order.
        timeout : float, optional
            Seconds to wait for the rate limiter.
        shard : int, optional
            Put every trajectory on this shard.

        Returns
        -------
        InsertResult
            As :meth:`insert`, one episode per row.

        Raises
        ------
        InvalidDataError, InvalidPriorityError, CapacityError, SpecError, RateLimitTimeout, TableClosedError
            As :meth:`insert`.
        """
        self._check_open()
        arrays, B, T = check_batch(self.spec, columns)
        lengths = np.full(B, T, dtype=np.int64)

        def chunks(sel: np.ndarray) -> list[dict]:
            # runs of consecutive rows are contiguous [n * T, *shape] views: one copy per run and column
            cuts = np.flatnonzero(np.diff(sel) != 1) + 1
            return [
                {c: a[int(run[0]) : int(run[-1]) + 1].reshape(-1, *a.shape[2:]) for c, a in arrays.items()}
                for run in np.split(sel, cuts)
            ]

        return self._insert(lengths, chunks, priorities, timeout, shard)

    def _insert(self, lengths: np.ndarray, chunks, priorities, timeout, shard) -> InsertResult:
        """Admit, route and store validated episodes of ``lengths``; ``chunks(sel)`` gives the row
        chunks of episodes ``sel`` (in order) for one shard."""
        check_timeout(timeout)  # (before anything is counted or any line joined)
        step_items = self.spec.item_unit == "step"
        n_items = int(lengths.sum()) if step_items else len(lengths)
        pr = insert_priorities(priorities, lengths, step_items)
        if pr is not None:
            self.cfg.check_priorities(pr)
        dest = route(lengths, len(self.shards), self.spec.capacity, self.routing, self._rr, shard)
        self.rate_limiter.check_insert_size(n_items)
        item_off = np.concatenate(([0], np.cumsum(lengths if step_items else np.ones_like(lengths))))
        adm = self._admission
        with self._cond:
            self._wait(
                "insert",
                lambda: self.rate_limiter.can_insert(n_items, self.admitted_size),
                timeout,
                f"an insert of {n_items} items",
            )
            if self.cfg.lossless:
                # a queue or stack hands out every item: refuse (before anything is counted or
                # written) an insert that would make a shard's ring overwrite a waiting item
                try:
                    for s in shards_present(dest):
                        self._check_ring_room(int(s), lengths[dest == s])
                except BaseException:
                    adm.done("insert")
                    raise
            ids = self._next_episode_id + np.arange(len(lengths), dtype=np.int64)
            self._next_episode_id += len(lengths)
            stamps = self._stamp + item_off[:-1]
            self._stamp += n_items
            self._rr = (self._rr + len(lengths)) % len(self.shards)
            self.rate_limiter.on_insert(n_items)
            adm.admitted(n_items)
            adm.done("insert")
            # Take the destination shards' locks before any sample is admitted after this
            # insert: the limiter already counts these items, so a sample admitted now must
            # find them stored (a Queue would otherwise hand out an item twice or block).
            # Same order as sample(): _cond, then shard locks in ascending order.
            held = [self.shards[int(s)].lock for s in shards_present(dest)]
            try:
                acquire_all(held)
            except BaseException:  # interrupted while it waited: nothing written, so nothing counted
                self.rate_limiter.give_back_insert(n_items)
                adm.withdrawn(n_items)
                self._cond.notify_all()
                raise
        first_keys = np.empty(len(lengths), dtype=np.int64)
        evicted = 0  # items the rings' overwrite removed: deletes to the limiter, as every removal is
        stored = 0  # items the shards took: an insert that raised before some (an interrupt) counts only those
        try:
            parts = shards_present(dest)
            intent = self._begin_across(ids, len(parts))
            for s in parts:
                sel = np.flatnonzero(dest == s)
                p = item_rows(pr, item_off, sel)
                batch = EpisodeBatch(chunks(sel), lengths[sel], ids[sel], stamps[sel], p)
                before = self.shards[s].counters.evicted
                fk, _ = self.shards[s].insert(batch)
                stored += int(item_off[sel + 1].sum() - item_off[sel].sum())
                evicted += self.shards[s].counters.evicted - before
                first_keys[sel] = fk
            if intent is not None:  # every shard has its part: nothing to take back
                intent.unlink()
        finally:
            for lk in reversed(held):
                lk.release()
            with through_interrupts(self._cond):  # written (or not): counted either way
                adm.landed(n_items)
                if stored < n_items:
                    self.rate_limiter.give_back_insert(n_items - stored)
                    self._cond.notify_all()
                if evicted:
                    self.rate_limiter.on_delete(evicted)
                    self.rate_limiter.forget(evicted)
        self._enforce_max_size()
        self._admission.wake()
        return InsertResult(ids, first_keys, dest, n_items)

    def _check_ring_room(self, shard: int, lengths: np.ndarray) -> None:
        """Raise if storing episodes of ``lengths`` on ``shard`` would overwrite a live item."""
        s = self.shards[shard]
        with s.lock:
            lost = s.live_overwritten(int(lengths.sum()))
        if lost:
            raise CapacityError(
                f"shard {shard}: storing {int(lengths.sum())} steps would overwrite {lost} item(s) still waiting "
                f"to be sampled: its ring holds {s.capacity} steps, reused in the order they were written, and "
                f"{self.rate_limiter!r} never drops an item; sample the oldest waiting items first (a Stack's "
                f"bottom, a Queue's item others were deleted around), or build the table with a larger capacity"
            )

    def writer(
        self, max_episode_length: int | None = None, shard: int | None = None, timeout: float | None = None
    ) -> EpisodeWriter:
        """A streaming writer: ``append(step)`` … ``end_episode()``; see :class:`EpisodeWriter`.

        Parameters
        ----------
        max_episode_length : int, optional
            End an episode automatically (``truncated``) when it reaches this
            many steps; None: episodes end only at ``end_episode``.
        shard : int, optional
            Insert every episode on this shard.
        timeout : float, optional
            Seconds each insert waits for the rate limiter; default the
            table's.

        Returns
        -------
        EpisodeWriter
            Buffers steps and inserts each episode whole when it ends.

        Raises
        ------
        SpecError
            ``max_episode_length`` is not a positive integer or None.
        """
        from ..writer import EpisodeWriter

        return EpisodeWriter(self, max_episode_length=max_episode_length, shard=shard, timeout=timeout)

    def _enforce_max_size(self) -> None:
        with self._evict_lock:
            self._enforce_max_size_locked()

    def _enforce_max_size_locked(self) -> None:
        if not self.cfg.evicts_to_max_size(self.size):
            return
        excess = self.size - self.spec.max_size
        removed = evict_shards(self._by_id, excess, self.remover_proto.deterministic, self.rng)
        with through_interrupts(self._cond):
            self.rate_limiter.on_delete(removed)
            self.rate_limiter.forget(removed)  # unsampled: a queue's no longer wait

    # -- sampling -----------------------------------------------------------------------------
    @holds_interrupts
    def sample(
        self,
        batch_size: int,
        length: int = 1,
        *,
        columns: str | Sequence[str] | None = None,
        boundary: str | None = None,
        timeout: float | None = None,
        out: SampleBuffers | None = None,
        rng: np.random.Generator | None = None,
    ) -> SampleBatch:
        """Sample ``batch_size`` windows of ``length`` steps.

        Blocks until the rate limiter admits the whole batch (or ``timeout``).
        Items are drawn two-level (shard, then item) under every shard's lock,
        and each row reports the true probability of its draw.

        Parameters
        ----------
        batch_size : int
            ``B``, windows in the batch (>= 1).
        length : int, default 1
            ``L``, steps per window (>= 1).
        columns : str or sequence of str, optional
            Columns to gather (default: all of the spec).
        boundary : {"strict", "pad_tail", "pad_head"}, optional
            Windows crossing an episode's end: excluded (``strict``) or
            zero-padded with ``mask`` False; default the table's ``boundary``.
        timeout : float, optional
            Seconds to wait for admission; default the table's ``timeout``
            (None: forever).
        out : SampleBuffers, optional
            Buffers to gather into (reused between calls); must match
            ``columns``, ``batch_size``, ``length`` and the table's tier.
        rng : numpy.random.Generator, optional
            Replaces the table's generator for this call (streams give each
            rank its own, so that ranks draw independent batches).

        Returns
        -------
        SampleBatch
            ``data`` ``[B, L, *column.shape]`` per column, ``keys``,
            ``probabilities``, importance ``weights``, ``mask`` ``[B, L]``,
            ``episode_ids``, ``timesteps``, ``priorities``,
            ``times_sampled``; see :class:`~gear_flow.sample.SampleBatch`.

        Raises
        ------
        SpecError
            Invalid ``batch_size``, ``length``, ``boundary``, ``columns`` or
            ``out``, or a batch larger than the limiter allows.
        EmptyTableError
            Nothing can be sampled: the table is empty, or no stored episode
            fits a ``strict`` window of ``length`` steps
            (:class:`~gear_flow.errors.WindowTooLongError`).
        RateLimitTimeout
            The limiter did not admit the batch within ``timeout``; or, with
            ``max_times_sampled``, the items left could not fill it by then
            (a batch waits for inserts, and takes nothing meanwhile).
        TableClosedError
            The table is closed.
        """
        self._check_open()
        boundary = self.boundary if boundary is None else boundary
        columns, out = self._sample_args(batch_size, length, boundary, columns, out)
        check_rng(rng)
        timeout = self.timeout if timeout is None else check_timeout(timeout)
        start, what, after = time.monotonic(), None, None
        while True:
            left = timeout if after is None or timeout is None else max(0.0, start + timeout - time.monotonic())
            size, short = self._sample_admitted(out, batch_size, length, boundary, columns, rng, left, timeout,
                                                what, after)  # fmt: skip
            if short is None:
                break
            # nothing taken and the admission given back: it waits for the next insert, as Reverb's sample waits
            have, after = short
            what = f"a sample of {batch_size} (the items left may go {have} more times)"
            if timeout is not None and time.monotonic() - start >= timeout:  # (inserts keep coming, never enough)
                raise timeout_error(what, self.rate_limiter, lambda: self.size)(timeout)
        self._admission.wake()
        return out.batch(size)

    def _sample_args(self, B, L, boundary, columns, out) -> tuple:
        """The checked columns and buffers of a sample; the checks of a ``(B, L, boundary, columns, out)``
        seen before are not made again (none of them can fail a second time: a table's spec, tier and
        limiter do not change, nor do a SampleBuffers' shapes)."""
        try:
            key = (type(B), B, type(L), L, boundary, columns if type(columns) is not list else tuple(columns))
            known = self._checked.get(key)
        except TypeError:  # unhashable columns: checked below, every time
            key = known = None
        if known is not None and out is not None and known[1]() is out:  # (a weak reference: kept alive by no one)
            return known[0], out
        check_sample_args(B, L, boundary, self.spec.capacity)
        columns = sample_columns(self.spec, columns)
        tier = self.shards[0].tier
        if out is None:
            out = SampleBuffers(self.spec, columns, B, L, tier=tier)
        else:
            out.check(self.spec, columns, B, L, tier)
        self.cfg.check_sample_size(B)
        if key is not None and out is not None:  # the buffers of a steady state (a call without: new ones)
            if len(self._checked) >= 64:
                self._checked.clear()
            self._checked[key] = (columns, weakref.ref(out))
        return columns, out

    def _sample_admitted(self, out, B, L, boundary, columns, rng, timeout, whole, what, after) -> tuple:
        """Admit and gather one batch: ``(size, None)``; or, when its items left cannot fill it
        (``max_times_sampled``), nothing taken and the admission given back, ``(None, (rows they could
        give, inserts stored when it was admitted))``.  ``after``: admitted once more inserts are stored;
        ``timeout`` what is left of the call's ``whole``."""
        adm = self._admission
        with self._cond:
            if not (after is None and adm.admit_now("sample", self._can_sample, B)):
                self._wait_to_sample(B, timeout, whole, what, after)
            self.rate_limiter.on_sample(B)
            seen, had = adm.arrivals, self.size
            # Take the shard locks before any other call is admitted: an insert admitted
            # after this sample must not reach the shards before the sample has taken
            # (and, with max_times_sampled, expired) its items.  Otherwise the table
            # briefly exceeds max_size and the remover evicts an item nobody sampled: a
            # Queue or Stack loses it and its consumer blocks forever.  Safe order: no
            # code takes ``_cond`` while holding a shard lock.
            try:
                acquire_all(self._locks)
            except BaseException:  # interrupted while it waited: nothing taken, so nothing counted
                self.rate_limiter.give_back_sample(B)
                self._cond.notify_all()
                raise
        try:
            try:
                with out.gather_stream() if out.on_device else _HOST:  # device: on the learner's torch stream
                    size = self.size
                    expired = sample_shards(
                        self._by_id, self.cfg.plan, out, B, L, boundary, columns, self.rng if rng is None else rng,
                        self.cfg.beta, "the table",
                    )  # fmt: skip
            finally:
                for sh in reversed(self.shards):
                    sh.lock.release()
        except planner.ShortOfItems as e:
            with through_interrupts(self._cond):
                self.rate_limiter.give_back_sample(B)
                self._cond.notify_all()
            return None, (e.have, seen)
        except EmptyTableError:
            if not had or not planner.short_not_empty(size, L, boundary):  # none when admitted, or
                with through_interrupts(self._cond):  # items none of whose windows fit: the call's own error
                    self.rate_limiter.give_back_sample(B)
                raise
            with through_interrupts(self._cond):
                self.rate_limiter.give_back_sample(B)
                self._cond.notify_all()
            return None, (0, seen)
        except BaseException:
            with through_interrupts(self._cond):
                self.rate_limiter.give_back_sample(B)
            raise
        if expired:  # the limiter's counts change under its lock, taken (as always) before no shard lock
            with through_interrupts(self._cond):
                self.rate_limiter.on_delete(sum(expired.values()))
        return size, None

    def _begin_across(self, ids: np.ndarray, n_shards: int):
        """A disk table's insert across ``n_shards`` > 1 shards: its record (:data:`_INTENT`, its episode ids)
        before any shard writes, for a reopen after a kill that cut it short (:meth:`_roll_back_cut_insert`);
        None for any other insert.  Each shard commits its own part: without the record, the parts of the
        shards written before the kill stayed and the insert was half applied."""
        if self.path is None or n_shards < 2:
            return None
        from .. import checkpoint as ck

        intent = self.path / _INTENT.format(int(ids[0]))
        with ck._create(intent, ck.file_mode()) as f:  # (kept by the page cache across a kill, as commits are)
            f.write(json.dumps({"first_episode_id": int(ids[0]), "episodes": len(ids)}).encode())
        return intent

    def _roll_back_cut_insert(self) -> tuple[int, int]:
        """On reopening a disk table: each insert across shards that a kill cut short (its :data:`_INTENT` left)
        is taken back from the shards that had committed their parts, so it is dropped whole.

        Returns
        -------
        tuple of int
            Items taken back, and the end of those inserts' episode ids (never handed out again; 0 for none).
        """
        n = end = 0
        for intent in sorted(self.path.glob(_INTENT.format("*"))) + sorted(self.path.glob(_ONE_INTENT)):
            try:
                m = json.loads(intent.read_text())
                first, count = int(m["first_episode_id"]), int(m["episodes"])
            except (OSError, ValueError, KeyError, TypeError):  # cut while written: before any shard was
                first, count = 0, 0
            n += sum(s.roll_back(first, count) for s in self.shards) if count else 0
            end = max(end, first + count)
            intent.unlink()
        if n:
            logger.warning(
                "table %s: inserts across shards cut short by a kill were taken back (%d items)", self.path, n
            )
        return n, end

    def _can_sample(self, B: int) -> bool:
        return self.rate_limiter.can_sample(B, self.size)

    def _wait_to_sample(self, B, timeout, whole, what, after) -> None:
        """:meth:`_sample_admitted`'s wait in line (holding ``_cond``), once a sample cannot go at once."""
        adm = self._admission
        self._wait(
            "sample",
            lambda: (after is None or adm.arrivals > after) and self._can_sample(B),
            timeout,
            what or f"a sample of {B}",
            None if after is None else whole,
        )
        adm.done("sample")

    # -- priorities and deletes ------------------------------------------------------------------
    def _by_shard(self, keys):
        k = check_keys(keys, len(self.shards))
        if len(self.shards) == 1:  # every key's shard is 0 (checked): the seqs are the keys
            return k, np.zeros(len(k), dtype=np.int64), k
        shard, seq = decode(k)
        return k, shard, seq

    @holds_interrupts
    def update_priorities(self, keys: ArrayLike, priorities: ArrayLike | float) -> UpdateResult:
        """Set priorities by key, all or nothing for invalid input.

        Keys of evicted items are ignored and counted (``stale``); unknown keys
        and NaN/inf/negative priorities raise before anything is applied.
        Duplicate keys: the last value wins.

        Parameters
        ----------
        keys : array_like of int
            Keys from :attr:`SampleBatch.keys` or :class:`InsertResult`,
            any shape (flattened).
        priorities : float or array_like of float
            One value for all keys, or one per key; finite and >= 0.

        Returns
        -------
        UpdateResult
            ``applied`` items updated, ``stale`` keys ignored.

        Raises
        ------
        InvalidDataError
            Non-integer keys, or not one priority per key.
        SpecError
            ``priorities`` is None.
        InvalidPriorityError
            A priority that is NaN, infinite or negative, or one the sampler
            or remover cannot represent.
        UnknownKeyError
            A key naming no shard of the table, or never issued by it;
            nothing was applied.
        TableClosedError
            The table is closed.
        """
        self._check_open()
        k, shard, seq = self._by_shard(keys)
        pr = check_priorities(priorities, len(k), "keys")
        if pr is None:
            raise SpecError("priorities must not be None")
        self.cfg.check_priorities(pr)
        # each shard's part (one shard: every key, check_keys saw to it)
        parts = [(0, slice(None))] if len(self.shards) == 1 else shard_parts(shard)
        for s, m in parts:  # unknown keys raise before any shard (or the stamp clock) is touched
            self.shards[s].check_issued(seq[m])
        with self._cond:  # one clock for inserts and updates: heap ties go to the least recently touched
            first = self._stamp
            self._stamp += len(k)
        if len(parts) == 1:  # one shard's consecutive stamps, from the first
            stale = self.shards[parts[0][0]].update_priorities(seq[parts[0][1]], pr[parts[0][1]], first)
            return UpdateResult(len(k) - stale, stale)
        stamps = first + np.arange(len(k), dtype=np.int64)
        stale = 0
        for s, m in parts:
            stale += self.shards[s].update_priorities(seq[m], pr[m], stamps[m])
        return UpdateResult(len(k) - stale, stale)

    @holds_interrupts
    def delete(self, keys: ArrayLike) -> UpdateResult:
        """Remove items by key (stale keys ignored and counted, unknown keys raise).

        Parameters
        ----------
        keys : array_like of int
            Keys of the items to remove, any shape (flattened).

        Returns
        -------
        UpdateResult
            ``applied`` items removed, ``stale`` keys already gone.

        Raises
        ------
        InvalidDataError
            Non-integer keys.
        UnknownKeyError
            A key naming no shard of the table, or never issued by it;
            nothing was removed.
        TableClosedError
            The table is closed.
        """
        self._check_open()
        k, shard, seq = self._by_shard(keys)
        parts = shard_parts(shard)
        for s, m in parts:
            self.shards[s].resolve(seq[m])
        deleted = stale = 0
        for s, m in parts:
            d, st = self.shards[s].delete(seq[m])
            deleted += d
            stale += st
        with through_interrupts(self._cond):
            self.rate_limiter.on_delete(deleted)
            self.rate_limiter.forget(deleted)  # unsampled (a queue's sampled items are gone): no longer waiting
            self._cond.notify_all()
        return UpdateResult(deleted, stale)

    # -- info ----------------------------------------------------------------------------------
    def info(self) -> dict:
        """Sizes, counters per shard and in total, limiter state, selectors, calls waiting per kind.

        Returns
        -------
        dict
            ``size``, ``max_size``, ``num_shards``, ``item_unit``;
            ``sampler`` and ``remover`` (their reprs); ``rate_limiter`` (its
            state); ``waiting`` (``{"inserts": n, "samples": n}`` blocked
            calls, as a DistributedTable's); ``totals`` (each per-shard counter summed); ``shards``
            (per shard: ``shard``, ``size``, ``episodes``, ``steps_stored``,
            ``capacity``, ``write_pos`` and its counters).
        """
        shards = [s.info() for s in self.shards]
        totals = {
            k: sum(si[k] for si in shards) for k in shards[0] if k not in ("shard", "capacity", "write_pos", "disk")
        }
        extra = {} if self.path is None else {"storage": self._storage_info()}
        return {
            **extra,
            "size": self.size,
            "max_size": self.spec.max_size,
            "num_shards": len(self.shards),
            "item_unit": self.spec.item_unit,
            "sampler": repr(self.sampler_proto),
            "remover": repr(self.remover_proto),
            "rate_limiter": self.rate_limiter.info(),
            "waiting": {f"{k}s": self._admission.waiting(k) for k in ("insert", "sample")},
            "totals": totals,
            "shards": shards,
        }

    def _storage_info(self) -> dict:
        """A disk table's bytes on disk and resident, and the rate pages are read from storage."""
        per = [s.store.info() for s in self.shards]
        now, read = time.monotonic(), per[0]["page_in_bytes"]  # this process's: the same for every shard
        rate = None
        if read is not None and self._page_ins is not None and now > self._page_ins[0]:
            rate = (read - self._page_ins[1]) / (now - self._page_ins[0])
        if read is not None:
            self._page_ins = (now, read)
        resident = [p["bytes_resident"] for p in per]
        return {
            "tier": "disk",
            "path": str(self.path),
            "bytes_on_disk": sum(p["bytes_on_disk"] for p in per),
            "bytes_resident": None if None in resident else sum(resident),
            "page_in_bytes": read,
            "page_in_bytes_per_s": rate,
            "clean": all(p["clean"] for p in per),
            "recovered": {str(s.shard_id): s.store.recovered for s in self.shards if s.store.recovered},
            # items of an insert across shards that a kill cut short, taken back when the table was reopened
            "rolled_back": self._rolled_back,
        }

    # -- checkpoints ----------------------------------------------------------------------------
    def config(self) -> dict:
        """JSON-able configuration (what a checkpoint needs to rebuild the table).

        Returns
        -------
        dict
            :meth:`TableConfig.to_dict` with the limiter's current state
            (its counters) as ``rate_limiter``.
        """
        return {**self.cfg.to_dict(), "rate_limiter": limiter_to_config(self.rate_limiter)}

    def checkpoint(self, path: str | os.PathLike[str]) -> dict:
        """Write an atomic, checksummed checkpoint to directory ``path`` (no pickle).

        Shards are snapshotted one at a time under their own lock (a memory
        copy), then written while inserts and samples continue.  The
        directory appears only once complete; on failure nothing is left.

        Parameters
        ----------
        path : str or os.PathLike
            Directory to create.

        Returns
        -------
        dict
            ``path`` (str), ``pause_s`` (float, the longest time one shard
            was blocked, seconds), ``seconds`` (float, wall time) and
            ``bytes`` (int, array bytes written).

        Raises
        ------
        CheckpointError
            ``path`` cannot be written.
        """
        from pathlib import Path

        from .. import checkpoint as ck

        t0 = time.perf_counter()
        final = Path(path)
        tmp = ck.temp_dir(final)
        files, pause, nbytes = {}, 0.0, 0
        try:
            with self._cond:
                cfg = self.config()
            for s in self.shards:
                ts = time.perf_counter()
                arrays, meta = ck.snapshot_shard(s)
                pause = max(pause, time.perf_counter() - ts)
                name, digest = ck.write_shard_file(tmp, s.shard_id, arrays)
                nbytes += sum(a.nbytes for a in arrays.values())
                files[str(s.shard_id)] = {"file": name, "sha256": digest, "meta": meta}
            # after the snapshots: inserts go on meanwhile, and the ids and stamps they took are past these
            with self._cond:
                state = {"next_episode_id": self._next_episode_id, "stamp": self._stamp, "rr": self._rr}
            ck.commit(tmp, final, ck.new_manifest("local", cfg, state, files))
        except BaseException:
            ck.discard(tmp)
            raise
        return {"path": str(final), "pause_s": pause, "seconds": time.perf_counter() - t0, "bytes": nbytes}

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        *,
        tier: str | None = None,
        seed: int | None = None,
        timeout: float | None = None,
        disk_path: str | os.PathLike[str] | None = None,
    ) -> LocalTable:
        """A table rebuilt from a checkpoint directory (verified before anything is built).

        Configuration, limiter state, ids and stamps are those of the
        checkpoint, so keys and episode ids are never reused.  A disk
        table's directory is a checkpoint too: its shards are copied into the
        tier asked for (:meth:`open` reopens it in place instead).

        Parameters
        ----------
        path : str or os.PathLike
            A directory written by :meth:`checkpoint`.
        tier : {"host", "pinned", "device", "disk"}, optional
            Storage tier of the rebuilt shards (config ``table.tier``; the
            checkpoint does not choose it).
        seed : int, optional
            Seeds the table's random generator.
        timeout : float, optional
            Default seconds a blocking call waits (config ``table.timeout``).
        disk_path : str or os.PathLike, optional
            The new table's directory when ``tier`` is ``"disk"`` (config
            ``disk.path``); it must not hold a table yet.

        Returns
        -------
        LocalTable
            The restored table.

        Raises
        ------
        CheckpointError
            No checkpoint at ``path``, a manifest that does not describe a
            table, a distributed table's checkpoint
            (:meth:`DistributedTable.restore <gear_flow.distributed.DistributedTable.restore>`
            restores it), or a file that fails verification.
        """
        from .. import checkpoint as ck
        from ..errors import CheckpointError

        m = ck.read_manifest(path)
        if m.get("kind") not in ("local", "disk"):  # (before anything is built: a distributed one's state differs)
            raise CheckpointError(f"{path} holds a {m.get('kind')!r} checkpoint; use DistributedTable.restore")
        if disk_path is not None and config.get("table.tier", tier) != "disk":
            raise SpecError(f"disk_path is the directory of a disk table; this restore is onto the {tier!r} tier")
        kw = {"tier": tier, "timeout": timeout, "seed": seed, "path": disk_path}
        if m.get("kind") == "disk":  # a disk table is its own checkpoint: its shards copied into the tier asked for
            return cls._restore_disk(path, kw)
        cfg = m["table"]
        try:
            shard_ids = sorted(int(k) for k in m["files"])
            loaded = {
                i: ck.read_shard_file(path, m["files"][str(i)]["file"], m["files"][str(i)]["sha256"]) for i in shard_ids
            }
            table = cls._from_config(cfg, shard_ids=shard_ids, **kw)
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: the manifest does not describe a table ({e})") from None
        for s in table.shards:
            ck.restore_shard(s, loaded[s.shard_id], m["files"][str(s.shard_id)]["meta"])
        st = m["state"]
        # past every id and stamp the shards hold too (a checkpoint that read its counters before them: an
        # earlier version's, written while inserts went on), as open() takes them
        table._next_episode_id = max([int(st["next_episode_id"])] + [s.episode_id_end() for s in table.shards])
        table._stamp = max([int(st["stamp"])] + [s._clock for s in table.shards])
        table._rr = int(st["rr"]) % len(table.shards)
        table._filled()
        return table

    def _filled(self) -> None:
        """A restored table's shards are filled: the limiter's counts of waiting items agree with them
        (:meth:`RateLimiter.settle`), and a disk table's manifest is written again, as filled (it was written
        empty, with the limiter's restored counts, and a reopen after a kill counted the shards' items
        twice)."""
        self.rate_limiter.settle(self.size)
        if self.path is not None:
            self._write_manifest(settled=True)

    @classmethod
    def _from_config(cls, cfg: dict, **kw: Any) -> LocalTable:
        """A table of configuration ``cfg`` (:meth:`config`: spec, selectors, limiter with its counts, modes), with
        ``kw`` for what a configuration does not choose (tier, path, seed, timeout, shard ids)."""
        from ..rate_limiters import from_config as limiter_from
        from ..selectors import from_config as selector_from

        return cls(
            TableSpec.from_dict(cfg["spec"]),
            sampler=selector_from(cfg["sampler"]),
            remover=selector_from(cfg["remover"]),
            rate_limiter=limiter_from(cfg["rate_limiter"]),
            max_times_sampled=cfg["max_times_sampled"],
            boundary=cfg["boundary"],
            routing=cfg["routing"],
            **kw,
        )

    @classmethod
    def _restore_disk(cls, path, kw: dict) -> LocalTable:
        """:meth:`restore` from a disk table's directory: opened, each shard snapshotted into a new table (made
        with ``kw``), closed."""
        from .. import checkpoint as ck

        src = cls.open(path)
        try:
            ids = [s.shard_id for s in src.shards]
            table = cls._from_config(src.config(), shard_ids=ids, **kw)
            for a, b in zip(src.shards, table.shards):
                ck.restore_shard(b, *ck.snapshot_shard(a))
            table._next_episode_id, table._stamp, table._rr = src._next_episode_id, src._stamp, src._rr
            table._filled()
            return table
        finally:
            src.close()

    def nbytes(self) -> dict:
        """Bytes the table's shards hold, by part.

        Returns
        -------
        dict
            ``{"data": bytes of the column rings, "overhead": index,
            priorities, selector trees}``, summed over the shards.
        """
        parts = [s.nbytes() for s in self.shards]
        return {k: sum(p[k] for p in parts) for k in parts[0]}
