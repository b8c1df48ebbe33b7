"""A shard's selection state in shared memory: published by its owner under a seqlock, for readers on its host.

A shard on a shared tier whose sampler draws by weight and whose samples
change nothing (``Uniform`` or ``Prioritized``, no ``max_times_sampled``)
keeps the state such a draw reads in named segments beside its rings: the
sampler's sum tree, each step's episode, each item's priority and the
episode index.  A process on the same host maps them
(:class:`MappedState`) and draws by itself, with no request to the owner
(:mod:`gear_flow.distributed.reader_draw`).

The owner stays the only writer.  Every change of that state (an insert, an
eviction, a priority update, a delete, a restore) runs inside
:meth:`SelectionState.writing`, which makes the header's ``version`` odd
before the change and even again after it, with the index's bounds and the
strict-window tail masses it has cached published in between.  A reader
reads the version, draws, gathers and reads the version again: equal and
even, nothing it read changed meanwhile (x86-64 orders plain loads with
loads and stores with stores, as the rings' seqlock relies on too);
otherwise it draws again.

A shard that moves out is held (the version stays odd: its owner answers
every draw, refusing those planned before the move), and one that leaves
its owner is retired for good; a reader whose owner died finds no such
process (:meth:`~gear_flow.storage.shared.Attached.owner_alive`).  Either
way the owner's path finds out what happened to the shard.

The episode index grows by doubling: its new arrays are new segments, and the
header's ``index_generation`` tells a reader that mapped the old ones to map
the shard's layout again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numba import njit

from ..ops import sumtree
from ..tails import LISTED_BELOW, valid_mass
from . import windows
from .windows import Windows

if TYPE_CHECKING:
    from ..shard import Shard
    from .base import StorageTier

#: header fields (int64): the seqlock's version (odd while the owner writes), the ring's write position,
#: the episode index's ``first``, ``next``, ``size`` and generation, the items stored, the tail masses cached
VERSION, WRITE_POS, INDEX_FIRST, INDEX_NEXT, INDEX_SIZE, INDEX_GENERATION, SIZE, N_TAILS = range(8)
#: where the cached tail masses start: ``(length, mass as float64 bits)`` pairs
TAILS = 8
#: tail masses published at most (the owner's :class:`~gear_flow.tails.TailMass` caches as many)
MAX_TAILS = 4
HEADER_LEN = TAILS + 2 * MAX_TAILS
#: the episode index's fields a reader needs to place windows
INDEX_FIELDS = ("start", "length", "episode_id")


def shareable(shard: Shard) -> bool:
    """Whether ``shard``'s readers on its host may draw from its state themselves.

    Parameters
    ----------
    shard : Shard
        A shard, built (selectors bound).

    Returns
    -------
    bool
        Its tier is shared and host-resident, its sampler draws by weight
        from a host tree without changing anything (not
        ``WithoutReplacement``) and no item expires after a number of
        samples.
    """
    from ..selectors.base import WeightedSelector

    sel = shard.sampler
    return (
        bool(getattr(shard.tier, "shared", False))
        and isinstance(sel, WeightedSelector)
        and not sel.without_replacement
        and not sel.sums.on_device
        and not shard.max_times_sampled
    )


def _carve(block: np.ndarray, layout: dict[str, Any]) -> dict[str, np.ndarray]:
    """The arrays ``layout`` places in ``block`` (uint8): ``name -> (offset, dtype, shape)``."""
    out = {}
    for name, (off, dtype, shape) in layout.items():
        dt = np.dtype(dtype)
        n = int(np.prod(shape))
        out[name] = block[off : off + n * dt.itemsize].view(dt).reshape(shape)
    return out


class SelectionState:
    """The owner's side: moves a shard's selection arrays into shared segments of its tier and publishes
    each change.

    Two segments: one block holding the header, the sampler's tree, the
    priorities and (step items) each step's episode; and the episode index's
    ``start``, ``length`` and ``episode_id``, replaced when the index grows.

    Parameters
    ----------
    shard : Shard
        A shard for which :func:`shareable` holds; its arrays are replaced
        by shared ones of the same contents.
    """

    def __init__(self, shard: Shard) -> None:
        self.tier: StorageTier = shard.tier
        self._shard = shard
        self._depth = 0
        self._held = False  # odd until resumed (a move out) or for good (retired)
        self._retired = False
        sums = shard.sampler.sums
        parts = {"header": (np.int64, (HEADER_LEN,)), "tree": (np.float64, sums.tree.shape),
                 "priority": (np.float64, shard.priority.shape)}  # fmt: skip
        if shard.step_episode is not None:
            parts["step_episode"] = (np.int64, shard.step_episode.shape)
        self.layout, off = {}, 0
        for name, (dtype, shape) in parts.items():
            self.layout[name] = (off, np.dtype(dtype).str, tuple(int(x) for x in shape))
            off += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 64) * 64  # each on its own cache lines
        self.block = self.tier.empty((off,), np.uint8)
        views = _carve(self.block, self.layout)
        self.header = views["header"]
        self.header[:] = 0
        for name in ("priority", "step_episode"):
            if name in views:
                views[name][...] = getattr(shard, name)
        sums.place(views["tree"])
        shard.priority = views["priority"]
        if shard.step_episode is not None:
            shard.step_episode = views["step_episode"]
        self._index = shard.index.share(INDEX_FIELDS, self._index_block)
        self._publish()

    def _index_block(self, k: int, n: int) -> np.ndarray:
        a = self.tier.empty((k, n), np.int64)
        a[...] = 0
        return a

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Change the state inside this block (under the shard's lock); nested blocks count as one.

        Yields
        ------
        None
            The version is odd until the outermost block ends, whichever way.
        """
        h = self.header
        if self._depth == 0 and not self._held:
            h[VERSION] += 1
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and not self._held:
                self._publish()
                h[VERSION] += 1

    def hold(self) -> None:
        """Keep the version odd until :meth:`resume` (the shard is moving out: its owner answers every
        draw, refusing those planned before the move) or for good (:meth:`retire`).  Call holding the
        shard's lock, outside :meth:`writing`."""
        if not self._held:
            self._held = True
            self.header[VERSION] += 1

    def resume(self) -> None:
        """Readers may draw again (a move that held the shard failed: it stays here).  Call holding the
        shard's lock."""
        if self._held and not self._retired:
            self._held = False
            self._publish()
            self.header[VERSION] += 1

    def retire(self) -> None:
        """Readers never draw from this state again (its shard left this owner: dropped, moved or lost)."""
        self.hold()
        self._retired = True

    def _publish(self) -> None:
        s, h = self._shard, self.header
        idx = s.index
        if idx.block is not self._index:  # the index grew into a new block: the old one goes (readers re-map)
            old, self._index = self._index, idx.block  # (the new one named before the old one's name goes)
            free = getattr(self.tier, "free", None)
            if free is not None:
                free(old)
        h[WRITE_POS] = s.ring.write_pos
        h[INDEX_FIRST], h[INDEX_NEXT], h[INDEX_SIZE], h[INDEX_GENERATION] = (
            idx.first,
            idx.next,
            idx.size,
            idx.generation,
        )
        h[SIZE] = s.size
        # (an entry whose rounding is not small against what it leaves is left to the owner's recompute)
        entries = s.tails.exact_entries(s.sampler.mass)[-MAX_TAILS:] if s.weighted and s.tails.entries else []
        pairs = h[TAILS:].view(np.float64)
        for k, (length, mass) in enumerate(entries):
            h[TAILS + 2 * k] = int(length)
            pairs[2 * k + 1] = float(mass)
        h[N_TAILS] = len(entries)

    def publishes(self, length: int) -> bool:
        """Whether the tail mass of strict windows of ``length`` steps is published.

        Parameters
        ----------
        length : int
            Window length.

        Returns
        -------
        bool
            It is among the cached entries published.
        """
        n = int(self.header[N_TAILS])
        return any(int(self.header[TAILS + 2 * k]) == length for k in range(n))

    def describe(self) -> dict[str, Any]:
        """What a reader maps (:class:`MappedState`).

        Returns
        -------
        dict
            ``block`` (the tier's ``describe`` of the block) and ``layout``
            (``name -> (byte offset, dtype str, shape)`` of ``header``,
            ``tree``, ``priority`` and, for step items, ``step_episode``);
            ``index`` (the index block's descriptor, rows
            :data:`INDEX_FIELDS`).
        """
        d = self.tier.describe
        return {
            "block": d(self.block),
            "layout": {k: [o, dt, list(sh)] for k, (o, dt, sh) in self.layout.items()},
            "index": d(self._index),
        }


class MappedState:
    """A reader's mapping of one shard's selection state (see the module docstring).

    Parameters
    ----------
    info : dict
        :meth:`SelectionState.describe` of the owner.
    shard : int
        The shard's id (for the error when a segment is gone).
    map_array : callable
        ``map_array(descriptor, shard) -> numpy.ndarray``: a segment mapped
        read-only, as the tier's ``describe`` described it (the rings' own
        mapping, :class:`~gear_flow.storage.shared.Attached`).

    Raises
    ------
    ShardLostError
        A segment no longer exists (its worker exited).
    """

    def __init__(self, info: dict[str, Any], shard: int, map_array: Any) -> None:
        block = map_array(info["block"], shard)
        #: the whole mapped block (uint8): header, tree, priorities, step episodes
        self.block = block
        views = _carve(block, {k: (o, dt, tuple(sh)) for k, (o, dt, sh) in info["layout"].items()})
        self.header = views["header"]
        self.tree = views["tree"]
        self.priority = views["priority"]
        self.step_episode = views.get("step_episode")
        index = map_array(info["index"], shard)
        self.index = {f: index[k] for k, f in enumerate(INDEX_FIELDS)}
        self.index_size = index.shape[1]
        self.generation = int(self.header[INDEX_GENERATION])

    def version(self) -> int:
        """The seqlock's version now (odd: the owner is writing).

        Returns
        -------
        int
            Read it before a draw and after the gather.
        """
        return int(self.header[VERSION])

    def tail(self, length: int) -> float | None:
        """The published tail mass of strict windows of ``length`` steps.

        Parameters
        ----------
        length : int
            Window length.

        Returns
        -------
        float or None
            None when the owner has not published it.
        """
        h = self.header
        pairs = h[TAILS:].view(np.float64)
        for k in range(min(int(h[N_TAILS]), MAX_TAILS)):
            if int(h[TAILS + 2 * k]) == length:
                return float(pairs[2 * k + 1])
        return None

    def draw_slots(
        self,
        n: int,
        length: int,
        boundary: str,
        rng: np.random.Generator,
        capacity: int,
        step_items: bool,
        find: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
    ) -> Drawn | None:
        """Draw ``n`` items from the state as it is now, as the owner's :meth:`~gear_flow.shard.Shard.draw`
        does; their windows are placed by :meth:`draw`, or by the owner's take
        (:func:`~gear_flow.storage.windows.take_step_rows`) over the same mapped arrays.

        Strict windows are drawn by rejection against the whole tree, and each
        probability is the item's weight over the valid mass read (the total
        minus the published tail mass).  Gather the windows, then check
        :meth:`unchanged` before using anything drawn.

        Parameters
        ----------
        n : int
            Items to draw (with replacement).
        length : int
            Window length.
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode.
        rng : numpy.random.Generator
            Source of the draw.
        capacity : int
            The shard's capacity, in steps.
        step_items : bool
            Items are steps (else episodes).
        find : callable, optional
            ``find(tree, targets, out)``: the inverse-CDF descent over
            :attr:`tree` (host arrays in, leaves written to ``out``).
            Default the host's (:func:`gear_flow.ops.sumtree.find`, numba);
            a learner's GPU passes its own
            (:func:`gear_flow.gpu.shared.state_find`), whose leaves are the
            same for the same targets, so the draw is too.

        Returns
        -------
        Drawn or None
            None when this state cannot be drawn from here now: the owner is
            writing, the index grew (map the layout again: :attr:`regrown`),
            the tail mass of this length is not published, no valid item has
            weight, the valid items hold less than
            :data:`~gear_flow.tails.LISTED_BELOW` of the weight (the owner
            lists them), or what was read is torn.  The owner draws then.
        """
        find = sumtree.find if find is None else find
        h = self.header
        v = int(h[VERSION])
        if v & 1 or self.regrown():
            return None
        total = float(self.tree[1])
        mass = self._valid(total, length, boundary)
        strict = boundary == "strict" and length > 1
        if mass is None or not mass > 0 or strict and mass < LISTED_BELOW * total:
            return None  # (the owner lists the valid items then: rejection here would draw other items)
        hi = int(h[WRITE_POS]) if step_items else int(h[INDEX_NEXT])
        steps = self.step_episode if step_items else windows.NO_STEPS
        idx = self.index
        out = np.empty(n, dtype=np.int64)
        got, rounds = 0, 0
        while got < n:
            s = np.empty(n - got, dtype=np.int64)
            find(self.tree, rng.random(n - got) * total, s)
            got = _keep(s, out, got, capacity, strict, hi, steps, idx["start"], idx["length"], self.index_size,
                        step_items, length)  # fmt: skip
            if got < 0:  # a leaf past the shard's: torn
                return None
            rounds += 1
            if got < n and rounds > MAX_ROUNDS:  # mostly tails, or torn: the owner draws
                return None
        P = self.tree.shape[0] // 2
        return Drawn(out, self.tree[P + out] / mass, mass, v, hi)

    def draw(
        self,
        n: int,
        length: int,
        boundary: str,
        rng: np.random.Generator,
        capacity: int,
        step_items: bool,
        find: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
    ) -> Draw | None:
        """:meth:`draw_slots`, and the drawn items' windows placed as the owner's
        :meth:`~gear_flow.shard.Shard.windows` places them.

        Parameters
        ----------
        n, length, boundary, rng, capacity, step_items, find
            As :meth:`draw_slots` takes them (``rng`` also places episode
            items' windows).

        Returns
        -------
        Draw or None
            None as :meth:`draw_slots` says, or when a placed window is torn
            (the gather would refuse it).
        """
        d = self.draw_slots(n, length, boundary, rng, capacity, step_items, find)
        if d is None:
            return None
        index = windows.MappedIndex(self.index, self.index_size)
        win = windows.place(d.slots, d.hi, capacity, self.step_episode, index, step_items, length, boundary, rng)
        dst, nv = win.dst_offset, win.n_valid
        if np.any((nv < 0) | (dst < 0) | (dst + nv > length)):  # torn: the gather would refuse it
            return None
        return Draw(win, d.probs, self.priority[d.slots].copy(), d.mass, d.version)

    def mass(self, length: int, boundary: str) -> float | None:
        """The shard's valid mass now (total weight minus the published tail mass of strict windows).

        Parameters
        ----------
        length : int
            Window length.
        boundary : {"strict", "pad_tail", "pad_head"}
            Window boundary mode.

        Returns
        -------
        float or None
            None while the owner writes (or wrote meanwhile), when the tail
            mass of this length is not published, or when what is left of
            the total is within the tail mass's drift of zero (the owner
            sums the fitting items then).
        """
        v = int(self.header[VERSION])
        if v & 1:
            return None
        mass = self._valid(float(self.tree[1]), length, boundary)
        return mass if self.unchanged(v) else None

    def _valid(self, total: float, length: int, boundary: str) -> float | None:
        """The valid mass given the tree's ``total``: the owner's rule (:meth:`~gear_flow.shard.Shard.valid_mass`)."""
        if boundary != "strict" or length <= 1 or total <= 0:
            return total
        tail = self.tail(length)
        if tail is None:
            return None
        mass = valid_mass(total, tail)
        # within the published tails' drift of nothing: the owner tells a tiny remainder from none by summing
        # the fitting items (Shard.valid_mass), so its plans and draws are the ones a seed gives
        return mass if mass > 0 else None

    def regrown(self) -> bool:
        """Whether the owner's episode index grew into new segments since this mapping (map the layout again).

        Returns
        -------
        bool
            The header's generation differs from the mapped one.
        """
        return int(self.header[INDEX_GENERATION]) != self.generation

    def unchanged(self, version: int) -> bool:
        """Whether nothing of the state changed since a draw read ``version`` (call after gathering).

        Parameters
        ----------
        version : int
            :attr:`Draw.version`.

        Returns
        -------
        bool
            The version is still that one.
        """
        return int(self.header[VERSION]) == version


#: rejection rounds a reader's strict draw takes before leaving the draw to the owner (whose own rejection
#: goes on): a round keeps the drawn items whose windows fit, most of them unless the tails hold most weight
MAX_ROUNDS = 16


@njit(nogil=True, cache=True)
def _keep(s, out, got, capacity, strict, hi, step_episode, starts, lengths, size, step_items, length):
    """One rejection round of a reader's draw: the drawn leaves ``s`` that are items whose windows fit (all of
    them unless ``strict``) appended to ``out`` from ``got``; returns the new count, or -1 for a leaf past the
    shard's (what was read is torn)."""
    for i in range(s.shape[0]):
        if s[i] >= capacity:
            return -1
    for i in range(s.shape[0]):
        if not strict or windows.fits_one(s[i], hi, capacity, step_episode, starts, lengths, size, step_items,
                                          length):  # fmt: skip
            out[got] = s[i]
            got += 1
    return got


class Drawn(NamedTuple):
    """A reader's draw of items from a shard's published state (:meth:`MappedState.draw_slots`).

    Parameters
    ----------
    slots : numpy.ndarray
        int64: the drawn items' slots.
    probs : numpy.ndarray
        float64: each item's probability within the shard, ``w_i / m_s``.
    mass : float
        The shard's valid mass read (``m_s``).
    version : int
        The state's version read; :meth:`MappedState.unchanged` checks it after the gather.
    hi : int
        The next sequence number the shard had issued (places the windows).
    """

    slots: np.ndarray
    probs: np.ndarray
    mass: float
    version: int
    hi: int


class Draw(NamedTuple):
    """A reader's draw from a shard's published state (:meth:`MappedState.draw`).

    Parameters
    ----------
    windows : Windows
        The drawn items' windows.
    probs : numpy.ndarray
        float64: each item's probability within the shard, ``w_i / m_s``.
    priorities : numpy.ndarray
        float64: each item's priority at the draw.
    mass : float
        The shard's valid mass read (``m_s``).
    version : int
        The state's version read; :meth:`MappedState.unchanged` checks it after the gather.
    """

    windows: Windows
    probs: np.ndarray
    priorities: np.ndarray
    mass: float
    version: int
