"""Inserts in the caller's thread: no event loop between a writer and the shards it writes.

Two kinds of insert need no event loop (each hop into it and back costs tens
of microseconds on a 2-core host, and the loop writes a large request a
chunk at a time, yielding between chunks):

* an actor's: a task on a worker whose episodes all go to that worker's own
  shards writes them itself (:func:`_insert_here`);
* a writer's whose episodes go to workers it reaches by their lanes and does
  not map (another host, or shared memory off: their TCP lanes): the
  episodes go out on blocking sockets straight from the caller's arrays, and
  the workers read them straight into reused buffers
  (:func:`_insert_over_lanes`).  Measured on the 2-core
  host (``pipelines/bench_distributed.py``, 10 episodes of 1.04 MB a call):
  through the event loop 0.75x (2 workers) and 0.91x (1 worker) the speed of
  Dask's own scatter of the same bytes; this way 0.91-1.04x and 1.22-1.32x.

Both are admitted and committed over the coordinator's lane.  Their steps are
the transaction's (:mod:`~gear_flow.distributed.transactions`): one worker
``write``; several ``stage`` everywhere (all sent, then the replies read: the
workers receive in parallel), ``apply`` everywhere, commit.  What this path
cannot finish itself goes to the event loop's path: a placement that changed
since the admission (the whole insert), a worker refusing its part (the
insert aborted everywhere, as there), a lane that breaks (the transaction
handed to :func:`~.transactions.run_insert` or :func:`~.transactions.apply_staged`, which send its steps
again: a stage, write or apply sent twice is applied once,
:data:`~gear_flow.distributed.lane.RESENDABLE_OPS`), an eviction to
``max_size``.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from numpy.typing import ArrayLike

from ..errors import ShardLostError, ShardMovedError
from ..table.results import InsertResult
from ..table.validate import check_batch, to_host
from .coordinator import admission_wait
from .edits import evict_excess
from .protocol import VERSION
from .transactions import abort_insert, admission_args, apply_staged, commit_counts, insert_error, run_insert
from .transport import reply_timeout
from .wire import array_bytes
from .writes import (
    Insert,
    Priorities,
    insert_admitted,
    insert_parts,
    insert_prepared,
    insert_result,
    moved_insert,
    prepare,
    rerouted,
)

if TYPE_CHECKING:
    from .api import DistributedTable

logger = logging.getLogger(__name__)


def _inserts_here(table: DistributedTable, ins: Insert) -> bool:
    """Can ``ins`` be inserted in the caller's thread: from a task on a worker, every episode for its
    own shards, the coordinator's lane found?"""
    ctx = table._ctx
    if ctx.local_plugin is None or ctx.in_loop() or ctx.found_coord_lane() is None:
        return False
    placement = table.placement
    return all(placement.get(int(s)) == ctx.local_addr for s in ins.per_shard)


def _insert_here(table: DistributedTable, ins: Insert, timeout: float | None) -> InsertResult:
    """An insert into this worker's own shards, in the caller's thread: admitted and committed over the
    coordinator's lane, written by this thread (no hop into the event loop, none into the plugin's
    threads).  What needs the event loop (a placement that changed, an abort, an eviction) goes there."""
    ctx = table._ctx
    here = ctx.local_addr
    adm, parts, sel_of, ids = _admitted_here(table, ins, timeout)
    if parts is None or list(parts) != [here]:  # the placement changed since: the event loop's path
        return ctx.sync(insert_admitted, table, ins, adm, timeout)
    table.stats["insert_local_bytes"] += array_bytes([p["chunks"] for p in parts[here]])
    try:
        res = ctx.local_plugin.host.call("write", ctx.stamped(dict(name=table.name, txn=adm["txn"], parts=parts[here])))
    except BaseException as e:
        ctx.sync(abort_insert, table, adm["txn"], [here], e)
        raise insert_error(table, e, [here]) from None
    return _committed_here(table, ins, adm, sel_of, ids, {here: res})


def _insert_lanes(table: DistributedTable, ins: Insert) -> dict[str, tuple[str, int]] | None:
    """``{worker: (lane, bytes of its episodes)}`` when ``ins`` can go over its workers' lanes from the caller's thread: every
    worker it goes to is another process this handle reaches by a lane without mapping its rings (a
    mapped one takes the episodes through a staging segment), the request fits the lane, and the
    coordinator's lane is found; else None."""
    ctx = table._ctx
    if ctx.in_loop() or ctx.found_coord_lane() is None:
        return None
    nbytes: dict[str, int] = defaultdict(int)
    placement = table.placement  # one reading: the event loop replaces it whole, never edits it
    try:
        for i, s in enumerate(ins.dest):
            nbytes[placement[int(s)]] += array_bytes(ins.chunks[i])
    except KeyError:  # a shard placed nowhere
        return None
    op = "write" if len(nbytes) == 1 else "stage"
    paths = {}
    for a, n in nbytes.items():
        local = a == ctx.local_addr and ctx.local_plugin is not None
        path = ctx.lanes.route(a, op, n)
        if local or path is None or not table._routes.probed(a) or table._routes.mapped(a) is not None:
            return None
        paths[a] = (path, n)
    return paths


def _insert_over_lanes(
    table: DistributedTable, ins: Insert, timeout: float | None, paths: dict[str, tuple[str, int]]
) -> InsertResult:
    """An insert sent over its workers' lanes from the caller's thread (see the module docstring)."""
    ctx = table._ctx
    adm, parts, sel_of, ids = _admitted_here(table, ins, timeout)
    if parts is None or set(parts) != set(paths):  # the placement changed since: the event loop's path
        return ctx.sync(insert_admitted, table, ins, adm, timeout)
    txn, addrs = adm["txn"], sorted(parts)
    op = "write" if len(addrs) == 1 else "stage"
    try:
        table.stats["insert_remote_bytes"] += sum(n for _, n in paths.values())  # as routed: the same episodes
        got = _over_lanes(table, [(paths[a][0], op, dict(name=table.name, txn=txn, parts=parts[a])) for a in addrs])
    except BaseException as e:  # interrupted before every part was taken: nothing is applied anywhere
        ctx.sync(abort_insert, table, txn, addrs, e)
        raise
    refused = [r[1] for r in got if not isinstance(r, BaseException) and not r[0]]
    if refused:  # a worker refused its part: aborted everywhere, as the event loop's path does
        ctx.sync(abort_insert, table, txn, addrs, refused[0])
        raise insert_error(table, refused[0], addrs) from None
    broken = [a for a, r in zip(addrs, got) if isinstance(r, BaseException)]
    if broken:  # the event loop's path sends their parts again (over the comm), the others' are staged
        ok = [a for a in addrs if a not in broken]
        applied, size = ctx.sync(table._link.again, broken, run_insert, table, txn, parts, ok)
        return _finished_here(table, ins, sel_of, ids, applied, size)
    if op == "stage":
        got = _over_lanes(table, [(paths[a][0], "apply", dict(name=table.name, txn=txn)) for a in addrs])
        broken = [a for a, r in zip(addrs, got) if isinstance(r, BaseException)]
        if broken or not all(r[0] for r in got):  # the event loop's path applies (again) and reports
            applied, size = ctx.sync(table._link.again, broken, apply_staged, table, txn, addrs)
            return _finished_here(table, ins, sel_of, ids, applied, size)
    return _committed_here(table, ins, adm, sel_of, ids, {a: r[1] for a, r in zip(addrs, got)})


def _over_lanes(table: DistributedTable, requests: list[tuple[str, str, dict]]) -> list:
    """Send ``(lane, op, args)`` requests from this thread, all before reading a reply; each reply as
    ``(ok, value)`` or the error that kept it from being sent or broke its connection."""
    lanes = table._ctx.lanes
    for _, op, _ in requests:
        table.requests[op] += 1
    requests = [(lane, op, table._ctx.stamped(args)) for lane, op, args in requests]
    return list(lanes.read_all(lanes.send_all(requests, VERSION, reply_timeout())))


def _admitted_here(table: DistributedTable, ins: Insert, timeout: float | None) -> tuple:
    """The coordinator's admission of ``ins`` from the caller's thread (over its lane when found):
    ``(admission, parts, sel_of, ids)`` as :func:`~.writes.insert_parts` gives them, the last three None when the
    placement changed since this handle learnt it."""
    wait = admission_wait(timeout)  # sent as the request's own: both ends give up at the same time
    adm = table._link.coordinator_here.admit_insert(
        **admission_args(table, ins.n_items, len(ins.lengths), ins.per_shard, wait)
    )
    if adm["version"] != table._view.version:
        return adm, None, None, None
    return (adm, *insert_parts(table, ins, adm))


def _committed_here(table: DistributedTable, ins: Insert, adm: dict, sel_of: dict, ids, applied: dict) -> InsertResult:
    """Commit an insert applied on every worker from the caller's thread, then what follows it."""
    size = table._link.coordinator_here.commit_insert(adm["txn"], **commit_counts(applied))
    table.stats["insert_in_thread"] += 1
    return _finished_here(table, ins, sel_of, ids, applied, size)


def _finished_here(table: DistributedTable, ins: Insert, sel_of: dict, ids, applied: dict, size: int) -> InsertResult:
    """The result of an insert committed with the table at ``size`` items, evicted to ``max_size``."""
    if table._cfg.evicts_to_max_size(size):
        table._ctx.sync(evict_excess, table, size)
    return insert_result(ins, ids, sel_of, applied)


def insert(
    table: DistributedTable,
    episodes: Mapping | Sequence[Mapping],
    priorities: Priorities = None,
    *,
    timeout: float | None = None,
    shard: int | None = None,
) -> InsertResult:
    """Insert whole episodes, all or nothing across workers.

    Input is validated before anything is sent.  Episodes are routed to
    shards (never split), preferring the calling worker's own shards when
    called from a task on a worker (writer affinity), and travel as raw
    frames straight to the shard workers.  Blocks until the rate limiter
    admits every item.  When the table then exceeds ``max_size``, the
    remover evicts the excess (not a queue's or stack's: its items over
    ``max_size`` are those of a sample that gave its admission back, still
    waiting); an eviction that fails for another reason
    than a lost worker (one that does not answer in time) is logged and
    the insert returns, stored, the table over ``max_size`` until the next
    insert's eviction.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    episodes : mapping or sequence of mappings
        Each maps every column to an array ``[T, *shape]`` (T >= 1).
    priorities : None, float, array or list of arrays
        Per item: None (the shard's running max priority, as in PER), one
        value for all, a flat array over all items of all episodes, or one
        array per episode.
    timeout : float, optional
        Seconds to wait for the rate limiter; default the handle's.
    shard : int, optional
        Put every episode on this shard.

    Returns
    -------
    InsertResult
        Episode ids, the key of each episode's first item, each episode's
        shard and the number of items created.

    Raises
    ------
    InvalidDataError
        Episodes that do not match the spec, or not one priority per
        item.
    InvalidPriorityError
        A priority that is NaN, infinite or negative, or one the sampler
        or remover cannot represent.
    CapacityError
        An episode longer than a shard's capacity.
    SpecError
        ``shard`` out of range, or more items than the limiter admits at once.
    RateLimitTimeout
        Not admitted within ``timeout``.
    ShardLostError
        A shard's worker is lost (not ``degraded``), or a worker was lost
        while the insert was applied (its episodes there are gone), or
        (not ``degraded``) while it evicted to ``max_size`` after its
        commit: the insert is stored, the message says so and
        ``.stored`` is True.  A worker lost before anything was applied
        leaves nothing stored (``.stored`` False); a degraded table then
        routes the insert again over the shards left, and one whose
        eviction loses a worker marks the shard lost and returns.
    GearFlowError
        Staging failed on a worker; nothing of the insert was stored.
    """
    ins = prepare(table, episodes, priorities, shard)
    timeout = table.timeout if timeout is None else timeout
    for attempt in itertools.count():  # rerouted and moved_insert bound it
        try:
            return _insert_once(table, ins, timeout)
        except ShardLostError as e:
            ins = rerouted(table, ins, e, attempt)
        except ShardMovedError as e:
            table._ctx.sync(table._link.moved, e.epoch)
            ins = moved_insert(table, ins, e, attempt)


def _insert_once(table: DistributedTable, ins: Insert, timeout: float | None) -> InsertResult:
    if _inserts_here(table, ins):  # the caller's thread writes (an actor into its own worker's shards) ...
        return _insert_here(table, ins, timeout)
    lanes = _insert_lanes(table, ins)
    if lanes is not None:  # ... or sends them over the workers' lanes (see thread_insert)
        return _insert_over_lanes(table, ins, timeout, lanes)
    return table._ctx.sync(insert_prepared, table, ins, timeout)


def insert_batch(
    table: DistributedTable,
    columns: Mapping[str, ArrayLike],
    priorities: ArrayLike | float | None = None,
    *,
    timeout: float | None = None,
    shard: int | None = None,
) -> InsertResult:
    """Insert ``B`` trajectories of ``T`` steps given as ``[B, T, *shape]`` arrays, all or nothing.

    Validated whole first; each row then travels as one episode, from
    host memory (device arrays are copied to the host), as :meth:`insert`.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    columns : mapping of str to array
        Every column, ``[B, T, *shape]`` (NumPy or CuPy), ``B, T >= 1``.
    priorities : None, float or array
        None, one value, or one per item (``B * T`` for step items, ``B``
        for episode items), in row order.
    timeout : float, optional
        Seconds to wait for the rate limiter; default the handle's.
    shard : int, optional
        Put every trajectory on this shard.

    Returns
    -------
    InsertResult
        As :meth:`insert`, one episode per row.

    Raises
    ------
    InvalidDataError, InvalidPriorityError, CapacityError, SpecError, RateLimitTimeout, ShardLostError
        As :meth:`insert`.
    """
    arrays, B, _ = check_batch(table.spec, columns)
    host = {c: to_host(a) for c, a in arrays.items()}  # one copy per column: they cross the comm from host memory
    rows = [{c: a[b] for c, a in host.items()} for b in range(B)]
    return table.insert(rows, priorities, timeout=timeout, shard=shard)
