"""One shard: column rings, episode index, per-item state, sampler and remover.

A shard is an in-process, thread-safe object with no Dask in it.  Tables
(local or distributed) hold several and orchestrate them: they validate input,
route inserts, apply the rate limiter and combine per-shard selections into one
exact global choice.  Everything here assumes validated input.

Items are steps (each step is a window start, or a window end in ``pad_head``
mode) or episodes, per table.  Per-item state is indexed by slot
(``seq % capacity``): ``active`` (uint8), ``priority`` (float64), ``touched``
(int64: the table-wide stamp of the item's insert or latest priority update,
which breaks heap ties) and, when ``max_times_sampled`` is set,
``times_sampled`` (int32).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from . import keys as keymod
from .errors import EmptyTableError, SpecError, nothing_to_sample
from .ops import sequences
from .sample import NO_COUNTS
from .selectors.base import OrderedSelector, Selector, WeightedSelector
from .spec import TableSpec
from .storage import ColumnRing, EpisodeIndex, get_tier, windows
from .storage.base import ring_slots
from .storage.disk_state import DiskStore
from .storage.shared_selection import SelectionState, shareable
from .storage.windows import Windows
from .tails import LISTED_BELOW, TailMass, valid_mass

if TYPE_CHECKING:
    from .sample import SampleBuffers
    from .storage.base import StorageTier

logger = logging.getLogger(__name__)


@dataclass
class EpisodeBatch:
    """Validated episodes for one shard.

    Attributes
    ----------
    chunks : list of dict
        Each maps every column name to a ``[T_chunk, *shape]`` array; chunks are
        written back to back (episodes may span chunk borders only if the caller
        concatenated them, which :class:`~gear_flow.table.LocalTable` never does).
    lengths : int64 array
        Steps of each episode, in order.
    episode_ids : int64 array
        Table-wide id of each episode.
    stamps : int64 array
        Table-wide insertion order of each episode's first item.
    priorities : float64 array or None
        One per item (per step, or per episode); None: the shard's running max.
    """

    chunks: list
    lengths: np.ndarray
    episode_ids: np.ndarray
    stamps: np.ndarray
    priorities: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        """Total steps of the batch (sum of ``lengths``)."""
        return int(self.lengths.sum())


def _unique(a: np.ndarray) -> np.ndarray:
    """``np.unique`` of 1-d ``a``, ascending, by a sort: a few hundred slots in 2 us, where ``np.unique`` (which
    hashes first) took 12 us, a sixth of a without-replacement batch."""
    s = np.sort(a)
    return s[_run_starts(s)]


def _unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` of 1-d ``a`` by a stable sort (see :func:`_unique`)."""
    order = np.argsort(a, kind="stable")
    s = a[order]
    first = _run_starts(s)
    inv = np.empty(len(a), dtype=np.int64)
    inv[order] = np.cumsum(first) - 1
    return s[first], inv


def _by_weight(w: np.ndarray, cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Items of weights ``w`` (``cum``: their running sum, its total > 0) drawn by the uniforms ``u``: each the
    item whose cumulative range holds ``u * total``, so never one of weight 0; a target rounded onto the total
    takes the last item with weight."""
    i = np.searchsorted(cum, u * cum[-1], side="right")
    return np.where(i < len(w), i, np.flatnonzero(w > 0)[-1])


def _run_starts(s: np.ndarray) -> np.ndarray:
    """Of sorted ``s``, where each run of equal values starts (True there)."""
    first = np.empty(len(s), dtype=bool)
    if len(s):
        first[0] = True
        np.not_equal(s[1:], s[:-1], out=first[1:])
    return first


@njit(nogil=True, cache=True)
def _counts_after(slots, times_sampled, out):
    """``out[i]``: the times ``slots[i]`` will have been handed out once a sample taking ``slots`` (in order,
    repeats counted one by one) is recorded: its count so far plus its occurrences up to and including i."""
    order = np.argsort(slots, kind="mergesort")  # stable: repeats keep their batch order
    run = 0
    for j in range(order.shape[0]):
        i = order[j]
        run = run + 1 if j and slots[order[j - 1]] == slots[i] else 1
        out[i] = times_sampled[slots[i]] + run


@njit(nogil=True, cache=True)
def _count_sampled(times_sampled, slots):
    """``np.add.at(times_sampled, slots, 1)``: each occurrence counts."""
    for i in range(slots.shape[0]):
        times_sampled[slots[i]] += 1


@njit(nogil=True, cache=True)
def _apply_updates(seqs, priorities, stamps, stamp0, clock, lo, hi, capacity, active, touched, priority, dense):
    """The live items among ``seqs`` (at least ``lo``, active) get ``priorities`` and their stamps
    (``stamps``; when it is empty ``stamp0 + i`` for the ``i``-th seq, or with ``stamp0`` < 0 the shard's
    clock on from ``clock``, one a live item), in order (a repeat: the last wins).  Returns the live ones'
    slots and priorities, the clock after them and their largest priority (-1.0: none); or, with nothing
    written, a clock of -1 when a seq is not below ``hi`` (never issued: the caller names it).  ``dense``:
    every seq of ``[lo, hi)`` is live (the shard holds ``hi - lo`` items), so ``active`` is not read (a
    cache miss an item in a large shard)."""
    n = seqs.shape[0]
    # every seq checked before anything is written; no prefetch pass (the loads below are independent, as
    # take_steps's are: with one, B=1024's update of a 10M-step shard took 197 us, without it 188)
    for i in range(n):
        if seqs[i] >= hi:
            return seqs[:0], priorities[:0], -1, -1.0
    slots = np.empty(n, np.int64)
    pr = np.empty(n, np.float64)
    k, nxt, top = 0, clock, -1.0
    for i in range(n):
        s = seqs[i]
        slot = s % capacity
        if s >= lo and s >= 0 and (dense or active[slot] == 1):
            if stamps.shape[0]:
                st = stamps[i]
            else:
                st = stamp0 + i if stamp0 >= 0 else clock + k
            touched[slot] = st
            priority[slot] = priorities[i]
            slots[k], pr[k] = slot, priorities[i]
            nxt = max(nxt, st + 1)
            top = max(top, priorities[i])
            k += 1
    return slots[:k], pr[:k], nxt, top


@njit(nogil=True, cache=True)
def _place_steps(w, capacity, lengths, ep_seqs, stamps, step_episode, touched):
    """The steps of episodes written back to back from absolute position ``w``: each slot gets its episode's
    seq and its stamp (its episode's first item's stamp plus its index in the episode); returns the clock
    after them (the largest stamp + 1, or -1 for none)."""
    pos = w % capacity
    nxt = -1
    for e in range(lengths.shape[0]):
        q, s0 = ep_seqs[e], stamps[e]
        for t in range(lengths[e]):
            step_episode[pos] = q
            touched[pos] = s0 + t
            pos += 1
            if pos == capacity:
                pos = 0
        if lengths[e] > 0:
            nxt = max(nxt, s0 + lengths[e])
    return nxt


_NO_STAMPS = np.zeros(0, np.int64)
_NO_TIMES = np.zeros(0, np.int32)
_NO_BLOCK = contextlib.nullcontext()  # (reusable: one for every block that needs none, not one per call)


@njit(nogil=True, cache=True)
def _activate(slots, priorities, active, priority, times_sampled):
    """The items at ``slots`` become live with ``priorities``, sampled no times yet (``times_sampled``
    empty: not counted); one pass where NumPy would index the slots once per array."""
    for i in range(slots.shape[0]):
        s = slots[i]
        active[s] = 1
        priority[s] = priorities[i]
        if times_sampled.shape[0]:
            times_sampled[s] = 0


@njit(nogil=True, cache=True)
def _live_slots(active, slots, out):
    """The slots among ``slots`` of a live item, in order, into ``out``; returns how many."""
    k = 0
    for i in range(slots.shape[0]):  # (no branch: an eviction's slots are nearly all live, or none)
        out[k] = slots[i]
        k += active[slots[i]] == 1
    return k


@njit(nogil=True, cache=True)
def _put(a, slots, value):
    """``a[slots] = value``, compiled: an eviction's slots are tens of thousands."""
    for i in range(slots.shape[0]):
        a[slots[i]] = value


@dataclass
class Counters:
    """Item accounting of a shard: ``inserted == size + evicted + removed + deleted + expired``.

    All counts are cumulative since the shard was made.

    Attributes
    ----------
    inserted : int
        Items inserted (steps or episodes, per the table's item unit).
    inserted_steps : int
        Steps written to the rings.
    inserted_episodes : int
        Episodes inserted.
    evicted : int
        Live items dropped because the ring overwrote their episode.
    removed : int
        Items evicted by the remover (``max_size``).
    deleted : int
        Items removed by an explicit delete.
    expired : int
        Items removed on reaching ``max_times_sampled``.
    sampled : int
        Items handed out by samples (repeats counted each time).
    stale_updates : int
        Priority updates ignored because the key no longer named a live item.
    stale_deletes : int
        Deletes ignored because the key no longer named a live item.
    """

    inserted: int = 0
    inserted_steps: int = 0
    inserted_episodes: int = 0
    evicted: int = 0  # storage overwrote their episode
    removed: int = 0  # remover evicted them (max_size)
    deleted: int = 0  # explicit delete
    expired: int = 0  # max_times_sampled reached
    sampled: int = 0
    stale_updates: int = 0
    stale_deletes: int = 0

    def as_dict(self) -> dict:
        """The counters as a new dict.

        Returns
        -------
        dict
            ``{field name: int}`` for every field.
        """
        return dict(self.__dict__)


class Shard:
    """Storage and selection of one shard.

    Parameters
    ----------
    spec : TableSpec
        Columns, capacity (steps of this shard), item unit.
    shard_id : int
        Carried in every key (0..126).
    sampler, remover : Selector
        Fresh (unbound) selector instances owned by this shard.
    max_times_sampled : int
        Items are removed after this many samples (0: never).
    tier : str or StorageTier
        Where the column rings live (``host``, ``pinned``, ``device``).

    Examples
    --------
    >>> import numpy as np
    >>> from gear_flow.spec import ColumnSpec, TableSpec
    >>> from gear_flow.selectors import Uniform, Fifo
    >>> spec = TableSpec((ColumnSpec("x", ()),), capacity=16)
    >>> shard = Shard(spec, 0, Uniform(), Fifo())
    >>> shard.insert(EpisodeBatch([{"x": np.arange(5.0, dtype=np.float32)}], np.array([5]),
    ...                           np.array([0]), np.array([0])))
    (array([0]), 5)
    >>> shard.size
    5
    """

    def __init__(
        self,
        spec: TableSpec,
        shard_id: int,
        sampler: Selector,
        remover: Selector,
        *,
        max_times_sampled: int = 0,
        tier: str | StorageTier = "host",
    ):
        self.spec = spec
        self.shard_id = int(shard_id)
        self.capacity = spec.capacity
        self.step_items = spec.item_unit == "step"
        self.tier = get_tier(tier)
        self.ring = ColumnRing(spec, self.tier)
        self._last_pairs = None  # (buffers, columns, rows, pairs) of the last take (see _fused_pairs)
        self._buffers = [None, None, None, None]  # an insert's reused buffers (see _scratch)
        self.index = EpisodeIndex()
        cap = self.capacity
        state = self.tier.state  # host memory, or the files of a disk shard
        self.step_episode = state("step_episode", (cap,), np.int64, -1) if self.step_items else None
        self.active = state("active", (cap,), np.uint8)
        self.priority = state("priority", (cap,), np.float64)
        self.touched = state("touched", (cap,), np.int64)
        self._clock = 0  # one past the newest stamp seen (updates without a table stamp use it)
        self.max_times_sampled = int(max_times_sampled)
        self.times_sampled = state("times_sampled", (cap,), np.int32) if self.max_times_sampled else None
        self.size = 0
        self.max_priority = 1.0
        self.counters = Counters()
        self.lock = threading.RLock()
        self.sampler = sampler
        self.remover = remover
        # the shard as its parts hold it (selectors, tail masses, published state, files): weakly, so that a
        # shard is in no reference cycle and is freed (its rings' memory, a disk shard's mapped files) as soon
        # as its table lets go of it, not at some later pass of the cyclic GC
        me = weakref.proxy(self)
        sampler.bind(me)
        remover.bind(me)
        self.weighted = isinstance(sampler, WeightedSelector)
        self.tails = TailMass(lambda k: me._tail_mass_exact(k), lambda a: me._reach(a))
        #: the selection state readers on this host draw from (None: only the owner draws; see
        #: :mod:`~gear_flow.storage.shared_selection`)
        self.published = SelectionState(me) if shareable(self) else None
        #: the files of a disk shard: commits after each change, flushes, recovery (None on other tiers; see
        #: :mod:`~gear_flow.storage.disk_state`)
        self.store = DiskStore(me) if getattr(self.tier, "persistent", False) else None

    def writing(self) -> contextlib.AbstractContextManager:
        """The block in which the shard's selection state changes (call holding :attr:`lock`): readers
        drawing from a published state see a version change and draw again.

        Returns
        -------
        context manager
            :meth:`SelectionState.writing`, or a no-op when nothing is published.
        """
        if self.store is not None:  # a disk shard commits its header at the end of the block
            return self.store.writing()
        return self.published.writing() if self.published is not None else _NO_BLOCK

    def episode_id_end(self) -> int:
        """One past the largest episode id this shard holds (ids are handed out in order: its newest
        episode's), 0 when it holds none.

        Returns
        -------
        int
            The id.
        """
        idx = self.index
        return int(idx.get("episode_id", idx.next - 1)) + 1 if idx.next > idx.first else 0

    # -- ShardState protocol (for selectors) ----------------------------------
    def live_seq_range(self) -> tuple[int, int]:
        """Half-open range ``[lo, hi)`` of the sequence numbers that may be live.

        Steps: the absolute positions still in the ring; episodes: those in
        the episode index.  ``hi`` is the next sequence number to be issued.

        Returns
        -------
        tuple of int
            ``(lo, hi)``.
        """
        if self.step_items:
            return max(0, self.ring.write_pos - self.capacity), self.ring.write_pos
        return self.index.first, self.index.next

    def item_stamps(self, slots: np.ndarray) -> np.ndarray:
        """Table-wide insertion stamp of the live item at each slot.

        A step's stamp is its episode's stamp plus its index in the episode.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[n]`` slots of live items.

        Returns
        -------
        numpy.ndarray
            int64 ``[n]``.
        """
        seqs = self.slot_seqs(slots)
        if self.step_items:
            ep = self.step_episode[slots]
            return self.index.get("stamp", ep) + (seqs - self.index.get("start", ep))
        return self.index.get("stamp", seqs)

    def _episode_of(self, seq: int) -> int:
        return int(self.step_episode[seq % self.capacity]) if self.step_items else int(seq)

    def stamp_floor(self, seq: int) -> int:
        """A lower bound on the stamps of the live items at ``seq`` and after.

        Parameters
        ----------
        seq : int
            An item sequence number in ``live_seq_range()``.

        Returns
        -------
        int
            The stamp of the item at ``seq`` or the smallest first stamp of
            the later episodes, whichever is smaller (the int64 maximum when
            none is live).
        """
        idx, ep = self.index, self._episode_of(seq)
        if ep < idx.first:  # its episode is gone (nothing of it is live): the oldest one left bounds the rest
            return int(idx.get("stamp_floor", idx.first)) if idx.first < idx.next else int(np.iinfo(np.int64).max)
        own = int(idx.get("stamp", ep)) + (seq - int(idx.get("start", ep)) if self.step_items else 0)
        return min(own, int(idx.get("stamp_floor", ep + 1))) if ep + 1 < idx.next else own

    def stamp_ceiling(self, seq: int) -> int:
        """The largest first stamp of the episodes holding items at ``seq`` and before.

        Stamps of different episodes are disjoint ranges, so an item stamped
        above this value is newer than every item at ``seq`` and before, unless
        it shares an episode with them (then it is newer than those before it
        in that episode).

        Parameters
        ----------
        seq : int
            An item sequence number in ``live_seq_range()``.

        Returns
        -------
        int
            That stamp (the int64 minimum when none of those items is live).
        """
        ep = self._episode_of(seq)
        if ep < self.index.first:
            return int(np.iinfo(np.int64).min)
        return int(self.index.get("stamp_ceiling", ep))

    def item_touched(self, slots: np.ndarray) -> np.ndarray:
        """Table-wide stamp of each item's insert or latest priority update.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[n]`` item slots.

        Returns
        -------
        numpy.ndarray
            int64 ``[n]``; heap ties go to the smallest.
        """
        return self.touched[slots]

    def slot_seqs(self, slots: np.ndarray) -> np.ndarray:
        """Sequence number of the newest occupant of each slot.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[n]`` slots in ``[0, capacity)``.

        Returns
        -------
        numpy.ndarray
            int64 ``[n]``: the largest seq below ``live_seq_range()[1]`` that
            maps to the slot (it may be negative or no longer live).
        """
        return windows.slot_seqs(self.live_seq_range()[1], slots, self.capacity)

    # -- writing ----------------------------------------------------------------
    def insert(self, batch: EpisodeBatch) -> tuple[np.ndarray, int]:
        """Store whole episodes, evicting the oldest episodes they overwrite.

        Items get ``batch.priorities`` or, when None, the shard's running
        maximum priority.

        Parameters
        ----------
        batch : EpisodeBatch
            Validated episodes, ``batch.num_steps <= capacity``.

        Returns
        -------
        keys : numpy.ndarray
            int64 ``[n_episodes]``: the key of each episode's first item.
        n_items : int
            Items inserted (steps or episodes).
        """
        with self.lock, self.writing():
            n = batch.num_steps
            w = self.ring.write_pos
            self.ring.begin_write(w + n)  # readers of a shared ring: these slots are about to change
            if self.store is not None:  # a disk shard: a reopen after a kill from here on drops this insert
                self.store.begin_insert(
                    w + n, self.index.next + len(batch.lengths), int(batch.episode_ids.max(initial=-1)) + 1
                )
            with contextlib.ExitStack() as trees:  # evicted and inserted leaves: one repair of each tree
                for sel in (self.sampler, self.remover):
                    if isinstance(sel, WeightedSelector):
                        trees.enter_context(sel.sums.one_repair())
                return self._insert_locked(batch, w, n)

    def _insert_locked(self, batch: EpisodeBatch, w: int, n: int) -> tuple[np.ndarray, int]:
        """:meth:`insert` of ``n`` steps at write position ``w`` (the lock held, the write announced)."""
        self._evict_steps_before(w + n - self.capacity)
        for name in self.ring.columns:  # one ring write per column: GPU tiers batch the episodes
            self.ring.write_chunks(w, name, list(map(itemgetter(name), batch.chunks)))
        self.ring.write_pos = w + n
        starts = w + np.concatenate(([0], np.cumsum(batch.lengths)[:-1])).astype(np.int64)
        ep_seqs = self.index.append(starts, batch.lengths, batch.stamps, batch.episode_ids)
        stamps = np.asarray(batch.stamps, dtype=np.int64)
        if self.step_items:  # each step's episode and stamp, run by run of the ring in one compiled pass
            clock = _place_steps(w, self.capacity, np.asarray(batch.lengths, dtype=np.int64), ep_seqs, stamps,
                                 self.step_episode, self.touched)  # fmt: skip
            self._clock = max(self._clock, int(clock))
            slots, first_seqs = ring_slots(w, n, self.capacity, out=self._scratch(1, n)), starts
        else:
            slots, first_seqs = ep_seqs % self.capacity, ep_seqs
            self._touch(slots, stamps)
        if batch.priorities is None:
            pr = self._scratch(2, len(slots), np.float64)
            pr.fill(self.max_priority)
        else:
            pr = batch.priorities
            if len(pr):
                self.max_priority = max(self.max_priority, float(pr.max()))
        self._add_items(slots, pr)
        self.counters.inserted_steps += n
        self.counters.inserted_episodes += len(batch.lengths)
        return keymod.encode(self.shard_id, first_seqs), len(slots)

    def _touch(self, slots: np.ndarray, stamps: np.ndarray | None) -> None:
        """Record the stamps of an insert or update (None: stamps from this shard's own clock)."""
        if stamps is None:
            stamps = self._clock + np.arange(len(slots), dtype=np.int64)
        self.touched[slots] = stamps
        if len(stamps):
            self._clock = max(self._clock, int(stamps.max()) + 1)

    def _add_items(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        if priorities.shape != slots.shape:
            raise ValueError(f"{len(priorities)} priorities for {len(slots)} items")
        _activate(
            slots,
            priorities,
            self.active,
            self.priority,
            _NO_TIMES if self.times_sampled is None else self.times_sampled,
        )
        self.sampler.insert(slots, priorities)
        if self.weighted and self.tails.entries:  # (no window length cached: nothing to read the leaves for)
            self.tails.change(slots, np.zeros(len(slots)), self.sampler.leaf_weights(slots))
        self.remover.insert(slots, priorities)
        self.size += len(slots)
        self.counters.inserted += len(slots)

    def _scratch(self, i: int, n: int, dtype: type = np.int64) -> np.ndarray:
        """Buffer ``i`` of this shard's writes, ``[n]`` of ``dtype``: the slots an insert evicts (0) and
        writes (1), its default priorities (2), the live ones among the slots any write drops (3).  Reused
        (every write holds the lock, and nothing keeps them past it), a large insert takes no fresh pages for
        them: in a Dask worker, whose allocator returns freed memory at once, those page faults doubled the
        ring's bookkeeping."""
        buf = self._buffers[i]
        if buf is None or len(buf) < n or buf.dtype != dtype:
            buf = self._buffers[i] = np.empty(max(n, 1024), dtype=dtype)
        return buf[:n]

    def _drop_items(self, slots: np.ndarray) -> int:
        """Deactivate the active ones among ``slots``; returns how many."""
        live = self._scratch(3, len(slots))
        k = _live_slots(self.active, slots, live)
        if k < len(slots):
            slots = live[:k]
        if len(slots):
            if self.weighted and self.tails.entries:
                self.tails.change(slots, self.sampler.leaf_weights(slots), np.zeros(len(slots)))
            _put(self.active, slots, 0)
            self.sampler.remove(slots)
            self.remover.remove(slots)
            self.size -= len(slots)
        return len(slots)

    def _front(self, bound: int) -> tuple[int, np.ndarray]:
        """The oldest episodes with a step at absolute position < bound: (how many, their item slots)."""
        idx = self.index
        if idx.first >= idx.next or idx.get("start", idx.first) >= bound:
            return 0, np.zeros(0, dtype=np.int64)
        # episodes start in increasing order: the ones starting before ``bound`` are a prefix (vectorised:
        # an insert of 1024 episodes evicts about as many, one Python step each would cost milliseconds)
        starts = idx.get("start", np.arange(idx.first, idx.next))
        k = int(np.searchsorted(starts, bound, side="left"))
        seqs = np.arange(idx.first, idx.first + k)
        if self.step_items:
            st = starts[:k]
            ln = idx.get("length", seqs)
            total = int(ln.sum())
            if total <= self.capacity and int(st[-1]) + int(ln[-1]) - int(st[0]) == total:  # back to back
                return k, ring_slots(int(st[0]), total, self.capacity, out=self._scratch(0, total))
            steps = np.arange(total, dtype=np.int64) + np.repeat(st - (np.cumsum(ln) - ln), ln)
            return k, steps % self.capacity
        return k, seqs % self.capacity

    def live_overwritten(self, n_steps: int) -> int:
        """Live items the ring would overwrite to store ``n_steps`` more steps (nothing changes).

        Parameters
        ----------
        n_steps : int
            Steps of a prospective insert.

        Returns
        -------
        int
            Live items of the episodes that insert would evict.
        """
        with self.lock:
            _, slots = self._front(self.ring.write_pos + n_steps - self.capacity)
            return int(self.active[slots].sum())

    def _evict_steps_before(self, bound: int) -> None:
        """Evict every live episode with a step at absolute position < bound."""
        idx = self.index
        k, slots = self._front(bound)
        if not k:
            return
        # drop first: the tail-mass cache needs the episode records of the dropped items
        self.counters.evicted += self._drop_items(slots)
        idx.pop_front(k)
        if self.step_items:
            _put(self.step_episode, slots, -1)

    # -- keys ------------------------------------------------------------------
    def check_issued(self, seqs: np.ndarray) -> None:
        """Raise unless this shard has issued every one of ``seqs`` (live or not).

        Parameters
        ----------
        seqs : numpy.ndarray
            int64 ``[n]`` item sequence numbers (decoded from keys).

        Raises
        ------
        UnknownKeyError
            If a seq was never issued by this shard (naming the first such key).
        """
        hi = self.live_seq_range()[1]
        if len(seqs) and int(seqs.max()) >= hi:
            from .errors import UnknownKeyError

            k = int(keymod.encode(self.shard_id, seqs[np.flatnonzero(seqs >= hi)[:1]])[0])
            raise UnknownKeyError(k, f"shard {self.shard_id} has issued item seqs below {hi} only")

    def resolve(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map item sequence numbers to slots and tell which are still live.

        Parameters
        ----------
        seqs : numpy.ndarray
            int64 ``[n]`` item sequence numbers (decoded from keys).

        Returns
        -------
        slots : numpy.ndarray
            int64 ``[n]``: ``seqs % capacity``.
        live : numpy.ndarray
            bool ``[n]``: the item is still stored and active (False for
            evicted, removed, deleted or expired items: stale keys).

        Raises
        ------
        UnknownKeyError
            If a seq was never issued by this shard (naming the first such key).
        """
        lo, hi = self.live_seq_range()
        self.check_issued(seqs)
        slots = seqs % self.capacity
        live = (seqs >= lo) & (seqs >= 0) & (self.active[slots] == 1)
        return slots, live

    def update_priorities(
        self, seqs: np.ndarray, priorities: np.ndarray, stamps: np.ndarray | int | None = None
    ) -> int:
        """Apply validated priorities to the live items among ``seqs``.

        Parameters
        ----------
        seqs : numpy.ndarray
            int64 ``[n]`` item sequence numbers.
        priorities : numpy.ndarray
            float64 ``[n]``, validated (finite, non-negative).
        stamps : numpy.ndarray or int, optional
            int64 ``[n]``: the table-wide stamp of each update (from the clock
            that stamps inserts), so heap ties go to the least recently
            inserted or updated item across shards; an int: the first of
            ``n`` consecutive stamps; None stamps them from this shard's clock
            (exact within the shard only).

        Returns
        -------
        int
            Stale keys ignored (items no longer live).

        Raises
        ------
        UnknownKeyError
            If a seq was never issued by this shard.
        """
        with self.lock, self.writing():
            lo, hi = self.live_seq_range()
            if stamps is None or isinstance(stamps, (int, np.integer)):
                st, st0 = _NO_STAMPS, -1 if stamps is None else int(stamps)
            else:
                st, st0 = np.asarray(stamps, dtype=np.int64), -1
                if st.shape != (len(seqs),):  # (read one per seq, unchecked, by the compiled pass)
                    raise SpecError(f"{len(st)} stamps for {len(seqs)} seqs")
            # one compiled pass: every seq issued (else nothing written), which items are live, their stamps
            # and priorities written (the loads of their state overlap); the selectors then take the live ones
            slots, pr, clock, top = _apply_updates(
                np.asarray(seqs, dtype=np.int64), np.asarray(priorities, dtype=np.float64), st, st0, self._clock,
                lo, hi, self.capacity, self.active, self.touched, self.priority, self.size == hi - lo,
            )  # fmt: skip
            if clock < 0:
                self.check_issued(seqs)  # (raises, naming the first such key)
            stale = len(seqs) - len(slots)
            if len(slots):
                self._clock = int(clock)
                if self.weighted and self.tails.entries:  # (no tail mass cached: no leaves to read)
                    # each slot's change once: a repeated key (a batch drawn with replacement) changes its
                    # item's weight once, to the last value, and counted per repeat it moved the tail mass more
                    once = _unique(slots)
                    old = self.sampler.leaf_weights(once)
                    self.sampler.update(slots, pr)
                    self.tails.change(once, old, self.sampler.leaf_weights(once))
                else:
                    self.sampler.update(slots, pr)
                self.remover.update(slots, pr)
                self.max_priority = max(self.max_priority, top)
            self.counters.stale_updates += stale
            return stale

    def delete(self, seqs: np.ndarray) -> tuple[int, int]:
        """Remove the live items among ``seqs``.

        Parameters
        ----------
        seqs : numpy.ndarray
            int64 ``[n]`` item sequence numbers; repeats are removed once.

        Returns
        -------
        deleted : int
            Items removed.
        stale : int
            Entries of ``seqs`` that named no live item (ignored).

        Raises
        ------
        UnknownKeyError
            If a seq was never issued by this shard.
        """
        with self.lock, self.writing():
            slots, live = self.resolve(seqs)
            n = self._drop_items(_unique(slots[live]))
            stale = int((~live).sum())
            self.counters.deleted += n
            self.counters.stale_deletes += stale
            return n, stale

    def roll_back(self, first_id: int, count: int) -> int:
        """Take back the items of the live episodes whose ids are in ``[first_id, first_id + count)``, as if
        they had never been inserted: an insert across shards that a kill cut short, whose part this shard
        had committed (:meth:`~gear_flow.table.local.LocalTable.open` drops such an insert whole, as a shard
        drops its own torn insert).  They count neither as inserted nor as removed.

        Parameters
        ----------
        first_id : int
            The insert's first episode id.
        count : int
            Its episodes.

        Returns
        -------
        int
            Items taken back.
        """
        with self.lock, self.writing():
            eps = self.index.live()
            ids = self.index.get("episode_id", eps)
            eps = eps[(ids >= first_id) & (ids < first_id + count)]
            if not len(eps):
                return 0
            if self.step_items:
                starts, lengths = self.index.get("start", eps), self.index.get("length", eps)
                seqs = np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in zip(starts, lengths)])
            else:
                seqs = eps.astype(np.int64)
            slots, live = self.resolve(seqs)
            n = self._drop_items(_unique(slots[live]))
            self.counters.inserted -= n
            return n

    # -- window geometry ----------------------------------------------------------
    def windows(self, slots: np.ndarray, length: int, boundary: str, rng: np.random.Generator) -> Windows:
        """Window placement for the items at ``slots`` (nothing changes).

        A step item starts its window (ends it in ``pad_head`` mode); an
        episode item's window position is drawn uniformly among the valid ones.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[B]`` slots of live items; repeats allowed.
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode: windows crossing an episode's end are
            excluded (``strict``) or zero-padded.
        rng : numpy.random.Generator
            Draws window positions within episode items.

        Returns
        -------
        Windows
            One window per entry of ``slots``.
        """
        return windows.place(
            slots, self.live_seq_range()[1], self.capacity, self.step_episode, self.index, self.step_items, length,
            boundary, rng,
        )  # fmt: skip

    def valid_fn(self, length: int, boundary: str) -> Callable[[np.ndarray], np.ndarray] | None:
        """Predicate over slots: does the item's window fit.

        Parameters
        ----------
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode: windows crossing an episode's end are
            excluded (``strict``) or zero-padded.

        Returns
        -------
        callable or None
            Maps int64 slots ``[n]`` of live items to a bool ``[n]`` mask;
            None when every window fits (padded modes, or ``length <= 1``).
        """
        if boundary != "strict" or length <= 1:  # a one-step window always fits its item
            return None

        def valid(slots):
            return windows.fits(
                slots, self.live_seq_range()[1], self.capacity, self.step_episode, self.index, self.step_items, length
            )

        return valid

    def longest_episode(self) -> int:
        """Length of the longest stored episode.

        Returns
        -------
        int
            Steps (0 when the shard is empty).
        """
        ln = self.index.lengths()
        return int(ln.max()) if len(ln) else 0

    # -- stochastic selection --------------------------------------------------------
    def valid_mass(self, length: int, boundary: str) -> float:
        """Sampling mass of items whose window fits (exact; strict mode subtracts tails).

        Needs a weighted sampler.

        Parameters
        ----------
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode: windows crossing an episode's end are
            excluded (``strict``) or zero-padded.

        Returns
        -------
        float
            Sum of the sampler's weights over the valid items (0.0 when a
            remainder is within rounding of zero).
        """
        sel = self.sampler
        assert self.weighted  # (the flag set at bind: an ABC's isinstance each call is slow)
        with self.lock:
            total = sel.mass
            if boundary != "strict" or length <= 1 or total <= 0:
                return total
            if self.published is not None and not self.published.publishes(length):
                with self.writing():  # a new window length (or one recomputed): published for the readers
                    tail = self.tails.get(length, total)
            else:
                tail = self.tails.get(length, total)
            mass = valid_mass(total, tail)
            if mass == 0.0:  # within the cached tails' drift of nothing: the fitting items' own weights say
                mass = self.tails.valid_listed(
                    length, lambda: self.sampler.leaf_weights(self._valid_slots(length, boundary)).sum()
                )
            return mass

    def _tail_mass_exact(self, length: int) -> float:
        sel = self.sampler
        if self.step_items:
            return sel.sums.ring_tail_mass(
                self.capacity, self.index.starts() % self.capacity, self.index.lengths(), length - 1
            )
        live = self.index.live()
        short = live[self.index.get("length", live) < length]
        return float(sel.leaf_weights(short % self.capacity).sum())

    def _reach(self, slots: np.ndarray) -> np.ndarray:
        """Steps from each item to its episode's end (inclusive); episode items: the length."""
        if self.step_items:
            ep = self.step_episode[slots]
            return self.index.get("start", ep) + self.index.get("length", ep) - self.slot_seqs(slots)
        return self.index.get("length", self.slot_seqs(slots))

    def draw(
        self, n: int, length: int, boundary: str, rng: np.random.Generator, mass: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` items from the sampler; returns (slots, probability within this shard).

        Strict windows are drawn by rejection against the full tree; the
        returned probability is renormalised by the exact valid mass, so it is
        the probability of the distribution actually sampled.  When the items
        whose windows fit hold less than
        :data:`~gear_flow.tails.LISTED_BELOW` of the weight, those items are
        listed and drawn among by their weights instead (the same
        distribution; rejection would keep too few of its draws to end).  When no valid
        item has any weight (every priority 0) the draw is uniform over the
        valid items, as in Reverb (the planner then weighs shards by
        :meth:`valid_count`).

        Parameters
        ----------
        n : int
            Items to draw; with replacement they may repeat.
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode: windows crossing an episode's end are
            excluded (``strict``) or zero-padded.
        rng : numpy.random.Generator
            Source of the uniforms.
        mass : float, optional
            :meth:`valid_mass` if the caller has it already.

        Returns
        -------
        slots : numpy.ndarray
            int64 ``[n]`` drawn slots.
        probs : numpy.ndarray
            float64 ``[n]``: probability of each draw within this shard.

        Raises
        ------
        EmptyTableError
            If no valid item can be drawn (for without-replacement samplers,
            none is left in the epoch).
        """
        sel = self.sampler
        assert self.weighted  # (the flag set at bind: an ABC's isinstance each call is slow)
        with self.lock:
            if mass is None:
                mass = self.valid_mass(length, boundary)
            if mass <= 0:
                if sel.without_replacement:
                    self._raise_empty(length, boundary)
                return self._draw_uniform(n, length, boundary, rng)
            if not sel.without_replacement and (boundary != "strict" or length <= 1):
                return sel.draw_probs(rng.random(n), mass)  # every window fits: the loop below's one round
            valid = self.valid_fn(length, boundary)
            if valid is not None and not sel.without_replacement and mass < LISTED_BELOW * sel.mass:
                listed = self._draw_listed(n, length, boundary, rng, mass)
                if listed is not None:
                    return listed
            out = None
            got = 0
            rounds = 0
            unfit = []  # without replacement: drawn, their window does not fit, out of this call's draws only
            try:
                while got < n:
                    m = n - got
                    s = sel.draw(rng.random(m))  # on the device: uniforms up, slots down
                    if sel.without_replacement:
                        s = _unique(s)
                        self._consume(s)
                        if valid is not None:
                            ok = valid(s)
                            unfit.append(s[~ok])
                            s = s[ok]
                    elif valid is not None:
                        s = s[valid(s)]
                    if out is None:
                        if len(s) == n:  # every draw valid at once (the usual case): the draw's own array
                            out, got = s, n
                            break
                        out = np.empty(n, dtype=np.int64)
                    out[got : got + len(s)] = s
                    got += len(s)
                    rounds += 1
                    if got < n and (sel.mass <= 0 or rounds > 10_000):
                        raise EmptyTableError(
                            f"shard {self.shard_id}: could draw only {got} of {n} items (remaining mass {sel.mass:g})"
                        )
            finally:
                # back in the epoch: a draw of a window they do not fit does not hand them out (taken out for
                # good, those the rejection happened to hit were lost to the epoch, a random few of them)
                if unfit:
                    self._restore_epoch(np.concatenate(unfit))
            if out is None:  # n == 0
                out = np.zeros(0, dtype=np.int64)
            probs = (
                np.full(n, 1.0 / (mass if mass > 0 else 1.0))
                if sel.without_replacement
                else sel.drawn_weights(out) / mass
            )
            return out, probs

    def draw_sequence(
        self, n: int, length: int, boundary: str, rng: np.random.Generator, by_count: bool = False
    ) -> tuple[np.ndarray, ...]:
        """Up to ``n`` draws one after another, as Reverb samples a batch from this shard alone.

        An item that reaches ``max_times_sampled`` (its times sampled so far
        plus its draws here) is out of the later draws, so each draw's
        probability is among the items left then.  Nothing is recorded (a
        :meth:`take` of the slots chosen does that).  Drawn by rejection
        against the full sampler; once most of the mass is out, from the items
        left directly.  Once every item with weight is out before ``n`` draws
        (or none had any), the draws go on uniformly over the items of weight
        0 (Reverb's prioritized selector, once no weight is left): a second
        sequence, which the planner reaches once no shard has weight left.

        Parameters
        ----------
        n : int
            Draws at most.
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode.
        rng : numpy.random.Generator
            Source of the uniforms.
        by_count : bool, default False
            No item of the table has weight (every priority 0): only the
            uniform draws.

        Returns
        -------
        slots : numpy.ndarray
            int64 ``[k]``: the draws by weight, ``k <= n`` (fewer only once
            every item with weight is out).
        probs : numpy.ndarray
            float64 ``[k]``: draw ``i``'s probability among the items left then.
        masses : numpy.ndarray
            float64 ``[k + 1]``: the mass left before each draw, then after
            the last.
        seqs : numpy.ndarray
            int64 ``[k]``: the drawn items' sequence numbers.
        slots0, probs0, counts0, seqs0 : numpy.ndarray
            The same of the ``j <= n - k`` uniform draws over the items of
            weight 0 that follow (``counts0``: the items left before each,
            then after the last); none when ``k == n``.
        """
        assert isinstance(self.sampler, WeightedSelector) and not self.sampler.without_replacement
        with self.lock:
            slots, probs, masses = np.empty(n, np.int64), np.empty(n), np.zeros(n + 1)
            limit = self.max_times_sampled or n + 1  # no limit: nothing goes out
            full = mass = 0.0 if by_count else self.valid_mass(length, boundary)
            masses[0] = max(full, 0.0)
            got, gone, carry = 0, 0.0, {}  # carry: slot -> times gone, over the draws so far
            while got < n and full > 0:
                # rejection would mostly draw what is out; and below 1e-9 of the mass, what is left is lost in
                # the rounding of what went out (an item of weight 1e-10 beside one of 1: the batch that both
                # could fill stopped at one, and waited for inserts for ever): the items left are listed
                if (full - gone) / full < 0.05:
                    got = self._draw_left(n, length, boundary, rng, limit, carry, slots, probs, masses, got)
                    break
                cand, p = self.draw(2 * (n - got) + 8, length, boundary, rng, mass=mass)
                uniq, inv = _unique_inverse(cand)
                used = np.zeros(len(uniq), np.int64) if self.times_sampled is None else self.times_sampled[uniq]
                used = used.astype(np.int64)
                if carry:  # a second chunk: what the first ones handed out counts
                    for i, sl in enumerate(uniq.tolist()):
                        used[i] = carry.get(sl, used[i])
                picked = np.empty(n, np.int64)
                g0 = got
                got, gone = sequences.accept(
                    inv.astype(np.int64), p * full, used, limit, full, gone, n, picked, probs, masses, got
                )
                slots[g0:got] = uniq[picked[g0:got]]
                if got < n:
                    carry.update(zip(uniq.tolist(), used.tolist()))
            out = slots[:got].copy()
            weighted = (out, probs[:got].copy(), masses[: got + 1].copy(), self.slot_seqs(out))
            return weighted + self._draw_unweighted(n - got, length, boundary, rng, limit)

    def _draw_left(self, n, length, boundary, rng, limit, carry, slots, probs, masses, got) -> int:
        """:meth:`draw_sequence`'s draws from the items left, listed (when most of the mass is out); the
        draws taken so far (``got``) after it."""
        live = self._valid_slots(length, boundary)
        w = self.sampler.leaf_weights(live).astype(np.float64)
        k = np.zeros(len(live), np.int64) if self.times_sampled is None else self.times_sampled[live].astype(np.int64)
        for sl, c in carry.items():
            k[np.searchsorted(live, sl)] = c  # live is sorted (flatnonzero)
        w[k >= limit] = 0.0
        while got < n and w.sum() > 0:
            cum = np.cumsum(w)
            i = int(_by_weight(w, cum, rng.random(1))[0])
            slots[got], probs[got] = live[i], w[i] / cum[-1]
            masses[got] = cum[-1]  # (the listed mass, for this draw)
            k[i] += 1
            if k[i] >= limit:
                w[i] = 0.0
            got += 1
            masses[got] = w.sum()
        return got

    def _draw_unweighted(self, n, length, boundary, rng, limit) -> tuple[np.ndarray, ...]:
        """:meth:`draw_sequence`'s uniform draws, up to ``n``: over the items of weight 0 whose window fits and
        that may still go, one after another (an item that reaches ``limit`` is out of the later draws), each
        draw's probability one over the items left then.  ``(slots, probs, counts, seqs)``."""
        slots, probs, counts = np.empty(n, np.int64), np.empty(n), np.zeros(n + 1)
        got = 0
        if n and self.size:  # (listing the items is O(capacity): not for a shard with none)
            live = self._valid_slots(length, boundary)
            live = live[self.sampler.leaf_weights(live) == 0]  # (every item fitting, when none has weight)
            used = np.zeros(len(live), np.int64) if self.times_sampled is None else self.times_sampled[live]
            used = used.astype(np.int64)
            keep = used < limit
            got = sequences.uniform_left(live[keep], used[keep], limit, rng.random(n), slots, probs, counts)
        out = slots[:got].copy()
        return out, probs[:got].copy(), counts[: got + 1].copy(), self.slot_seqs(out)

    def _draw_listed(self, n, length, boundary, rng, mass) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`draw`'s ``n`` draws among the listed items whose windows fit, each by its weight (what
        rejection against the whole tree draws, when it keeps fewer than :data:`~gear_flow.tails.LISTED_BELOW`
        of its draws); None when none of them has weight."""
        live = self._valid_slots(length, boundary)
        w = self.sampler.leaf_weights(live).astype(np.float64)
        cum = np.cumsum(w)
        if not len(w) or not cum[-1] > 0:
            return None
        i = _by_weight(w, cum, rng.random(n))
        return live[i], w[i] / mass

    def _valid_slots(self, length: int, boundary: str) -> np.ndarray:
        slots = np.flatnonzero(self.active)
        valid = self.valid_fn(length, boundary)
        return slots if valid is None or not len(slots) else slots[valid(slots)]

    def valid_count(self, length: int, boundary: str) -> int:
        """Live items whose window fits (O(capacity): asked only when no item has weight).

        Parameters
        ----------
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode: windows crossing an episode's end are
            excluded (``strict``) or zero-padded.

        Returns
        -------
        int
            Live items whose window fits.
        """
        with self.lock:
            return len(self._valid_slots(length, boundary))

    def _draw_uniform(self, n: int, length: int, boundary: str, rng) -> tuple[np.ndarray, np.ndarray]:
        slots = self._valid_slots(length, boundary)
        if not len(slots):
            self._raise_empty(length, boundary)
        return slots[rng.integers(len(slots), size=n)], np.full(n, 1.0 / len(slots))

    def _consume(self, slots: np.ndarray) -> None:
        # a change of the selection state as any other (a disk shard's header not clean first: a kill after a
        # flush and before the sample's counts left a clean header over a changed tree, refused as corrupted)
        with self._counting():
            old = self.sampler.leaf_weights(slots)
            self.sampler.consume(slots)
            self.tails.change(slots, old, self.sampler.leaf_weights(slots))

    def new_epoch(self, drawn: np.ndarray | None = None) -> None:
        """WithoutReplacement: make every live item drawable again.

        Parameters
        ----------
        drawn : numpy.ndarray, optional
            int64 slots a sample whose draws are not counted yet drew before
            this epoch (repeats: as often): those it drew as often as their
            items may still go (``max_times_sampled``) stay out of the new
            epoch, as they would had it counted them.
        """
        with self.lock, self.writing():
            self.sampler.new_epoch()
            self.tails.clear()
            if drawn is not None and len(drawn) and self.times_sampled is not None:
                slots, times = np.unique(np.asarray(drawn, dtype=np.int64), return_counts=True)
                spent = slots[(self.active[slots] == 1) & (self.times_sampled[slots] + times >= self.max_times_sampled)]
                if len(spent):
                    self._consume(spent)

    def goes_left(self, length: int, boundary: str) -> int:
        """With ``max_times_sampled``: the times the live items whose window fits may still go, summed (the
        most rows of batches drawn before an insert); without, the number of such items.

        Parameters
        ----------
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode.

        Returns
        -------
        int
            The sum of ``max_times_sampled - times_sampled`` over those items.
        """
        with self.lock:
            slots = self._valid_slots(length, boundary)
            if self.times_sampled is None:
                return len(slots)
            return int((self.max_times_sampled - self.times_sampled[slots]).sum())

    def unseen(self, length: int, boundary: str) -> int:
        """WithoutReplacement: items still drawable in this epoch (valid for the window).

        Parameters
        ----------
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode: windows crossing an episode's end are
            excluded (``strict``) or zero-padded.

        Returns
        -------
        int
            The valid mass rounded (each undrawn item weighs 1).
        """
        return int(round(self.valid_mass(length, boundary)))

    def _raise_empty(self, length: int, boundary: str):
        raise nothing_to_sample(f"shard {self.shard_id}", self.size, self.longest_episode(), length, boundary)

    # -- ordered selection -------------------------------------------------------
    def candidates(
        self, n: int, length: int, boundary: str, horizon: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Best ``n`` items for the sampler; ``horizon``: only items stamped before it.

        A distributed table passes the stamp of its oldest insert still being
        written, so that an ordered sample sees a prefix of the insertion order
        (a Queue never hands out an item before an older one that is in flight).

        Parameters
        ----------
        n : int
            Most items wanted.
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode: windows crossing an episode's end are
            excluded (``strict``) or zero-padded.
        horizon : int, optional
            Table-wide stamp; only items stamped before it qualify.

        Returns
        -------
        slots : numpy.ndarray
            int64 ``[k]``, ``k <= n``: best first.  With ``max_times_sampled``
            an item comes as many times in a row as it may still be handed out
            (as Reverb samples a batch item by item, handing the best item out
            again until it reaches the limit and is removed).
        keys : numpy.ndarray
            float64 order keys, larger is better: ``[k]``, or ``[k, c]``
            compared column by column (the sampler's, see
            :meth:`~gear_flow.selectors.base.OrderedSelector.candidates`).
        """
        sel = self.sampler
        assert isinstance(sel, OrderedSelector)
        with self.lock:
            valid = self.valid_fn(length, boundary)
            if horizon is not None:
                fits = valid

                def valid(slots):
                    ok = self.item_stamps(slots) < horizon
                    return ok if fits is None else ok & fits(slots)

            slots, keys = sel.candidates(n, valid)
            if self.times_sampled is not None and len(slots):
                left = np.clip(self.max_times_sampled - self.times_sampled[slots].astype(np.int64), 0, n)
                slots, keys = np.repeat(slots, left)[:n], np.repeat(keys, left, axis=0)[:n]
            return slots, keys

    # -- gathering -------------------------------------------------------------------
    def take(
        self,
        slots: np.ndarray,
        length: int,
        boundary: str,
        rng: np.random.Generator,
        out: dict,
        offset: int,
        columns: Iterable[str],
        record: bool = True,
        gather: bool = True,
    ) -> Windows:
        """Gather the windows of ``slots`` into ``out`` and optionally record the sample.

        ``record=False`` leaves the shard unchanged; :meth:`record_samples`
        then commits the sample (two-phase samples over several workers).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[b]`` slots of live items (from :meth:`draw` or
            :meth:`candidates`); repeats allowed.
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode: windows crossing an episode's end are
            excluded (``strict``) or zero-padded.
        rng : numpy.random.Generator
            Draws window positions within episode items.
        out : dict
            Column name to a uint8 byte buffer ``[B, L, nbytes]`` of the
            shard's tier (host or device).
        offset : int
            Row of ``out`` for the first window; rows
            ``offset:offset + b`` are written.
        columns : iterable of str
            Columns to gather.
        record : bool, default True
            Count the samples and expire items that reached ``max_times_sampled``.
        gather : bool, default True
            False: only place the windows (a shared-ring reader copies them itself).

        Returns
        -------
        Windows
            Placement of each window.
        """
        with self.lock:
            win = self.windows(slots, length, boundary, rng)
            b = len(slots)
            if gather:  # gather=False: a shared-ring reader copies them itself
                # every column in one call: the GPU tiers gather them all in one launch
                self.tier.gather_columns(
                    self.ring.bytes,
                    win.src_start,
                    win.dst_offset,
                    win.n_valid,
                    {name: out[name][offset : offset + b] for name in columns},
                )
            if record:
                self._record(slots)
            return win

    def take_rows(
        self,
        slots: np.ndarray,
        probs: np.ndarray,
        scale: float,
        length: int,
        boundary: str,
        rng: np.random.Generator,
        out: SampleBuffers,
        offset: int,
        columns: Iterable[str],
    ) -> None:
        """:meth:`take` into a batch and its rows (keys, probabilities, episode ids, timesteps, mask, priorities
        as drawn, times sampled), the sample recorded.

        Step items are placed, gathered and written by one compiled call
        (:func:`~gear_flow.storage.windows.take_steps`) on a tier that gathers
        on the host, or placed and written by one and gathered by the tier's
        :meth:`~gear_flow.storage.base.StorageTier.gather_columns` (a device
        launch, a disk readahead, a parallel copy); episode items are placed
        by :meth:`windows` (each window's position a draw of ``rng``).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[b]`` slots of live items; repeats allowed.
        probs : numpy.ndarray
            float64 ``[b]``: each draw's probability within the shard.
        scale : float
            The shard's share of the batch's mass (the rows report ``probs * scale``).
        length : int
            Steps per window (``L``).
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode.
        rng : numpy.random.Generator
            Draws window positions within episode items.
        out : SampleBuffers
            The batch; rows ``offset:offset + b`` are written.
        offset : int
            Row of ``out`` for the first window.
        columns : iterable of str
            Columns to gather.
        """
        with self.lock:
            counted = self.sample_counts(slots)  # this sample included (before it is recorded)
            if not self.step_items:
                prio = self.priority[slots]  # as drawn (an expiring take may clear it)
                win = self.take(slots, length, boundary, rng, out.bytes, offset, columns, record=False)
                out.fill_rows(offset, self.shard_id, win.seqs, probs * scale, win.episode_ids, win.timesteps,
                              win.dst_offset, win.n_valid, prio, counted)  # fmt: skip
                self._record(slots)
                return
            idx = self.index.arrays
            args = (
                slots, self.ring.write_pos, self.capacity, self.step_episode, idx["start"], idx["length"],
                idx["episode_id"], self.index.size, length, boundary == "pad_head", self.priority, out.rows(), offset,
                self.shard_id, probs, scale, NO_COUNTS if counted is None else counted,
            )  # fmt: skip
            b = len(slots)

            def gather(src, dst, nv):
                outs = {name: out.bytes[name][offset : offset + b] for name in columns}
                self.tier.gather_columns(self.ring.bytes, src, dst, nv, outs)

            status = windows.take_step_rows(args, self._fused_pairs(out, columns, b), gather)
            if status == -4:
                raise IndexError(
                    f"shard {self.shard_id}: {len(slots)} rows from row {offset} do not fit a batch of "
                    f"{len(out.keys)}, or not one probability per slot"
                )
            if status != -1:  # the checked path names what does not fit
                self.take(slots, length, boundary, rng, out.bytes, offset, columns, record=False)
                raise IndexError(f"shard {self.shard_id}: a window of the take does not fit its ring or the batch")
            self._record(slots)

    def _fused_pairs(self, out: SampleBuffers, columns: Iterable[str], n: int) -> tuple | None:
        """The tier's :meth:`~gear_flow.storage.base.StorageTier.fused_pairs` for a take of ``n`` rows into
        ``out``, kept for the next take into the same buffers (a steady state's every batch): the rings are
        the shard's for life and a batch's buffers do not change."""
        columns = tuple(columns)
        last = self._last_pairs
        if last is not None and last[0]() is out and last[2] == n and last[1] == columns:
            return last[3]
        pairs = self.tier.fused_pairs(self.ring.bytes, out.bytes, columns, n)
        # the buffers by a weak reference, as a table's checked sample arguments hold them (the pairs of a
        # host tier do hold their host buffers, as long as this is the last take)
        self._last_pairs = (weakref.ref(out), columns, n, pairs)
        return pairs

    def sample_counts(self, slots: np.ndarray) -> np.ndarray | None:
        """Times each of ``slots`` has been handed out once a sample taking them is recorded (call before the
        take), occurrence by occurrence: an item a batch holds twice counts up by one at each, as Reverb's
        item-by-item sampling reports it.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the sample, in its order (repeats allowed).

        Returns
        -------
        numpy.ndarray or None
            int64, one per slot; None without ``max_times_sampled``.
        """
        if self.times_sampled is None:
            return None
        out = np.empty(len(slots), dtype=np.int64)
        _counts_after(np.asarray(slots, dtype=np.int64), self.times_sampled, out)
        return out

    def _record(self, slots: np.ndarray) -> None:
        if self.times_sampled is None and self.store is None:  # a count only (no expiry, nothing to commit)
            self.counters.sampled += len(slots)
            return
        with self._counting():
            self.counters.sampled += len(slots)
            if self.times_sampled is not None:
                _count_sampled(self.times_sampled, np.asarray(slots, dtype=np.int64))
                done = _unique(slots[self.times_sampled[slots] >= self.max_times_sampled])
                self.counters.expired += self._drop_items(done)

    def _counting(self) -> contextlib.AbstractContextManager:
        """The block in which a sample's counts, expiries and epoch (the items it consumed) change: on a disk
        shard :meth:`writing`, so that they are committed with the header (a process killed after the sample
        reopens with the counts of the items its files hold); elsewhere none (a published state has no expiry,
        and its readers read no count: a version change would only make them draw again)."""
        return self.store.writing() if self.store is not None else _NO_BLOCK

    def _still_there(self, slots: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """Mask of items (slot, seq) that are still the live occupant of their slot."""
        return (self.active[slots] == 1) & (self.slot_seqs(slots) == seqs)

    def record_samples(self, slots: np.ndarray, seqs: np.ndarray) -> int:
        """Commit a sample gathered with ``record=False``.

        Counts it and expires what reached ``max_times_sampled``.  Items
        removed meanwhile were still handed out once; they are counted as
        sampled and not touched.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[b]`` slots sampled.
        seqs : numpy.ndarray
            int64 ``[b]`` their sequence numbers at sampling time
            (``Windows.seqs``), to detect slots reused since.

        Returns
        -------
        int
            Items expired by this commit.
        """
        with self.lock:
            before = self.counters.expired
            here = self._still_there(slots, seqs)
            self.counters.sampled += int((~here).sum())
            self._record(slots[here])
            return self.counters.expired - before

    def unconsume(self, slots: np.ndarray, seqs: np.ndarray) -> None:
        """Undo the epoch bookkeeping of a draw that was not handed out (WithoutReplacement).

        Items that are no longer the live occupant of their slot are skipped;
        other samplers are left alone.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[b]`` slots drawn.
        seqs : numpy.ndarray
            int64 ``[b]`` their sequence numbers at draw time.
        """
        with self.lock:
            slots = _unique(slots[self._still_there(slots, seqs)])
            if len(slots) and getattr(self.sampler, "without_replacement", False):
                self._restore_epoch(slots)

    def _restore_epoch(self, slots: np.ndarray) -> None:
        """Live items ``slots`` (distinct) drawn without replacement and not handed out join the epoch again
        (call holding :attr:`lock`)."""
        with self._counting():
            old = self.sampler.leaf_weights(slots)
            self.sampler.insert(slots, self.priority[slots])
            self.tails.change(slots, old, self.sampler.leaf_weights(slots))

    def uncount(self, n: int) -> None:
        """Forget ``n`` samples counted by a sample that was then abandoned (no expiry involved).

        Parameters
        ----------
        n : int
            Samples to subtract from ``counters.sampled``.
        """
        with self.lock, self._counting():
            self.counters.sampled -= int(n)

    def count_drawn(self, n: int) -> None:
        """Count ``n`` samples that readers on this host drew from the published state themselves.

        Parameters
        ----------
        n : int
            Samples to add to ``counters.sampled``.
        """
        with self.lock, self._counting():
            self.counters.sampled += int(n)

    # -- removal by the remover -------------------------------------------------------
    def remover_candidates(self, n: int, seqs: bool = False) -> tuple[np.ndarray, ...]:
        """Best victims for an ordered remover (nothing changes).

        Parameters
        ----------
        n : int
            Most items wanted.
        seqs : bool, default False
            Also return each victim's seq (read under the same lock), for a
            removal that must spare a slot written over meanwhile.

        Returns
        -------
        slots : numpy.ndarray
            int64 ``[k]``, ``k <= n``.
        keys : numpy.ndarray
            float64 order keys, larger evicts first: ``[k]``, or ``[k, c]``
            compared column by column.
        seqs : numpy.ndarray
            int64 ``[k]`` (only with ``seqs=True``).
        """
        with self.lock:
            slots, keys = self.remover.candidates(n)
            return (slots, keys, self.slot_seqs(slots)) if seqs else (slots, keys)

    def remove_by_remover(
        self, n: int, rng: np.random.Generator, slots: np.ndarray | None = None, seqs: np.ndarray | None = None
    ) -> int:
        """Evict ``n`` items chosen by the remover (or exactly ``slots`` if given).

        A weighted remover draws distinct items by their current weights;
        when only zero-weight items are left, the rest are picked uniformly.

        Parameters
        ----------
        n : int
            Items to evict (at most the shard's size are).
        rng : numpy.random.Generator
            Source of the remover's draws.
        slots : numpy.ndarray, optional
            int64 slots to evict instead (chosen by a table across shards);
            inactive ones are skipped.
        seqs : numpy.ndarray, optional
            int64 seq of the item meant at each of ``slots``: a slot whose
            live item is another (written over since) is skipped.

        Returns
        -------
        int
            Items evicted.
        """
        with self.lock, self.writing():
            if slots is None:
                if isinstance(self.remover, OrderedSelector):
                    slots, _ = self.remover.candidates(n)
                else:
                    want = min(n, self.size)
                    chosen = []
                    while len(chosen) < want and self.remover.mass > 0:  # one at a time: distinct, by current weights
                        s = self.remover.draw(rng.random(1))
                        chosen.append(int(s[0]))
                        self.remover.remove(s)
                    if len(chosen) < want:
                        # the live items left all have weight 0 (Prioritized, priority 0): pick
                        # uniformly among them, as Reverb's selectors do when every weight is 0;
                        # leaving them would keep the table above max_size for good
                        left = np.setdiff1d(np.flatnonzero(self.active), chosen)
                        chosen.extend(rng.choice(left, want - len(chosen), replace=False).tolist())
                    slots = np.array(chosen, dtype=np.int64)
            slots = np.asarray(slots, dtype=np.int64)
            if seqs is not None:
                slots = slots[self._still_there(slots, np.asarray(seqs, dtype=np.int64))]
            k = self._drop_items(slots)
            self.counters.removed += k
            return k

    def shared_layout(self) -> dict | None:
        """How another process on this machine maps this shard's rings.

        Returns
        -------
        dict or None
            ``capacity`` (int), ``header`` and ``columns`` (column name to
            descriptor), the descriptors from the tier's ``describe``, and
            ``selection`` (the state readers draw from,
            :meth:`~gear_flow.storage.shared_selection.SelectionState.describe`;
            None when only this shard's owner draws); None unless the tier is
            shared.
        """
        if self.ring.header is None:
            return None
        d = self.tier.describe
        with self.lock:  # a write publishes under it: a grown index's new block named, the old one freed
            return {
                "capacity": self.capacity,
                "header": d(self.ring.header),
                "columns": {c: d(a) for c, a in self.ring.columns.items()},
                "selection": None if self.published is None else self.published.describe(),
            }

    # -- info ---------------------------------------------------------------------------
    def info(self) -> dict:
        """A snapshot of the shard's state and counters.

        Returns
        -------
        dict
            ``shard``, ``size`` (live items), ``episodes``, ``steps_stored``,
            ``capacity``, ``write_pos`` (absolute steps written) and every
            :class:`Counters` field; all int.  A disk shard adds ``disk``
            (:meth:`DiskStore.info <gear_flow.storage.disk_state.DiskStore.info>`:
            bytes on disk and resident, the process's page-ins).
        """
        with self.lock:
            out = {
                "shard": self.shard_id,
                "size": self.size,
                "episodes": len(self.index),
                "steps_stored": int(self.index.lengths().sum()),
                "capacity": self.capacity,
                "write_pos": self.ring.write_pos,
                **self.counters.as_dict(),
            }
        if self.store is not None:
            out["disk"] = self.store.info()
        return out

    def nbytes(self) -> dict:
        """Resident bytes by part (data vs overhead).

        Returns
        -------
        dict
            ``data``: bytes of the column rings; ``overhead``: per-item
            state, episode index and selector trees (a device tree counts its
            host mirror too).  Both int.  A disk shard's are the bytes of its
            files the page cache holds now.
        """
        if self.store is not None:  # mapped files: what the page cache holds of them, not their size
            return {
                "data": self.tier.bytes_resident(rings=True) or 0,
                "overhead": self.tier.bytes_resident(rings=False) or 0,
            }
        over = self.active.nbytes + self.priority.nbytes + self.index.nbytes
        if self.step_episode is not None:
            over += self.step_episode.nbytes
        if self.times_sampled is not None:
            over += self.times_sampled.nbytes
        for sel in {id(self.sampler): self.sampler, id(self.remover): self.remover}.values():
            trees = getattr(sel, "sums", None) or getattr(sel, "maxes", None)
            if trees is not None:
                over += trees.nbytes  # a device tree's bytes and its host mirror's
        return {"data": self.ring.nbytes, "overhead": over}
