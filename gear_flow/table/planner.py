"""The one planner: how a sample or an eviction is decided from per-shard summaries.

Every table runs the same rules: the local table over its in-process shards,
a worker's host over the shards it holds, and the distributed handle over
shards on many workers.  To keep one copy of each rule, the planner is written
*sans I/O*: a plan is a generator that yields requests and receives their
answers; an executor (:mod:`gear_flow.table.executor` in-process, the
distributed sampler over the comm) answers them.  No Dask, no locks here.

Requests (yielded) and what the executor sends back:

* :class:`Summaries` → ``{kind: {shard: float}}`` (valid sampling mass,
  unseen epoch items, remover mass, size, count of items whose window fits);
* :class:`Candidates` → ``{shard: (slots, order_keys)}`` (best first);
* :class:`Draw` → ``None``: draw ``counts[s]`` items from shard ``s`` with
  its mass *at the draw* and gather them at the rows :func:`offsets` gives;
  the probability reported for an item is ``scale[s] * w_i / m'_s``, which is
  exactly the probability of the draw made (the shard was chosen with the
  planned masses, the item with the shard's mass when it was drawn), so it
  stays exact while writers insert between planning and drawing;
* :class:`Sequences` → ``{shard: (slots, probs, masses, seqs, ...)}``: each
  shard's own item-by-item draws (``max_times_sampled`` applied as it goes),
  by weight, then uniform over its items of weight 0, nothing recorded;
* :class:`Take` → ``None``: gather exactly these slots (probability 1, or
  the probabilities given) at the rows :func:`offsets` gives; a slot removed
  since the candidates were listed (or, with ``seqs``, written over) makes
  the executor retry the whole plan;
* :class:`NewEpoch` → ``None``: start a new epoch on every shard;
* :class:`Evict` → number of items removed.

A sample plan returns :class:`Layout`: where each gathered row belongs
(ordered selectors interleave shards).  It raises :class:`NothingToSample`
when no shard can supply a window; the executor turns that into the public
error with its own details.  A batch of a table whose items go a limited
number of times (``max_times_sampled``) that the items left cannot fill
raises :class:`ShortOfItems` before anything is taken: the executor gives its
admission back and waits for the next insert, as Reverb's sample waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ops import sequences
from . import two_level

if TYPE_CHECKING:
    from ..interrupts import HeldInterrupts

#: a plan: a generator that yields requests (Summaries, Candidates, Draw, Sequences, Take, NewEpoch, Evict),
#: is sent their answers, and returns its result
Plan = Generator[object, object, object]


class NothingToSample(Exception):
    """Internal: no shard has an item whose window fits (the executor raises the public error)."""


class ShortOfItems(Exception):
    """Internal: the items left may go fewer times than the batch has rows (``max_times_sampled``).

    Raised before anything is taken.  Rows repeated to fill the batch would
    hand an item out beyond its limit, so the sample waits for an insert
    instead (Reverb samples item by item and waits for the rest).

    Parameters
    ----------
    have : int
        Rows the items left could give.
    want : int
        Rows of the batch.
    """

    def __init__(self, have: int, want: int):
        super().__init__(f"{have} of {want} rows")
        self.have, self.want = int(have), int(want)


def short_not_empty(size: int, length: int, boundary: str) -> bool:
    """Whether a batch admitted with items, whose draw then found nothing to take, is short of items rather
    than facing the call's own :class:`~gear_flow.errors.EmptyTableError`.

    A delete, or another sample's expiry, can take every item between the admission and the draw: nothing
    was taken, and as a batch short of items it gives its admission back and waits for the next insert, as
    Reverb's sample waits.  That is so when nothing is stored now, or when every stored item holds the
    batch's windows (one step, or windows padded at the episode's ends: a ``size`` read after the draw
    counts items stored since).  Strict windows of several steps that no stored episode holds are the
    call's own error.  The one rule of every table's sample (local, a worker's one-call sample, and a
    distributed plan).

    Parameters
    ----------
    size : int
        Items stored, read at the draw or after it.
    length : int
        The batch's window length, in steps.
    boundary : str
        Its boundary mode.

    Returns
    -------
    bool
        True: the batch waits for an insert; False: the error is raised.

    Examples
    --------
    >>> short_not_empty(0, 4, "strict"), short_not_empty(9, 1, "strict"), short_not_empty(9, 4, "strict")
    (True, True, False)
    """
    return size == 0 or length == 1 or boundary != "strict"


@dataclass(frozen=True)
class Summaries:
    """Ask every shard for one number per kind; answered with ``{kind: {shard: float}}``.

    Attributes
    ----------
    kinds : tuple of str
        Each of ``sampler`` (mass of the items whose window fits),
        ``unseen`` (epoch items not yet handed out), ``remover`` (remover
        mass), ``size`` (items), ``valid`` (items whose window fits),
        ``goes`` (the times those may still go, ``max_times_sampled``).
    """

    kinds: tuple[str, ...]  # "sampler" | "unseen" | "remover" | "size" | "valid" | "goes"


@dataclass(frozen=True)
class Candidates:
    """Ask every shard for its best ``n`` items in a selector's order; answered with
    ``{shard: (slots, order_keys)}``, best first.

    Attributes
    ----------
    n : int
        Candidates per shard at most (the global best ``n`` are among them).
    role : {"sampler", "remover"}
        Whose order.
    """

    n: int
    role: str  # "sampler" | "remover"


@dataclass(frozen=True)
class Draw:
    """Draw ``counts[s]`` items from each shard ``s`` with its mass at the draw and gather them; answered with None.

    Rows go to the batch at :func:`offsets` ``(counts, base)``; the probability
    reported for item ``i`` of shard ``s`` is ``scale[s] * w_i / m'_s``.

    Attributes
    ----------
    counts : dict of int to int
        Items to draw per shard (shards with none are left out).
    scale : dict of int to float
        First-level probability of each shard (its share of the planned mass).
    base : int
        Batch row of this round's first item.
    by_count : bool
        The shards were weighed by valid count because no valid item had
        any weight (each draws uniformly); otherwise a weighted shard found
        without weight at the draw (its priorities zeroed since the plan)
        makes the executor retry.
    """

    counts: dict  # shard -> items to draw
    scale: dict  # shard -> first-level probability (planned mass share)
    base: int  # batch row of this round's first item
    by_count: bool = False  # planned by valid count (every weight 0): uniform draws


@dataclass(frozen=True)
class Sequences:
    """Each shard draws up to ``n`` items one after another, as Reverb samples a batch from it alone
    (an item that reaches ``max_times_sampled`` is out of the later draws), recording nothing; answered
    with ``{shard: (slots, probs, masses, seqs, slots0, probs0, counts0, seqs0)}``.

    ``probs[k]`` is draw ``k``'s probability within the shard, ``masses[k]``
    the shard's mass before draw ``k`` (``len(slots) + 1`` of them, the last
    after the last draw; 0 once every item is out) and ``seqs`` the drawn
    items' sequence numbers (a later :class:`Take` checks its slots still
    hold them).  The other four are the same of the uniform draws over the
    shard's items of weight 0 that follow once every item with weight is out
    (``counts0``: the items left), up to ``n`` draws in all.

    Attributes
    ----------
    n : int
        Draws per shard at most.
    by_count : bool
        No item whose window fits has weight anywhere (every priority 0):
        each shard draws only uniformly over them (Reverb).
    """

    n: int
    by_count: bool = False


@dataclass(frozen=True)
class Take:
    """Gather exactly these slots at the rows :func:`offsets` gives; answered with None.

    A slot removed since the candidates were listed makes the executor retry
    the whole plan.

    Attributes
    ----------
    slots : dict of int to numpy.ndarray
        int64 slots per shard, in the shard's order.
    probs : dict of int to numpy.ndarray, optional
        The probability to report for each slot (a sequential draw's); None:
        1 (an ordered selection).
    seqs : dict of int to numpy.ndarray, optional
        The sequence number each slot must still hold (a sequential draw's
        items; another item written there since makes the executor retry).
    """

    slots: dict  # shard -> slots, in the shard's order
    probs: dict | None = None  # shard -> probability reported per slot (None: 1)
    seqs: dict | None = None  # shard -> the seq each slot must still hold


@dataclass(frozen=True)
class NewEpoch:
    """Start a new epoch on every shard (WithoutReplacement ran out); answered with None."""


@dataclass(frozen=True)
class Evict:
    """Remove items by the remover; answered with the number removed.

    Exactly one field is set.

    Attributes
    ----------
    counts : dict of int to int or None
        Items each shard's remover picks (random removers).
    slots : dict of int to numpy.ndarray or None
        Exactly these slots per shard (ordered removers, after a global merge).
    """

    counts: dict | None = None  # shard -> items the remover picks
    slots: dict | None = None  # shard -> exactly these slots (ordered removers)


@dataclass(frozen=True)
class Layout:
    """Where gathered rows go (what a sample plan returns).

    Attributes
    ----------
    rows_at : numpy.ndarray or None
        int64 ``[B]``: ``rows_at[r]`` is the batch position of gathered row
        ``r`` (rows are gathered round by round, shards in ascending order);
        None: every row is already in place.
    """

    rows_at: np.ndarray | None = None


def offsets(part: dict, base: int = 0) -> dict:
    """Batch row of each shard's first item: shards in ascending order from ``base``.

    Parameters
    ----------
    part : dict
        shard → count, or shard → slots.
    base : int, default 0
        Batch row of the first shard's first item.

    Returns
    -------
    dict of int to int
        ``{shard: first row}`` for the shards with at least one item.

    Examples
    --------
    >>> offsets({2: 3, 0: 1, 1: 0}, base=4)
    {0: 4, 2: 5}
    """
    out, off = {}, base
    for s in sorted(part):
        v = part[s]
        n = int(v) if np.ndim(v) == 0 else len(v)
        if n:
            out[s] = off
            off += n
    return out


# -- sampling --------------------------------------------------------------------------------------------
def sample(selection: str, batch_size: int, rng: np.random.Generator) -> Plan:
    """Plan a batch of ``batch_size`` items.

    Weighted: shards by valid mass (by valid count when every priority is 0),
    counts ~ Multinomial, one :class:`Draw`.  Epoch: hypergeometric counts
    over unseen items, a :class:`NewEpoch` when they run out.  Ordered: the
    global best of every shard's :class:`Candidates`, one :class:`Take`.

    Sequential (a weighted sampler with ``max_times_sampled``, as Reverb samples
    a batch item by item): every shard's :class:`Sequences`, interleaved draw
    by draw by the shards' masses at that draw, one :class:`Take`.
    ``ordered_limited`` (an ordered sampler with ``max_times_sampled``): as
    ordered, each candidate listed as often as it may still go.
    ``epoch_limited`` (an epoch sampler with ``max_times_sampled``): as epoch,
    once the shards' ``goes`` summary says the items left can fill it.  All
    three raise :class:`ShortOfItems` when the items left cannot fill the
    batch.

    Parameters
    ----------
    selection : {"weighted", "epoch", "epoch_limited", "ordered", "ordered_limited", "sequential"}
        What the sampler needs (:attr:`TableConfig.plan`); anything else
        plans as ``weighted``.
    batch_size : int
        Items in the batch.
    rng : numpy.random.Generator
        Draws the per-shard counts.

    Yields
    ------
    Summaries, Candidates, Draw, Take or NewEpoch
        Requests, each sent its answer.

    Returns
    -------
    Layout
        Where the gathered rows go (the generator's return value).

    Raises
    ------
    NothingToSample
        No shard can supply a window.
    ShortOfItems
        ``sequential`` or ``ordered_limited``: the items left may go fewer
        times than ``batch_size``.
    """
    if selection in ("ordered", "ordered_limited"):
        return (yield from _ordered(batch_size, selection == "ordered_limited"))
    if selection in ("epoch", "epoch_limited"):
        return (yield from _epoch(batch_size, rng, selection == "epoch_limited"))
    if selection == "sequential":
        return (yield from _sequential(batch_size, rng))
    return (yield from _weighted(batch_size, rng))


def _sequential(B: int, rng):
    """Reverb's item-by-item batch over shards: draw ``j`` picks a shard by the masses left at that draw and
    takes that shard's next draw, reporting ``m_s / M * p`` (``w_i / M`` at draw ``j``).  A shard's own
    sequence is what it alone would give, so the interleave is the table's sequence.  Once no item with
    weight is left (every priority 0 from the start, or the items with weight out partway through the batch),
    the rest of the batch is drawn uniformly over the items left, those of weight 0, as Reverb's prioritized
    selector does (``1/n`` a draw).  When every item is out before ``B`` draws, nothing is taken
    (:class:`ShortOfItems`: the sample waits for inserts)."""
    masses = (yield Summaries(("sampler",)))["sampler"]
    by_count = not sum(masses.values()) > 0
    seqs = yield Sequences(B, by_count)
    rows = _Rows(B)
    rows.interleave({s: r[:4] for s, r in seqs.items()}, rng)
    if rows.got < B:  # every item with weight is out: the rest uniform over those without
        rows.interleave({s: r[4:] for s, r in seqs.items()}, rng)
    if rows.got == 0:
        raise NothingToSample
    if rows.got < B:
        raise ShortOfItems(rows.got, B)
    slots, probs, want, order = {}, {}, {}, []
    for s in np.unique(rows.shard).tolist():
        mine = np.flatnonzero(rows.shard == s)
        slots[s], probs[s], want[s] = rows.slot[mine], rows.prob[mine], rows.seq[mine]
        order.append(mine)
    yield Take(slots, probs, want)
    rows_at = np.concatenate(order)
    return Layout(None if np.array_equal(rows_at, np.arange(B)) else rows_at)


class _Rows:
    """The rows of a sequential batch as its interleaves pick them: each row's shard, slot, probability and
    item seq."""

    def __init__(self, B: int) -> None:
        self.shard, self.slot, self.seq = (np.empty(B, np.int64) for _ in range(3))
        self.prob = np.empty(B)
        self.got = 0

    def interleave(self, seqs: dict, rng: np.random.Generator) -> None:
        """The next rows from the shards' sequences (``{shard: (slots, probs, masses, seqs)}``), interleaved
        by the masses they have left, until the batch is full or every item is out."""
        shards = [s for s in sorted(seqs) if len(seqs[s][0])]
        if not shards:
            return
        n = len(self.shard) - self.got
        lengths = np.array([len(seqs[s][0]) for s in shards], dtype=np.int64)
        table = np.zeros((len(shards), int(lengths.max()) + 1))
        for i, s in enumerate(shards):
            table[i, : lengths[i] + 1] = np.asarray(seqs[s][2], dtype=np.float64)
        shard_of, draw_of, share = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n)
        k = sequences.interleave(table, lengths, rng.random(n), shard_of, draw_of, share)
        for i, s in enumerate(shards):
            mine = np.flatnonzero(shard_of[:k] == i)
            sl, q, _, sq = seqs[s]
            at, d = self.got + mine, draw_of[mine]
            self.shard[at] = s
            self.slot[at] = np.asarray(sl, dtype=np.int64)[d]
            self.prob[at] = share[mine] * np.asarray(q, dtype=np.float64)[d]
            self.seq[at] = np.asarray(sq, dtype=np.int64)[d]
        self.got += k


def _weighted(B: int, rng):
    """Shards by valid mass; when no valid item has weight anywhere (every priority 0), by the
    number of valid items, and each shard then draws uniformly (Reverb: uniform, ``1/n``)."""
    draw = weighted_draw((yield Summaries(("sampler",)))["sampler"], B, rng)
    if draw is None:
        draw = weighted_draw((yield Summaries(("valid",)))["valid"], B, rng, by_count=True)
    yield draw
    return Layout()


def weighted_draw(masses: dict, B: int, rng: np.random.Generator, by_count: bool = False) -> Draw | None:
    """The one request of a weighted plan: counts ~ Multinomial(B, masses), each shard's share of the mass.

    The rule of :func:`sample`'s ``weighted`` plan; an in-process table
    answers its summaries itself and calls this directly (the same draws of
    ``rng``, without the plan's round trips).

    Parameters
    ----------
    masses : dict of int to float
        Shard -> valid sampling mass (``by_count``: items whose window fits).
    B : int
        Items in the batch.
    rng : numpy.random.Generator
        Draws the counts (one shard: no draw).
    by_count : bool, default False
        ``masses`` are counts of valid items (no valid item has weight).

    Returns
    -------
    Draw or None
        None when no shard has mass (weigh them ``by_count`` then).

    Raises
    ------
    NothingToSample
        ``by_count`` and no shard has a valid item.
    """
    if len(masses) == 1:  # one shard: every row is its own (no generator draw, as multinomial_counts does)
        ((s, total),) = masses.items()
        total = float(total)
        if not total > 0:
            if by_count:
                raise NothingToSample
            return None
        return Draw({s: B}, {s: 1.0}, 0, by_count)
    shards = sorted(masses)
    m = np.array([masses[s] for s in shards], dtype=np.float64)
    total = m.sum()
    if not total > 0:
        if by_count:
            raise NothingToSample
        return None
    counts = two_level.multinomial_counts(m, B, rng)
    return Draw(
        {s: int(c) for s, c in zip(shards, counts) if c},
        {s: float(ms / total) for s, ms in zip(shards, m)},
        0,
        by_count,
    )


def _epoch(B: int, rng, limited: bool = False):
    """WithoutReplacement: a uniform subset of the global epoch; a new epoch on every shard when it runs out.
    ``limited`` (``max_times_sampled``): a batch more than the times the items left may still go (each epoch
    takes its items once, and the next the items still left) takes nothing (:class:`ShortOfItems`)."""
    if limited:
        goes = int(round(sum((yield Summaries(("goes",)))["goes"].values())))
        if goes == 0:
            raise NothingToSample
        if goes < B:
            raise ShortOfItems(goes, B)
    done, fresh = 0, False
    while done < B:
        unseen = (yield Summaries(("unseen",)))["unseen"]
        shards = sorted(unseen)
        u = np.array([int(round(unseen[s])) for s in shards], dtype=np.int64)
        left = int(u.sum())
        if left == 0:
            if fresh:
                raise NothingToSample
            yield NewEpoch()
            fresh = True
            continue
        fresh = False
        take = min(B - done, left)
        counts = two_level.epoch_counts(u, take, rng)
        yield Draw(
            {s: int(c) for s, c in zip(shards, counts) if c}, {s: float(us / left) for s, us in zip(shards, u)}, done
        )
        done += take
    return Layout()


def _ordered(B: int, limited: bool):
    """The global best ``B`` of every shard's candidates; ``limited``: each item listed as often as it may
    still go, so fewer than ``B`` in all is a batch the items left cannot fill (else the best repeat)."""
    cands = yield Candidates(B, "sampler")
    shards = sorted(cands)
    have = sum(len(cands[s][0]) for s in shards)
    if not have:
        raise NothingToSample
    if limited and have < B:
        raise ShortOfItems(have, B)
    chosen, where = two_level.merge_candidates_with_positions([cands[s] for s in shards], B)
    yield Take({s: sl for s, sl in zip(shards, chosen) if len(sl)})
    rows_at = np.concatenate([w for w in where if len(w)])
    return Layout(None if np.array_equal(rows_at, np.arange(B)) else rows_at)


def sources(rows_at: np.ndarray) -> np.ndarray:
    """Inverse of ``Layout.rows_at``: the gathered row that goes to each batch position.

    Parameters
    ----------
    rows_at : numpy.ndarray
        int64 ``[B]``, a permutation of ``0 .. B-1``.

    Returns
    -------
    numpy.ndarray
        int64 ``[B]``: ``src[rows_at[r]] == r``.
    """
    src = np.empty_like(rows_at)
    src[rows_at] = np.arange(len(rows_at))
    return src


# -- eviction ---------------------------------------------------------------------------------------------
def evict(excess: int, ordered: bool, rng: np.random.Generator) -> Plan:
    """Remove ``excess`` items as the remover says, round after round until done.

    Ordered removers: the global best victims (a merge of every shard's).
    Weighted removers: counts ~ Multinomial(remover masses), clipped to sizes,
    drawn again for the shortfall; when no remover weight is left anywhere
    (every priority 0) by size, i.e. uniformly.  Stops early only when the
    table is empty or a round removes nothing (concurrent removals did it).

    Parameters
    ----------
    excess : int
        Items to remove.
    ordered : bool
        Whether the remover is deterministic (Fifo, Lifo, heaps).
    rng : numpy.random.Generator
        Draws the per-shard counts of a random remover.

    Yields
    ------
    Candidates, Summaries or Evict
        Requests, each sent its answer.

    Returns
    -------
    int
        Items removed (the generator's return value).
    """
    removed = 0
    while removed < excess:
        need = excess - removed
        if ordered:
            cands = yield Candidates(need, "remover")
            shards = sorted(cands)
            if not any(len(cands[s][0]) for s in shards):
                break
            chosen = two_level.merge_candidates([cands[s] for s in shards], need)
            k = yield Evict(slots={s: np.unique(sl) for s, sl in zip(shards, chosen) if len(sl)})
        else:
            summ = yield Summaries(("size", "remover"))
            shards = sorted(summ["size"])
            sizes = np.array([summ["size"][s] for s in shards], dtype=np.int64)
            if not sizes.sum():
                break
            masses = np.array([summ["remover"][s] for s in shards], dtype=np.float64)
            weights = masses if masses.sum() > 0 else sizes.astype(np.float64)
            counts = np.minimum(two_level.multinomial_counts(weights, need, rng), sizes)
            k = yield Evict(counts={s: int(c) for s, c in zip(shards, counts) if c})
        if not k:
            break
        removed += int(k)
    return removed


# -- drivers ------------------------------------------------------------------------------------------------
def run(
    plan: Plan,
    answer: Callable[[object], object],
    hand_over: Callable[[Plan, object, BaseException], bool] | None = None,
    interrupts: HeldInterrupts | None = None,
) -> object:
    """Drive ``plan`` with a synchronous ``answer(request)``.

    Also drives any generator written the same way (the distributed
    table's sample steps): an error of ``answer`` is thrown into the
    generator at its request, so the generator says what it means (a plan
    of this module lets it propagate).

    Parameters
    ----------
    plan : Plan
        A plan from :func:`sample` or :func:`evict`.
    answer : callable
        ``answer(request)`` returns the request's answer (an executor such
        as :class:`~gear_flow.table.executor.InProcess`); its exceptions
        are thrown into ``plan``.
    hand_over : callable, optional
        ``hand_over(plan, request, error)``, asked first when ``answer``
        raises: True when it has taken ``plan``, left waiting for
        ``request``'s answer, to finish elsewhere (:func:`resumed`); the
        error is then raised here, not thrown in (a distributed insert
        interrupted in a step it cannot take back).
    interrupts : HeldInterrupts, optional
        The call's interrupts (:mod:`gear_flow.interrupts`): held while
        this function's code and ``plan``'s run, let in while ``answer``
        runs (which delivers one held meanwhile where it can act on it).

    Returns
    -------
    object
        The plan's result (:class:`Layout`, or the count removed).
    """
    got, error = None, None
    while True:
        try:
            req = plan.send(got) if error is None else plan.throw(error)
        except StopIteration as stop:
            return stop.value
        try:
            got, error = (answer(req) if interrupts is None else interrupts.let_in(answer, req)), None
        except BaseException as e:  # noqa: BLE001 - thrown into the plan, which raises it on or handles it
            if hand_over is not None and hand_over(plan, req, e):
                raise
            got, error = None, e


def resumed(plan: Plan, req: object) -> Plan:
    """``plan``, left waiting for ``req``'s answer (:func:`run`'s ``hand_over``), as a plan of its own that
    asks ``req`` again first and then goes on as ``plan``.

    Parameters
    ----------
    plan : Plan
        A plan suspended at ``req``.
    req : object
        The request it waits on.

    Returns
    -------
    Plan
        Yields ``req``, then ``plan``'s requests; returns ``plan``'s result.
    """
    while True:
        try:
            got, error = (yield req), None
        except BaseException as e:  # noqa: BLE001 - thrown into the plan, as run does
            got, error = None, e
        try:
            req = plan.send(got) if error is None else plan.throw(error)
        except StopIteration as stop:
            return stop.value


async def run_async(plan: Plan, answer: Callable[[object], Awaitable[object]]) -> object:
    """Drive ``plan`` with an ``async answer(request)`` (errors thrown in, as :func:`run` does).

    Parameters
    ----------
    plan : Plan
        A plan from :func:`sample` or :func:`evict`.
    answer : callable
        ``await answer(request)`` gives the request's answer (the
        distributed sampler); its exceptions are thrown into ``plan``.

    Returns
    -------
    object
        The plan's result (:class:`Layout`, or the count removed).
    """
    got, error = None, None
    while True:
        try:
            req = plan.send(got) if error is None else plan.throw(error)
        except StopIteration as stop:
            return stop.value
        try:
            got, error = await answer(req), None
        except BaseException as e:  # noqa: BLE001 - thrown into the plan, which raises it on or handles it
            got, error = None, e
