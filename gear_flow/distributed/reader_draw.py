"""Draws a reader makes itself from the selection state its host's shard owners publish: no owner request per batch.

A shard on this host whose state is published
(:mod:`~gear_flow.storage.shared_selection`: ``Uniform`` or ``Prioritized``
samplers, no ``max_times_sampled``) is drawn from here: the plan's masses are
read from the shards' trees, each shard's count is drawn from its tree by the
owner's rule, the windows are gathered from its rings, and the state's
version is read again.  A version that moved means the owner wrote during the
draw: the shard is drawn again (up to :data:`ATTEMPTS` times), and after that,
or whenever the state cannot be drawn from here (the owner is writing, no
weight is left, the tail mass of a new window length is not published yet, the
episode index grew into new segments), the owner of that shard draws its
worker's whole part, with the seed it would have drawn it with: a seed gives
the same batch whoever draws it (``reader_fallbacks`` in the handle's stats
counts the shards left to their owners, ``reader_redraws`` the draws made
again).

The probability reported is the draw's own: the plan's first level
``m_s / M`` (the masses read here, or the owner's last) times ``w_i / m'_s``
over the valid mass read at the draw, as an owner's draw reports it.

What the owners learn afterwards, in the background and batched: the
priority updates stored by ``update_priorities(wait=False)``
(:mod:`~gear_flow.distributed.pending`, in order, one request per owner
every ``distributed.reader-flush`` seconds at most, sooner once many are
stored) and the samples drawn (:class:`DrawnCounts`, their ``sampled``
counters).  So an update shows in this reader's draws, and a sample in the
owners' ``info()``, within that delay; ``flush()`` sends both at once.  The
coordinator's limiter counts every sample at admission, as any other.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from .. import config
from ..ops.gather import gather_columns
from ..ops.seeds import generator
from ..sample import NO_COUNTS
from ..storage import windows
from ..storage.base import HostTier
from .pending import send_pending
from .transport import Retry

if TYPE_CHECKING:
    from ..storage.shared import Attached
    from ..storage.shared_selection import Draw, Drawn
    from .api import DistributedTable
    from .sampling import RemoteSample

#: draws of one shard's part made again after the owner wrote during them, before its owner draws it
ATTEMPTS = 4
logger = logging.getLogger(__name__)


class DrawnCounts:
    """Samples a handle drew itself, per shard, not yet counted by their owners; and whether a flush to the
    owners is scheduled.  Thread-safe: a caller's thread adds, the event loop takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n: dict[int, int] = defaultdict(int)
        self.scheduled = False
        #: one flush at a time (on the event loop): a flush returns only once what an earlier one took has
        #: reached the owners, so that ``flush()`` and ``info()`` see every draw counted
        self.flushing = asyncio.Lock()  # bound to the loop that first waits on it

    def add(self, counts: dict[int, int]) -> None:
        """Count samples drawn, per shard: a sample's once it stands, or those whose report failed (kept for the
        next one).

        Parameters
        ----------
        counts : dict of int to int
            ``{shard: samples}``.
        """
        with self._lock:
            for s, n in counts.items():
                self._n[s] += int(n)

    def take(self) -> dict[int, int]:
        """Everything counted so far, forgotten here.

        Returns
        -------
        dict of int to int
            ``{shard: samples}``.
        """
        with self._lock:
            got, self._n = dict(self._n), defaultdict(int)
            return got

    def __len__(self) -> int:
        return len(self._n)

    def total(self) -> int:
        """Samples counted and not yet reported.

        Returns
        -------
        int
            Their sum over the shards.
        """
        with self._lock:
            return int(sum(self._n.values()))


def state(table: DistributedTable) -> dict:
    """What this handle draws itself and what its owners have not learnt yet (``info()["reader"]``).

    Parameters
    ----------
    table : DistributedTable
        The handle.

    Returns
    -------
    dict
        ``enabled`` (:func:`enabled`), ``draws``, ``redraws`` and
        ``fallbacks`` (the handle's stats of those names), ``flush_s`` (the
        longest the owners wait for this handle's stored updates and counts:
        ``distributed.reader-flush``), ``updates_waiting`` (items of stored
        priority updates not yet sent) and ``draws_uncounted`` (samples drawn
        here not yet counted by their owners).
    """
    st = table.stats
    return {
        "enabled": enabled(table),
        "draws": st["reader_draws"],
        "redraws": st["reader_redraws"],
        "fallbacks": st["reader_fallbacks"],
        "flush_s": float(config.get("distributed.reader-flush") or 0.0),
        "updates_waiting": len(table._pending),
        "draws_uncounted": table._drawn.total(),
    }


async def report(table: DistributedTable) -> None:
    """Tell the owners the samples this handle drew from their shards (``count_drawn``, one request each).

    A shard lost or moved meanwhile keeps its count back once (the worker
    it moved to counts it next time); a lost one's count leaves with it.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    """
    counts = table._drawn.take()
    by = defaultdict(dict)
    for s, n in counts.items():
        if s in table.placement and s not in table.lost and n:
            by[table.placement[s]][s] = n
    if not by:
        return
    res, errors = await table._link.on_workers(
        {a: ("count_drawn", dict(name=table.name, counts=c)) for a, c in by.items()}, partial=True
    )
    for a, c in by.items():
        if a not in res:
            table._drawn.add(c)
    errors = [e for e in errors if not isinstance(e, Retry)]
    if errors:
        raise errors[0]


async def flush(table: DistributedTable) -> None:
    """Send the stored priority updates and the samples drawn here to their owners now.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    """
    table._drawn.scheduled = False
    async with table._drawn.flushing:
        await send_pending(table)
        await report(table)


def flush_soon(table: DistributedTable) -> None:
    """Schedule :func:`flush` on the event loop within ``distributed.reader-flush`` seconds (at once when
    many updates are stored), unless one is scheduled already.  Callable from any thread.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    """
    if table._drawn.scheduled or not (len(table._pending) or len(table._drawn)):
        return
    table._drawn.scheduled = True
    delay = float(config.get("distributed.reader-flush") or 0.0)
    loop = table._ctx.loop

    async def go() -> None:
        try:
            await flush(table)
        except Exception as e:  # noqa: BLE001 - kept (updates stored again, counts put back): the next flush sends
            logger.info("table %r: updates or counts not sent to the owners yet (%s)", table.name, e)

    loop.add_callback(lambda: loop.call_later(delay, lambda: loop.add_callback(go)))


def enabled(table: DistributedTable) -> bool:
    """Whether ``table``'s handle draws itself where it can (config ``distributed.reader-draw`` when the
    handle was made: :attr:`~gear_flow.distributed.DistributedTable.reader_draw`).

    Parameters
    ----------
    table : DistributedTable
        The handle.

    Returns
    -------
    bool
        Reader draws are on, and the sample changes nothing on the table
        (not an exclusive one).
    """
    return table.reader_draw and not table._cfg.exclusive


def published(table: DistributedTable) -> dict[int, Attached]:
    """The live shards whose selection state this process maps, with their mappings.

    Parameters
    ----------
    table : DistributedTable
        The handle.

    Returns
    -------
    dict of int to Attached
        ``{shard: mapping}``.  The shards of an owner that no longer runs
        are left out (its request finds them lost), and so is a mapping
        whose owner's index has grown since (its worker's route is
        forgotten, so that it is mapped again on its next use).
    """
    out = {}
    for a, shards in table._routes.every_mapped().items():
        alive = None
        for s, sh in shards.items():
            sel = sh.selection
            if sel is None or s in table.lost or table.placement.get(s) != a:
                continue
            if alive is None:
                alive = sh.owner_alive()  # a killed owner's state is still mapped: its request finds it lost
            if not alive:
                break
            if sel.regrown():
                table._routes.forget(a)
                break
            out[s] = sh
    return out


def masses(table: DistributedTable, L: int, boundary: str, here: dict | None = None) -> dict[int, float] | None:
    """Every live shard's valid mass, read from its published state.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    L : int
        Window length.
    boundary : str
        Boundary mode.
    here : dict, optional
        :func:`published`, if the caller has it already.

    Returns
    -------
    dict of int to float or None
        ``{shard: mass}``; None unless every live shard's state is mapped
        and readable now with mass somewhere (the planner asks the owners
        then).
    """
    if not enabled(table):
        return None
    here = published(table) if here is None else here
    live = table._view.live_shards()
    if not live or any(s not in here for s in live):
        return None
    got = {}
    for s in live:
        m = here[s].selection.mass(L, boundary)
        if m is None:
            return None
        got[s] = m
    return got if any(m > 0 for m in got.values()) else None


def plan(ex: RemoteSample, offs: dict, counts: dict) -> tuple[list, dict]:
    """Which workers' parts of a plan's draw this process draws itself, each with the seed its owner would
    have drawn with (taken from the sample's generator in the order :meth:`RemoteSample.part_calls` takes
    them, so that a batch is the same whichever path draws it); call on the sample's own thread.

    Parameters
    ----------
    ex : RemoteSample
        The sample's executor.
    offs : dict of int to int
        First row of each shard's part.
    counts : dict of int to int
        Items to draw per shard.

    Returns
    -------
    here : list
        ``[(worker, [shard, ...] sorted, seed), ...]``: every shard of these workers is published here.
    left : dict of int to int
        The shards left to their owners, with their first rows (their workers' seeds in ``ex.seeds``).
    """
    t = ex.t
    if not enabled(t):
        return [], offs
    published_here = ex.published_here()
    by: dict[str, list[int]] = defaultdict(list)
    for s in offs:
        by[t.placement[s]].append(s)
    here, left = [], {}
    for a, shards in by.items():  # (a seed given already: a part its host's worker left to its owner)
        seed = ex.seeds.pop(a) if a in ex.seeds else int(ex.rng.integers(2**63))
        drawn = [s for s in shards if int(counts.get(s, 0)) > 0]
        if drawn and all(s in published_here for s in drawn):
            here.append((a, sorted(drawn), seed))
        else:
            ex.seeds[a] = seed  # its owner draws with it
            left.update((s, offs[s]) for s in shards)
    return here, left


def draw_parts(ex: RemoteSample, here: list, offs: dict, counts: dict, scale: dict) -> dict:
    """Draw the parts :func:`plan` chose into ``ex``'s batch, each worker's shards in its owner's order with
    its owner's seed (as :meth:`~gear_flow.distributed.host_sampling.HostSampler.sample_part` draws them).

    A worker's part is drawn here whole or not at all: when one of its shards cannot be drawn here, its owner
    draws the whole part with the seed (the rows written here are overwritten), as it would have drawn it, so
    that a seed gives the same batch whoever draws it.

    Parameters
    ----------
    ex : RemoteSample
        The sample's executor (its batch, window and handle).
    here : list
        :func:`plan`'s ``here``.
    offs : dict of int to int
        First row of each shard's part.
    counts : dict of int to int
        Items to draw per shard.
    scale : dict of int to float
        Each shard's first-level probability.

    Returns
    -------
    dict of int to int
        The shards that could not be drawn here (their owners draw them), with their first rows.
    """
    t = ex.t
    mapped = ex.published_here()
    left = {}
    for a, shards, seed in here:
        rng = generator(seed)
        drawn = []
        for s in shards:
            sh = mapped.get(s)
            d = None if sh is None else draw_one(ex, sh, s, offs[s], int(counts[s]), float(scale[s]), rng)
            if d is None:
                break
            drawn.append((s, d))
        else:
            for s, d in drawn:
                book(ex, s, int(counts[s]), d.mass)
            continue
        t.stats["reader_fallbacks"] += len(shards)
        ex.seeds[a] = seed  # its owner draws the worker's part with it, from the start
        left.update((s, offs[s]) for s in shards)
    if here:  # what this batch drew here, and the updates it carried to no owner: soon
        flush_soon(t)
    return left


def host_groups(ex: RemoteSample, by: dict, mapped: dict) -> dict[str, str]:
    """Which workers of a draw one worker of their host draws for (:mod:`~gear_flow.distributed.host_reader`).

    Parameters
    ----------
    ex : RemoteSample
        The sample's executor.
    by : dict of str to list
        The draw's shards per worker.
    mapped : dict
        The workers whose rings this process maps.

    Returns
    -------
    dict of str to str
        ``{worker: the worker that draws its part}``, for the workers on another host whose shards
        publish their state, when at least two of that host's are in the draw (one request instead of
        several); empty when reader draws are off.
    """
    t = ex.t
    if not enabled(t):
        return {}
    local = t._ctx.local_addr if t._ctx.local_plugin is not None else None
    by_host: dict[str, list[str]] = defaultdict(list)
    for a in by:
        lay = t._routes.far(a)
        if lay is not None and a not in mapped and a != local:
            by_host[lay["machine"]].append(a)
    out = {}
    for addrs in by_host.values():
        if len(addrs) >= 2:
            server = min(addrs)
            out.update((a, server) for a in addrs)
    return out


def draw_one(
    ex: RemoteSample, sh: Attached, s: int, o: int, n: int, scale: float, rng: np.random.Generator
) -> Drawn | Draw | None:
    """Draw shard ``s``'s ``n`` rows at row ``o`` of the batch from its published state.

    Parameters
    ----------
    ex : RemoteSample
        The sample's executor.
    sh : Attached
        The shard's mapping.
    s : int
        The shard.
    o : int
        Its part's first row.
    n : int
        Its rows.
    scale : float
        Its first-level probability.
    rng : numpy.random.Generator
        The draw's source.

    Returns
    -------
    Drawn or Draw or None
        The draw whose rows are filled (not booked yet: :func:`book`); None: its owner draws them.
    """
    t, sel = ex.t, sh.selection
    if t.spec.item_unit == "step" and not ex.out.on_device:
        take = _take_steps
    else:
        find = None
        if ex.out.on_device:  # a pinned table: this process's GPU descends the page-locked tree, as it gathers
            from ..gpu.shared import state_find

            find = state_find(sel)
        take = partial(_take_placed, find=find)
    for _ in range(ATTEMPTS):
        d = take(ex, sh, s, o, n, scale, rng)
        if d is None:
            return None
        if sel.unchanged(d.version):  # nothing read changed meanwhile, rings included
            return d
        t.stats["reader_redraws"] += 1
    return None


def book(ex: RemoteSample, s: int, n: int, mass: float) -> None:
    """Book ``n`` rows drawn here from shard ``s`` at its valid ``mass``: the mass kept for the next plan, the
    samples for its owner's count once the sample stands (:meth:`RemoteSample.stands`), the handle's stats.

    Parameters
    ----------
    ex : RemoteSample
        The sample's executor.
    s : int
        The shard.
    n : int
        Its rows.
    mass : float
        Its valid mass read at the draw.
    """
    t = ex.t
    t._masses.update(ex.L, ex.boundary, s, mass)
    ex.drawn_by_readers[s] = ex.drawn_by_readers.get(s, 0) + n  # (its owner's count once the sample stands)
    t.stats["reader_draws"] += n
    t.stats["shared_bytes"] += n * ex.L * ex.row_bytes


def _take_steps(
    ex: RemoteSample, sh: Attached, s: int, o: int, n: int, scale: float, rng: np.random.Generator
) -> Drawn | None:
    """One attempt of :func:`draw_one` for step items into host buffers: the items drawn from the published
    state (:meth:`~gear_flow.storage.shared_selection.MappedState.draw_slots`), then placed, their rows written
    and their windows gathered from the mapped rings as the owner's take does
    (:func:`~gear_flow.storage.windows.take_step_rows`: one compiled call for a small batch); None when
    the state cannot be drawn from here or a window is torn (the owner draws)."""
    sel, out, L = sh.selection, ex.out, ex.L
    d = sel.draw_slots(n, L, ex.boundary, rng, sh.capacity, True)
    if d is None:
        return None
    idx = sel.index
    args = (
        d.slots, d.hi, sh.capacity, sel.step_episode, idx["start"], idx["length"], idx["episode_id"],
        sel.index_size, L, ex.boundary == "pad_head", sel.priority, out.rows(), o, s, d.probs, scale, NO_COUNTS,
    )  # fmt: skip

    def gather(src, dst, nv):
        cols = ex.columns
        gather_columns([sh.bytes[c] for c in cols], src, dst, nv, [out.bytes[c][o : o + n] for c in cols], True)

    return (
        d if windows.take_step_rows(args, _HOST.fused_pairs(sh.bytes, out.bytes, ex.columns, n), gather) == -1 else None
    )


def _take_placed(
    ex: RemoteSample, sh: Attached, s: int, o: int, n: int, scale: float, rng: np.random.Generator, find=None
) -> Draw | None:
    """One attempt of :func:`draw_one` for episode items, or into a pinned table's device buffers: drawn and
    placed (:meth:`~gear_flow.storage.shared_selection.MappedState.draw`, ``find`` the GPU's descent for a
    pinned table), gathered from the mapped rings and the rows written; None when the state cannot be drawn
    from here (the owner draws)."""
    d = sh.selection.draw(n, ex.L, ex.boundary, rng, sh.capacity, ex.t.spec.item_unit == "step", find)
    if d is None:
        return None
    w = d.windows
    ex._copy_shared(sh, {"seqs": w.seqs, "src_abs": w.src_abs, "dst_offset": w.dst_offset, "n_valid": w.n_valid}, o)
    ex.out.fill_rows(o, s, w.seqs, d.probs * scale, w.episode_ids, w.timesteps, w.dst_offset, w.n_valid,
                     d.priorities, None)  # fmt: skip
    return d


#: the rule a reader's take of mapped shared rings follows: they are host memory, gathered as the host tier's
_HOST = HostTier()


def fresh_masses(ex: RemoteSample, kinds: tuple) -> dict | None:
    """A plan's ``Summaries`` answered from the published states (only the sampler's masses are).

    Parameters
    ----------
    ex : RemoteSample
        The sample's executor (its handle, window and boundary).
    kinds : tuple of str
        What the plan asks for.

    Returns
    -------
    dict or None
        ``{"sampler": {shard: mass}}``, or None (ask the cache or the owners).
    """
    if tuple(kinds) != ("sampler",) or not enabled(ex.t):
        return None
    table, L, boundary = ex.t, ex.L, ex.boundary
    got = masses(table, L, boundary, ex.published_here())
    if got is None:
        return None
    table._masses.store(("sampler",), L, boundary, {"sampler": got})
    return {"sampler": got}
