"""Where the windows of selected items are: their geometry from the episode index, for owners and readers alike.

A shard places the windows of the items it draws (:meth:`gear_flow.shard.Shard.windows`);
a reader on its host that draws from the shard's published state
(:mod:`~gear_flow.storage.shared_selection`) places them with the same
functions over its mapping of the same arrays, so the two never differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numba import njit

from ..ops import rows as _rows
from ..ops.gather import _first_bad, _gather_fused


class IndexArrays(Protocol):
    """The episode index as windows read it: its record arrays and their length (an
    :class:`~gear_flow.storage.episodes.EpisodeIndex`, or a reader's mapping of one)."""

    arrays: Mapping[str, np.ndarray]  # field (``start``, ``length``, ``episode_id``, ...) -> int64 [size]
    size: int  # the record of episode ``seq`` is row ``seq % size``


@dataclass
class MappedIndex:
    """:class:`IndexArrays` over arrays mapped from an owner's segment (a reader's view).

    Attributes
    ----------
    arrays : mapping of str to numpy.ndarray
        Field -> int64 ``[size]``.
    size : int
        Rows of each array.
    """

    arrays: Mapping[str, np.ndarray]
    size: int


@dataclass
class Windows:
    """Where the windows of selected items are (internal to shard and tables).

    Every field is an int64 ``[B]`` array, one entry per selected item, in
    the order of ``slots``.  The three gather fields are the arguments of
    :func:`gear_flow.ops.gather.gather_windows`.

    Attributes
    ----------
    slots : numpy.ndarray
        Item slots (``seq % capacity``) as selected.
    src_start : numpy.ndarray
        Ring slot of the window's first valid step.
    dst_offset : numpy.ndarray
        Position of that step in the window (head padding, ``pad_head`` only).
    n_valid : numpy.ndarray
        Valid steps in the window; the rest is zero padding.
    episode_ids : numpy.ndarray
        Table-wide id of the item's episode.
    timesteps : numpy.ndarray
        Index within the episode of the first valid step.
    seqs : numpy.ndarray
        Item sequence numbers (the low bits of the keys).
    src_abs : numpy.ndarray or None
        Absolute (unwrapped) step position of the first valid step, for
        shared-ring readers that check it was not overwritten meanwhile.
    """

    slots: np.ndarray
    src_start: np.ndarray  # ring slot of the first valid step
    dst_offset: np.ndarray  # position of that step in the window
    n_valid: np.ndarray  # valid steps in the window
    episode_ids: np.ndarray
    timesteps: np.ndarray  # index within the episode of the first valid step
    seqs: np.ndarray  # item sequence numbers (the low bits of the keys)
    src_abs: np.ndarray | None = None  # absolute position of the first valid step (shared-ring readers)


def slot_seqs(hi: int, slots: np.ndarray, capacity: int) -> np.ndarray:
    """Sequence number of the newest occupant of each slot.

    Parameters
    ----------
    hi : int
        The next sequence number to be issued (steps: the ring's write
        position; episodes: the index's ``next``).
    slots : numpy.ndarray
        int64 ``[n]`` slots in ``[0, capacity)``.
    capacity : int
        The shard's capacity.

    Returns
    -------
    numpy.ndarray
        int64 ``[n]``: the largest seq below ``hi`` that maps to the slot.

    Examples
    --------
    >>> slot_seqs(12, np.array([0, 1, 2, 3]), 10).tolist()
    [10, 11, 2, 3]
    """
    return hi - 1 - ((hi - 1 - slots) % capacity)


def fits(
    slots: np.ndarray,
    hi: int,
    capacity: int,
    step_episode: np.ndarray | None,
    index: IndexArrays,
    step_items: bool,
    length: int,
) -> np.ndarray:
    """Which items' strict windows of ``length`` steps fit in their episode (the items :func:`place` places).

    Parameters
    ----------
    slots : numpy.ndarray
        int64 ``[n]`` slots of live items.
    hi : int
        The next sequence number to be issued (:func:`slot_seqs`).
    capacity : int
        The shard's capacity (steps, or episodes for episode items).
    step_episode : numpy.ndarray or None
        Step items: int64 ``[capacity]``, the episode seq of each slot's step.
    index : IndexArrays
        The episode index.
    step_items : bool
        Items are steps (else episodes).
    length : int
        Window length.

    Returns
    -------
    numpy.ndarray
        bool ``[n]``.
    """
    slots = np.asarray(slots, dtype=np.int64)
    out = np.empty(len(slots), dtype=np.bool_)
    steps = step_episode if step_items else NO_STEPS
    _fits_mask(slots, hi, capacity, steps, index.arrays["start"], index.arrays["length"], index.size, step_items, length,
               out)  # fmt: skip
    return out


@njit(nogil=True, cache=True, inline="always")
def slot_seq(hi, slot, capacity):
    """:func:`slot_seqs` of one slot, for compiled code."""
    return hi - 1 - ((hi - 1 - slot) % capacity)


@njit(nogil=True, cache=True, inline="always")
def mod_near(x, m, base):
    """``x % m`` for compiled loops, without a division where ``base`` (a multiple of ``m``, once per batch)
    lies within ``m`` of ``x``: a batch's slots, seqs and episode rows all lie within one ring's length of
    each other, and a 64-bit division per item and per use cost the geometry of B=1024 steps 7.3 -> 5.9 us.
    Any other ``x`` is divided: the result is ``x % m`` either way (the one number in ``[0, m)`` congruent
    to it)."""
    r = x - base
    if r < 0:
        r += m
    elif r >= m:
        r -= m
    if r < 0 or r >= m:
        r = x % m
    return r


#: ``step_episode`` of a shard whose items are episodes (compiled code takes an array either way)
NO_STEPS = np.zeros(0, dtype=np.int64)


@njit(nogil=True, cache=True, inline="always")
def fits_one(slot, hi, capacity, step_episode, starts, lengths, size, step_items, length):
    """:func:`fits` of one item, for compiled code: the rule every strict draw keeps its items by, the owner's
    and a reader's of the published state."""
    seq = slot_seq(hi, slot, capacity)
    if step_items:
        row = step_episode[slot] % size
        return starts[row] + lengths[row] - seq >= length
    return lengths[seq % size] >= length


@njit(nogil=True, cache=True)
def _fits_mask(slots, hi, capacity, step_episode, starts, lengths, size, step_items, length, out):
    for i in range(slots.shape[0]):
        out[i] = fits_one(slots[i], hi, capacity, step_episode, starts, lengths, size, step_items, length)


def place(
    slots: np.ndarray,
    hi: int,
    capacity: int,
    step_episode: np.ndarray | None,
    index: IndexArrays,
    step_items: bool,
    length: int,
    boundary: str,
    rng: np.random.Generator,
) -> Windows:
    """Window placement for the items at ``slots``.

    A step item starts its window (ends it in ``pad_head`` mode); an
    episode item's window position is drawn uniformly among the valid ones.

    Parameters
    ----------
    slots : numpy.ndarray
        int64 ``[B]`` slots of live items; repeats allowed.
    hi : int
        The next sequence number to be issued (:func:`slot_seqs`).
    capacity : int
        The shard's capacity (steps, or episodes for episode items).
    step_episode : numpy.ndarray or None
        Step items: int64 ``[capacity]``, the episode seq of each slot's step.
    index : IndexArrays
        The episode index.
    step_items : bool
        Items are steps (else episodes).
    length : int
        Steps per window (``L``).
    boundary : {"strict", "pad_tail", "pad_head"}
        Window boundary mode.
    rng : numpy.random.Generator
        Draws window positions within episode items.

    Returns
    -------
    Windows
        One window per entry of ``slots``.
    """
    if step_items:  # every step item starts (pad_head: ends) its window: compiled, one pass
        seqs, first, dst, n_valid, episode_ids, timesteps = _step_windows(
            slots, hi, capacity, step_episode, index.arrays["start"], index.arrays["length"],
            index.arrays["episode_id"], index.size, length, boundary == "pad_head",
        )  # fmt: skip
        return Windows(slots, first % capacity, dst, n_valid, episode_ids, timesteps, seqs, first)
    seqs = slot_seqs(hi, slots, capacity)
    rows = seqs % index.size
    start = index.arrays["start"][rows]
    n_ep = index.arrays["length"][rows]
    end = start + n_ep
    if boundary == "strict":  # the item is the episode; its window position is uniform among the valid ones
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
        src_start=first % capacity,
        dst_offset=dst,
        n_valid=n_valid,
        episode_ids=index.arrays["episode_id"][rows],
        timesteps=first - start,
        seqs=seqs,
        src_abs=first,
    )


@njit(nogil=True, cache=True)
def _step_windows(slots, hi, capacity, step_episode, starts, lengths, episode_ids, size, length, pad_head):
    """:func:`place` of step items (the window starts at the item; ``pad_head``: ends there), one pass:
    each item's seq (:func:`slot_seqs`), the absolute first step, head padding, valid steps, episode id and
    timestep of each window."""
    B = slots.shape[0]
    res = np.empty((6, B), np.int64)  # one array out (each array a compiled function returns costs a boxing)
    seqs, first, dst, n_valid, ids, steps = res[0], res[1], res[2], res[3], res[4], res[5]
    # first every item's episode: independent loads, whose cache misses overlap (the index read behind each
    # one in the same pass made a chain that took them one at a time: 256 items of a 10M-step shard 10.9 -> 3.5 us)
    for b in range(B):
        ids[b] = step_episode[slots[b]]
    top = hi - 1  # slot_seq's rule, each (hi - 1 - slot) % capacity taken near the batch's one multiple
    near_t = top - top % capacity
    near_e = ids[0] - ids[0] % size if B else 0
    for b in range(B):
        t = top - mod_near(top - slots[b], capacity, near_t)
        row = mod_near(ids[b], size, near_e)
        start = starts[row]
        if pad_head:
            f = max(start, t - length + 1)
            n = t - f + 1
            dst[b] = length - n
        else:
            f = t
            n = min(length, start + lengths[row] - t)
            dst[b] = 0
        seqs[b], first[b], n_valid[b], ids[b], steps[b] = t, f, n, episode_ids[row], f - start
    return res


@njit(nogil=True, cache=True)
def place_steps(
    slots, hi, capacity, step_episode, starts, lengths, episode_ids, size, length, pad_head, priority,
    rows, off, shard, probs, scale, counted,
):  # fmt: skip
    """:func:`place` of step items and the batch's rows (:func:`gear_flow.ops.rows.fill`) in one call, each
    row's priority read as drawn; the caller gathers the windows (:func:`take_steps` does it here too).

    Parameters
    ----------
    slots, hi, capacity, step_episode, starts, lengths, episode_ids, size, length, pad_head
        As :func:`_step_windows` takes them (the shard's ring and index arrays).
    priority : numpy.ndarray
        float64 ``[capacity]``: the shard's priorities.
    rows, off, shard, probs, scale, counted
        As :func:`gear_flow.ops.rows.fill` takes them.

    Returns
    -------
    status : int
        -1 done; -4: the rows do not fit the batch, nothing written.
    windows : numpy.ndarray
        int64 ``[6, n]``: seqs, absolute first steps, head padding, valid steps, episode ids, timesteps.
    src_start : numpy.ndarray
        int64 ``[n]``: the ring slot of each window's first valid step.
    """
    n = slots.shape[0]
    prio = np.empty(n, np.float64)
    for b in range(n):  # independent loads, before the geometry's (their cache misses overlap)
        prio[b] = priority[slots[b]]
    res = _step_windows(slots, hi, capacity, step_episode, starts, lengths, episode_ids, size, length, pad_head)
    src = np.empty(n, np.int64)
    near = (hi - 1) - (hi - 1) % capacity  # (every window's first step is within the ring's length of hi)
    for b in range(n):
        src[b] = mod_near(res[1, b], capacity, near)
    if not _rows.fill(rows, off, shard, res[0], probs, scale, res[4], res[5], res[2], res[3], prio, counted):
        return -4, res, src
    return -1, res, src


@njit(nogil=True, cache=True)
def take_steps(
    slots, hi, capacity, step_episode, starts, lengths, episode_ids, size, length, pad_head, priority,
    rows, off, shard, probs, scale, counted, pairs,
):  # fmt: skip
    """:func:`place_steps` and the gather of every column, one call: the steady-state take of a shard whose
    tier gathers on the host.

    Parameters
    ----------
    slots, hi, capacity, step_episode, starts, lengths, episode_ids, size, length, pad_head, priority
        As :func:`place_steps` takes them.
    rows, off, shard, probs, scale, counted
        As :func:`gear_flow.ops.rows.fill` takes them.
    pairs : tuple
        ``(ring bytes [cap, nbytes], output bytes [B, L, nbytes])`` per column.

    Returns
    -------
    int
        -1 done; -4 the rows do not fit the batch (nothing written); otherwise the rows are written and no
        column byte is: a window or an output that does not fit (the caller's checked path names it).
    """
    # no prefetch pass first: each item's loads here are independent (no chain, unlike a tree's descent), so the
    # CPU already overlaps their misses, and a prefetch costs ~7 ns even for a line in cache (a pass over the
    # priorities, the episodes and each column, then the take, against the take alone, alternating on fresh
    # draws of a 10M-step shard: B=1024 83 -> 55 us, B=256 19.4 -> 18.0 us)
    status, res, src = place_steps(
        slots, hi, capacity, step_episode, starts, lengths, episode_ids, size, length, pad_head, priority,
        rows, off, shard, probs, scale, counted,
    )  # fmt: skip
    if status != -1:
        return status
    return _gather_fused(pairs, src, res[2], res[3], off, rows[0].shape[0])


def take_step_rows(
    args: tuple, pairs: tuple | None, gather: Callable[[np.ndarray, np.ndarray, np.ndarray], None]
) -> int:
    """The take of step items into a batch: :func:`take_steps` (placed, rows written and gathered by one
    compiled call) when the gather is the compiled one's, else :func:`place_steps` and ``gather`` of the
    placed windows.  The owner's take (:meth:`gear_flow.shard.Shard.take_rows`) and a reader's of a
    shard's published state (:mod:`gear_flow.distributed.reader_draw`) both take this way.

    Parameters
    ----------
    args : tuple
        :func:`place_steps`'s arguments (the shard's ring, index and priorities, or a reader's mapping
        of them, and the batch's rows).
    pairs : tuple or None
        ``(ring bytes, output bytes)`` per column for :func:`take_steps`
        (:meth:`~gear_flow.storage.base.StorageTier.fused_pairs`); None: ``gather`` copies.
    gather : callable
        ``gather(src_start, dst_offset, n_valid)``: every column's windows into the batch's rows (a tier's
        parallel copy, a device launch, a readahead); called only when every window fits.

    Returns
    -------
    int
        -1 done; -4 the rows do not fit the batch (nothing written); otherwise the rows are written and no
        column byte is: the first window that does not fit its ring or the batch (-2: an output).
    """
    if pairs is not None:
        return take_steps(*args, pairs)
    status, res, src = place_steps(*args)
    if status != -1:
        return status
    bad = _first_bad(args[2], args[8], src, res[2], res[3])
    if bad >= 0:
        return bad
    gather(src, res[2], res[3])
    return -1
