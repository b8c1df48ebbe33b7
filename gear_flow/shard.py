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

import logging
import threading
from dataclasses import dataclass

import numpy as np

from . import keys as keymod
from .errors import EmptyTableError, nothing_to_sample
from .selectors.base import OrderedSelector, Selector, WeightedSelector
from .spec import TableSpec
from .storage import ColumnRing, EpisodeIndex, get_tier
from .tails import TailMass

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
        return int(self.lengths.sum())


@dataclass
class Counters:
    """Item accounting of a shard: ``inserted == size + evicted + removed + deleted + expired``."""

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
        return dict(self.__dict__)


@dataclass
class Windows:
    """Where the windows of selected items are (internal to shard and tables)."""

    slots: np.ndarray
    src_start: np.ndarray  # ring slot of the first valid step
    dst_offset: np.ndarray  # position of that step in the window
    n_valid: np.ndarray  # valid steps in the window
    episode_ids: np.ndarray
    timesteps: np.ndarray  # index within the episode of the first valid step
    seqs: np.ndarray  # item sequence numbers (the low bits of the keys)
    src_abs: np.ndarray | None = None  # absolute position of the first valid step (shared-ring readers)


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
        tier="host",
    ):
        self.spec = spec
        self.shard_id = int(shard_id)
        self.capacity = spec.capacity
        self.step_items = spec.item_unit == "step"
        self.tier = get_tier(tier)
        self.ring = ColumnRing(spec, self.tier)
        self.index = EpisodeIndex()
        cap = self.capacity
        self.step_episode = np.full(cap, -1, dtype=np.int64) if self.step_items else None
        self.active = np.zeros(cap, dtype=np.uint8)
        self.priority = np.zeros(cap, dtype=np.float64)
        self.touched = np.zeros(cap, dtype=np.int64)
        self._clock = 0  # one past the newest stamp seen (updates without a table stamp use it)
        self.max_times_sampled = int(max_times_sampled)
        self.times_sampled = np.zeros(cap, dtype=np.int32) if self.max_times_sampled else None
        self.size = 0
        self.max_priority = 1.0
        self.counters = Counters()
        self.lock = threading.RLock()
        self.sampler = sampler
        self.remover = remover
        sampler.bind(self)
        remover.bind(self)
        self.weighted = isinstance(sampler, WeightedSelector)
        self.tails = TailMass(self._tail_mass_exact, self._reach)

    # -- ShardState protocol (for selectors) ----------------------------------
    def live_seq_range(self) -> tuple[int, int]:
        if self.step_items:
            return max(0, self.ring.write_pos - self.capacity), self.ring.write_pos
        return self.index.first, self.index.next

    def item_stamps(self, slots: np.ndarray) -> np.ndarray:
        seqs = self.slot_seqs(slots)
        if self.step_items:
            ep = self.step_episode[slots]
            return self.index.get("stamp", ep) + (seqs - self.index.get("start", ep))
        return self.index.get("stamp", seqs)

    def item_touched(self, slots: np.ndarray) -> np.ndarray:
        """Table-wide stamp of each item's insert or latest priority update (int64)."""
        return self.touched[slots]

    def slot_seqs(self, slots: np.ndarray) -> np.ndarray:
        """Sequence number of the live occupant of each slot."""
        hi = self.live_seq_range()[1]
        return hi - 1 - ((hi - 1 - slots) % self.capacity)

    # -- writing ----------------------------------------------------------------
    def insert(self, batch: EpisodeBatch) -> tuple[np.ndarray, int]:
        """Store whole episodes (validated; ``num_steps <= capacity``).

        Returns the key of each episode's first item and the number of items.
        """
        with self.lock:
            n = batch.num_steps
            w = self.ring.write_pos
            self.ring.begin_write(w + n)  # readers of a shared ring: these slots are about to change
            self._evict_steps_before(w + n - self.capacity)
            for name in self.ring.columns:  # one ring write per column: GPU tiers batch the episodes
                self.ring.write_chunks(w, name, [chunk[name] for chunk in batch.chunks])
            self.ring.write_pos = w + n
            starts = w + np.concatenate(([0], np.cumsum(batch.lengths)[:-1])).astype(np.int64)
            ep_seqs = self.index.append(starts, batch.lengths, batch.stamps, batch.episode_ids)
            if self.step_items:
                step_slots = (w + np.arange(n, dtype=np.int64)) % self.capacity
                self.step_episode[step_slots] = np.repeat(ep_seqs, batch.lengths)
                slots, first_seqs = step_slots, starts
            else:
                slots, first_seqs = ep_seqs % self.capacity, ep_seqs
            if batch.priorities is None:
                pr = np.full(len(slots), self.max_priority)
            else:
                pr = batch.priorities
                if len(pr):
                    self.max_priority = max(self.max_priority, float(pr.max()))
            if self.step_items:
                within = np.arange(n, dtype=np.int64) - np.repeat(starts - w, batch.lengths)
                stamps = np.repeat(np.asarray(batch.stamps, dtype=np.int64), batch.lengths) + within
            else:
                stamps = np.asarray(batch.stamps, dtype=np.int64)
            self._touch(slots, stamps)
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
        self.active[slots] = 1
        self.priority[slots] = priorities
        if self.times_sampled is not None:
            self.times_sampled[slots] = 0
        self.sampler.insert(slots, priorities)
        if self.weighted:
            self.tails.change(slots, np.zeros(len(slots)), self.sampler.leaf_weights(slots))
        self.remover.insert(slots, priorities)
        self.size += len(slots)
        self.counters.inserted += len(slots)

    def _drop_items(self, slots: np.ndarray) -> int:
        """Deactivate the active ones among ``slots``; returns how many."""
        slots = slots[self.active[slots] == 1]
        if len(slots):
            if self.weighted:
                self.tails.change(slots, self.sampler.leaf_weights(slots), np.zeros(len(slots)))
            self.active[slots] = 0
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
            steps = np.arange(total, dtype=np.int64) + np.repeat(st - (np.cumsum(ln) - ln), ln)
            return k, steps % self.capacity
        return k, seqs % self.capacity

    def live_overwritten(self, n_steps: int) -> int:
        """Live items the ring would overwrite to store ``n_steps`` more steps (nothing changes)."""
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
            self.step_episode[slots] = -1

    # -- keys ------------------------------------------------------------------
    def resolve(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Split seqs into (slots of live items, mask of live) — unknown seqs raise."""
        lo, hi = self.live_seq_range()
        bad = np.flatnonzero(seqs >= hi)
        if len(bad):
            from .errors import UnknownKeyError

            k = int(keymod.encode(self.shard_id, seqs[bad[:1]])[0])
            raise UnknownKeyError(k, f"shard {self.shard_id} has issued item seqs below {hi} only")
        slots = seqs % self.capacity
        live = (seqs >= lo) & (seqs >= 0) & (self.active[slots] == 1)
        return slots, live

    def update_priorities(self, seqs: np.ndarray, priorities: np.ndarray, stamps: np.ndarray | None = None) -> int:
        """Apply validated priorities; returns the number of stale keys ignored.

        ``stamps``: the table-wide stamp of each update (from the clock that
        stamps inserts), so heap ties go to the least recently inserted or
        updated item across shards; None stamps them from this shard's clock
        (exact within the shard only).
        """
        with self.lock:
            slots, live = self.resolve(seqs)
            stale = int((~live).sum())
            slots, pr = slots[live], priorities[live]
            if len(slots):
                self._touch(slots, None if stamps is None else np.asarray(stamps, dtype=np.int64)[live])
                self.priority[slots] = pr
                if self.weighted:
                    old = self.sampler.leaf_weights(slots)
                    self.sampler.update(slots, pr)
                    self.tails.change(slots, old, self.sampler.leaf_weights(slots))
                else:
                    self.sampler.update(slots, pr)
                self.remover.update(slots, pr)
                self.max_priority = max(self.max_priority, float(pr.max()))
            self.counters.stale_updates += stale
            return stale

    def delete(self, seqs: np.ndarray) -> tuple[int, int]:
        """Remove items; returns (deleted, stale)."""
        with self.lock:
            slots, live = self.resolve(seqs)
            n = self._drop_items(np.unique(slots[live]))
            stale = int((~live).sum())
            self.counters.deleted += n
            self.counters.stale_deletes += stale
            return n, stale

    # -- window geometry ----------------------------------------------------------
    def windows(self, slots: np.ndarray, length: int, boundary: str, rng: np.random.Generator) -> Windows:
        """Window placement for the items at ``slots``."""
        seqs = self.slot_seqs(slots)
        if self.step_items:
            ep = self.step_episode[slots]
            t = seqs
        else:
            ep = seqs
        start = self.index.get("start", ep)
        n_ep = self.index.get("length", ep)
        end = start + n_ep
        if not self.step_items:
            # the item is the episode; its window position is uniform among the valid ones
            if boundary == "strict":
                t = start + np.floor(rng.random(len(slots)) * np.maximum(n_ep - length + 1, 1)).astype(np.int64)
            else:
                t = start + np.floor(rng.random(len(slots)) * n_ep).astype(np.int64)
        if boundary == "pad_head":
            first = np.maximum(start, t - length + 1)
            n_valid = t - first + 1
            dst = length - n_valid
        else:
            first = t
            n_valid = np.minimum(length, end - t)
            dst = np.zeros(len(slots), dtype=np.int64)
        return Windows(
            slots=slots,
            src_start=first % self.capacity,
            dst_offset=dst,
            n_valid=n_valid,
            episode_ids=self.index.get("episode_id", ep),
            timesteps=first - start,
            seqs=seqs,
            src_abs=first,
        )

    def valid_fn(self, length: int, boundary: str):
        """Predicate over slots: does the item's window fit (None when all do)."""
        if boundary != "strict" or length <= 1:  # a one-step window always fits its item
            return None
        if self.step_items:

            def valid(slots):
                ep = self.step_episode[slots]
                end = self.index.get("start", ep) + self.index.get("length", ep)
                return end - self.slot_seqs(slots) >= length

        else:

            def valid(slots):
                return self.index.get("length", self.slot_seqs(slots)) >= length

        return valid

    def longest_episode(self) -> int:
        ln = self.index.lengths()
        return int(ln.max()) if len(ln) else 0

    # -- stochastic selection --------------------------------------------------------
    def valid_mass(self, length: int, boundary: str) -> float:
        """Sampling mass of items whose window fits (exact; strict mode subtracts tails)."""
        sel = self.sampler
        assert isinstance(sel, WeightedSelector)
        with self.lock:
            total = sel.mass
            if boundary != "strict" or length <= 1 or total <= 0:
                return total
            tail = self.tails.get(length)
            # a remainder within rounding of zero means nothing valid is left
            return total - tail if total - tail > total * 1e-9 else 0.0

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
        the probability of the distribution actually sampled.  When no valid
        item has any weight (every priority 0) the draw is uniform over the
        valid items, as in Reverb (the planner then weighs shards by
        :meth:`valid_count`).
        """
        sel = self.sampler
        assert isinstance(sel, WeightedSelector)
        with self.lock:
            if mass is None:
                mass = self.valid_mass(length, boundary)
            if mass <= 0:
                if sel.without_replacement:
                    self._raise_empty(length, boundary)
                return self._draw_uniform(n, length, boundary, rng)
            valid = self.valid_fn(length, boundary)
            out = np.empty(n, dtype=np.int64)
            got = 0
            rounds = 0
            while got < n:
                m = n - got
                s = sel.draw(rng.random(m))  # on the device: uniforms up, slots down
                if sel.without_replacement:
                    s = np.unique(s)
                    self._consume(s)  # invalid ones are skipped for this epoch
                    if valid is not None:
                        s = s[valid(s)]
                elif valid is not None:
                    s = s[valid(s)]
                out[got : got + len(s)] = s
                got += len(s)
                rounds += 1
                if got < n and (sel.mass <= 0 or rounds > 10_000):
                    raise EmptyTableError(
                        f"shard {self.shard_id}: could draw only {got} of {n} items (remaining mass {sel.mass:g})"
                    )
            probs = (
                np.full(n, 1.0 / (mass if mass > 0 else 1.0))
                if sel.without_replacement
                else sel.leaf_weights(out) / mass
            )
            return out, probs

    def _valid_slots(self, length: int, boundary: str) -> np.ndarray:
        slots = np.flatnonzero(self.active)
        valid = self.valid_fn(length, boundary)
        return slots if valid is None or not len(slots) else slots[valid(slots)]

    def valid_count(self, length: int, boundary: str) -> int:
        """Live items whose window fits (O(capacity): asked only when no item has weight)."""
        with self.lock:
            return len(self._valid_slots(length, boundary))

    def _draw_uniform(self, n: int, length: int, boundary: str, rng) -> tuple[np.ndarray, np.ndarray]:
        slots = self._valid_slots(length, boundary)
        if not len(slots):
            self._raise_empty(length, boundary)
        return slots[rng.integers(len(slots), size=n)], np.full(n, 1.0 / len(slots))

    def _consume(self, slots: np.ndarray) -> None:
        old = self.sampler.leaf_weights(slots)
        self.sampler.consume(slots)
        self.tails.change(slots, old, self.sampler.leaf_weights(slots))

    def new_epoch(self) -> None:
        """WithoutReplacement: make every live item drawable again."""
        with self.lock:
            self.sampler.new_epoch()
            self.tails.clear()

    def unseen(self, length: int, boundary: str) -> int:
        """WithoutReplacement: items still drawable in this epoch (valid for the window)."""
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

            return sel.candidates(n, valid)

    # -- gathering -------------------------------------------------------------------
    def take(
        self,
        slots: np.ndarray,
        length: int,
        boundary: str,
        rng: np.random.Generator,
        out: dict,
        offset: int,
        columns,
        record: bool = True,
        gather: bool = True,
    ) -> Windows:
        """Gather the windows of ``slots`` into ``out[name][offset:offset+len(slots)]``,
        and (``record``) count the samples and expire items that reached ``max_times_sampled``.

        ``out`` maps column names to uint8 byte buffers ``[B, L, nbytes]``.
        ``record=False`` leaves the shard unchanged; :meth:`record_samples`
        then commits the sample (two-phase samples over several workers).
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

    def _record(self, slots: np.ndarray) -> None:
        self.counters.sampled += len(slots)
        if self.times_sampled is not None:
            np.add.at(self.times_sampled, slots, 1)
            done = np.unique(slots[self.times_sampled[slots] >= self.max_times_sampled])
            self.counters.expired += self._drop_items(done)

    def _still_there(self, slots: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """Mask of items (slot, seq) that are still the live occupant of their slot."""
        return (self.active[slots] == 1) & (self.slot_seqs(slots) == seqs)

    def record_samples(self, slots: np.ndarray, seqs: np.ndarray) -> int:
        """Commit a sample gathered with ``record=False``: count it, expire what reached
        ``max_times_sampled``.  Items removed meanwhile were still handed out once;
        they are counted as sampled and not touched.  Returns the number expired."""
        with self.lock:
            before = self.counters.expired
            here = self._still_there(slots, seqs)
            self.counters.sampled += int((~here).sum())
            self._record(slots[here])
            return self.counters.expired - before

    def unconsume(self, slots: np.ndarray, seqs: np.ndarray) -> None:
        """Undo the epoch bookkeeping of a draw that was not handed out (WithoutReplacement)."""
        with self.lock:
            slots = np.unique(slots[self._still_there(slots, seqs)])
            if len(slots) and getattr(self.sampler, "without_replacement", False):
                old = self.sampler.leaf_weights(slots)
                self.sampler.insert(slots, self.priority[slots])
                self.tails.change(slots, old, self.sampler.leaf_weights(slots))

    def uncount(self, n: int) -> None:
        """Forget ``n`` samples counted by a sample that was then abandoned (no expiry involved)."""
        with self.lock:
            self.counters.sampled -= int(n)

    # -- removal by the remover -------------------------------------------------------
    def remover_candidates(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Best victims for an ordered remover (order key: larger = evict first)."""
        with self.lock:
            return self.remover.candidates(n)

    def remove_by_remover(self, n: int, rng: np.random.Generator, slots: np.ndarray | None = None) -> int:
        """Evict ``n`` items chosen by the remover (or exactly ``slots`` if given)."""
        with self.lock:
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
            k = self._drop_items(np.asarray(slots, dtype=np.int64))
            self.counters.removed += k
            return k

    def shared_layout(self) -> dict | None:
        """How another process on this machine maps this shard's rings (None unless the tier is shared)."""
        if self.ring.header is None:
            return None
        d = self.tier.describe
        return {
            "capacity": self.capacity,
            "header": d(self.ring.header),
            "columns": {c: d(a) for c, a in self.ring.columns.items()},
        }

    # -- info ---------------------------------------------------------------------------
    def info(self) -> dict:
        with self.lock:
            return {
                "shard": self.shard_id,
                "size": self.size,
                "episodes": len(self.index),
                "steps_stored": int(self.index.lengths().sum()),
                "capacity": self.capacity,
                "write_pos": self.ring.write_pos,
                **self.counters.as_dict(),
            }

    def nbytes(self) -> dict:
        """Resident bytes by part (data vs overhead)."""
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
