"""Ingestion into a distributed table, as a Dask dataflow: files are read on the workers owning the shards.

For a :class:`~gear_flow.distributed.DistributedTable`:

1. **plan** (one small task on a shard worker): list the partitions (Minari
   episode chunks, D4RL row ranges, episode chunks of Parquet files) and what the metadata promises;
2. **read + validate** (one task per partition, pinned with ``workers=[addr]``
   to a worker that hosts shards, balanced by steps per hosted shard): parse,
   derive ``rtg``/``timestep``, check every episode against the table's spec.
   The parsed episodes stay on that worker as the task's result; only a
   summary (counts, per-episode checksums, source ids) reaches the client;
3. only if *every* partition is valid, **insert** as one transaction: the
   coordinator admits the whole dataset once, then one task per worker (on
   the same worker, reading its partitions' results in place) *stages* them on
   that worker's own shards, so the data goes file → worker → local shard and
   never through the client; when every worker has staged its part the
   client applies and commits it.  Episodes are never split;
4. **read back** (one task per worker): counts and checksums of what the
   shards hold, for the :class:`~gear_flow.ingest.IngestReport`.

A malformed file stops the ingestion in step 2 with a
:class:`~gear_flow.errors.DatasetError` and nothing inserted.  Should staging
fail in step 3 (a lost worker, a rate-limiter timeout), the transaction is
aborted on every worker and at the coordinator: nothing of the dataset is
stored anywhere, nothing was evicted, and the limiter's counts are unchanged.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DatasetError, GearFlowError, ShardLostError
from .common import Plan, capacity_groups, parse_partition
from .dataflow import check_totals, nothing_inserted, part_info, streams
from .formats import FORMATS
from .report import IngestReport, build_report, stored_summary

if TYPE_CHECKING:
    from distributed import Client, Future

    from ..distributed.api import DistributedTable
    from .common import Partition

logger = logging.getLogger(__name__)

#: aim at this many partitions per worker (balance), re-planning with smaller chunks if needed
PARTITIONS_PER_WORKER = 4


# -- distributed: tasks (run on workers) --------------------------------------------------------------


def _plan_task(fmt: str, source, chunk: int, options: dict) -> Plan:
    return FORMATS[fmt].plan(source, chunk, **options)


def _read_task(fmt: str, part, spec, gamma: float, strict: bool, options: dict):
    from distributed import get_worker

    parsed = parse_partition(FORMATS[fmt], part, spec, gamma, strict, options)
    parsed.worker = get_worker().address
    return parsed


def _summary_task(parsed) -> dict:
    return parsed.summary()


def _validate_task(fmt: str, part, spec, gamma: float, strict: bool, options: dict) -> dict:
    """Read and check a partition, keeping only its summary (a streaming ingestion's first read)."""
    return _read_task(fmt, part, spec, gamma, strict, options).summary()


def _reread_task(fmt: str, part, spec, gamma: float, strict: bool, options: dict, before: dict):
    """A streaming ingestion's second read of a partition, refused if it differs from the first."""
    from .dataflow import check_reread

    parsed = _read_task(fmt, part, spec, gamma, strict, options)
    check_reread(before, parsed.summary())
    return parsed


def _stage_task(name: str, txn: str, parsed_list: list, offsets: list, first_id: int, first_stamp: int) -> dict:
    """Stage this worker's partitions as parts of insert ``txn`` on its own shards (nothing visible yet).

    ``offsets[i]`` is ``(episodes, items)`` before partition ``i`` in the whole
    ingestion, so ids and stamps follow the dataset's order on every worker.
    Episodes are routed among the worker's shards partition by partition, as
    separate inserts would be.
    """
    from distributed import get_worker

    from ..distributed.api import DistributedTable
    from ..distributed.plugin import PLUGIN_NAME
    from ..table.routing import pick, route

    table = DistributedTable.attach(name)
    spec = table.spec
    local = [s for s in table.local_shards if s not in table.lost]
    step = spec.item_unit == "step"
    parts, done = [], []
    for k, (p, (ep_off, item_off)) in enumerate(zip(parsed_list, offsets)):
        eps = p.episodes if hasattr(p, "episodes") else p  # a parsed partition, or a list of episodes
        index = p.partition.index if hasattr(p, "partition") else k
        lengths = np.array([len(next(iter(e.values()))) for e in eps], dtype=np.int64)
        ids = first_id + ep_off + np.arange(len(lengths), dtype=np.int64)
        if not len(lengths):
            done.append({"index": index, "episode_ids": ids, "shards": ids, "lengths": lengths})
            continue
        per = lengths if step else np.ones_like(lengths)
        stamps = first_stamp + item_off + np.concatenate(([0], np.cumsum(per)[:-1]))
        dest = np.empty(len(lengths), dtype=np.int64)
        for g in _fitting_groups(lengths, len(local), spec.capacity, table.routing, k):
            dest[g] = np.array(local, dtype=np.int64)[route(lengths[g], len(local), spec.capacity, table.routing, k)]
            for s in np.unique(dest[g]):  # a group's part of each shard: an insert of its own, in order
                sel = g[np.flatnonzero(dest[g] == s)]
                parts.append(
                    {
                        "shard": int(s),
                        "chunks": pick(eps, sel),
                        "lengths": lengths[sel],
                        "episode_ids": ids[sel],
                        "stamps": stamps[sel],
                        "priorities": None,
                    }
                )
        done.append({"index": index, "episode_ids": ids, "shards": dest, "lengths": lengths})
    get_worker().plugins[PLUGIN_NAME].host.stage(name, txn, parts)
    return {"worker": get_worker().address, "local_shards": local, "done": done}


def _fitting_groups(lengths: np.ndarray, n_shards: int, capacity: int, routing: str, k: int) -> list[np.ndarray]:
    """A partition's episodes as one group, or, when routing them at once would put more than a shard's
    capacity on a shard (a dataset larger than the table), as consecutive groups of at most one shard's
    capacity each (:func:`~gear_flow.ingest.common.capacity_groups`); an episode longer than a shard's
    capacity stays in a group of its own, for :func:`~gear_flow.table.routing.route` to refuse by name."""
    from ..errors import CapacityError
    from ..table.routing import route

    try:
        route(lengths, n_shards, capacity, routing, k)
        return [np.arange(len(lengths))]
    except CapacityError:
        return capacity_groups(lengths.tolist(), capacity)


def _stored_task(name: str, ids_by_shard: dict, names) -> dict:
    from distributed import get_worker

    from ..distributed.plugin import PLUGIN_NAME

    host = get_worker().plugins[PLUGIN_NAME].host
    return stored_summary({int(s): host.shard(name, s) for s in ids_by_shard}, ids_by_shard, names)


# -- distributed: the client side ------------------------------------------------------------------


def assign_partitions(parts: Sequence[Partition], shards_per_worker: dict[str, int]) -> list[str]:
    """A worker for each partition: largest first, to the worker with the fewest steps per hosted shard.

    Parameters
    ----------
    parts : sequence of Partition
        The plan's partitions (their ``steps`` are the load).
    shards_per_worker : dict of str to int
        Live shards each worker hosts (all positive).

    Returns
    -------
    list of str
        The worker address of each partition, aligned with ``parts``; ties go
        to the lowest address, so the assignment is deterministic.
    """
    load = {a: 0 for a in sorted(shards_per_worker)}
    out = [""] * len(parts)
    for i in sorted(range(len(parts)), key=lambda i: (-parts[i].steps, i)):
        w = max(parts[i].steps, 1)
        a = min(load, key=lambda a: ((load[a] + w) / shards_per_worker[a], a))
        load[a] += w
        out[i] = a
    return out


def _client_of(table, client):
    if client is not None:
        return client
    c = getattr(table, "client", None)
    if c is not None:
        return c
    from distributed import get_client

    return get_client()


def _gather_or_raise(client, futures, table_name: str) -> list:
    """Results of ``futures``, or the failure of the lowest-numbered one (all waited for first)."""
    from distributed import wait

    wait(futures)
    for f in futures:
        if f.status == "error":
            raise nothing_inserted(f.exception(), table_name)
    return client.gather(futures)


def ingest_distributed(
    table: DistributedTable,
    fmt: str,
    source: str | Sequence[str],
    gamma: float,
    strict: bool,
    chunk: int,
    options: dict[str, Any],
    timeout: float | None,
    client: Client | None,
    t0: float,
) -> IngestReport:
    """:func:`~gear_flow.ingest.ingest` into a distributed table (steps 1-4 of this module's docstring).

    Parameters
    ----------
    table : DistributedTable
        The table; its columns already checked against the readers'.
    fmt : str
        A name in :data:`~gear_flow.ingest.FORMATS`.
    source : str or sequence of str
        Absolute path(s), opened by the workers.
    gamma : float
        Discount of the derived ``rtg`` column.
    strict : bool
        Reject bad values and totals that disagree with the metadata.
    chunk : int
        Most episodes per partition (made smaller to get
        :data:`PARTITIONS_PER_WORKER` partitions per worker).
    options : dict
        Format-specific options (``frame_backend``, ``columns``, ``max_episode_steps``).
    timeout : float or None
        Seconds each insert may wait for the rate limiter.
    client : distributed.Client or None
        Default: the table's client (else the current one).
    t0 : float
        ``time.perf_counter()`` when the ingestion started (for ``elapsed_s``).

    Returns
    -------
    IngestReport
        What was read and what the shards hold afterwards.

    Raises
    ------
    DatasetError
        A malformed file; nothing was inserted.
    ShardLostError
        The table has no live shard.
    """
    client = _client_of(table, client)
    spec = table.spec
    by_worker = defaultdict(list)
    for s, a in sorted(table.placement.items()):
        if s not in table.lost:
            by_worker[a].append(s)
    if not by_worker:
        raise ShardLostError(-1, f"table {table.name!r} has no live shard to ingest into")
    addrs = sorted(by_worker)
    token = uuid.uuid4().hex[:8]
    plan = client.submit(
        _plan_task, fmt, source, chunk, options, workers=addrs, pure=False, key=f"gear-flow-ingest-plan-{token}"
    )
    plan = _gather_or_raise(client, [plan], table.name)[0]
    want = PARTITIONS_PER_WORKER * len(addrs)
    if len(plan.partitions) < want and (plan.expected_episodes or 0) > len(plan.partitions):
        finer = max(1, math.ceil((plan.expected_episodes or 0) / want))
        if finer < chunk:
            f2 = client.submit(
                _plan_task,
                fmt,
                source,
                finer,
                options,
                workers=addrs,
                pure=False,
                key=f"gear-flow-ingest-plan2-{token}",
            )
            plan = _gather_or_raise(client, [f2], table.name)[0]
    where = assign_partitions(plan.partitions, {a: len(s) for a, s in by_worker.items()})
    if streams(table):
        summaries, results = _stream_partitions(client, table, fmt, plan, where, gamma, strict, options, timeout, token)
        return _finish(client, table, fmt, source, plan, summaries, results, t0, token)
    reads, sums = [], []
    for p, a in zip(plan.partitions, where):
        rf = client.submit(
            _read_task,
            fmt,
            p,
            spec,
            gamma,
            strict,
            options,
            workers=[a],
            allow_other_workers=False,
            pure=False,
            key=f"gear-flow-ingest-read-{token}-{p.index}",
        )
        reads.append(rf)
        sums.append(
            client.submit(
                _summary_task,
                rf,
                workers=[a],
                allow_other_workers=False,
                pure=False,
                key=f"gear-flow-ingest-summary-{token}-{p.index}",
            )
        )
    try:
        summaries = _gather_or_raise(client, sums, table.name)
        _check_totals(plan, summaries, strict, table.name)
        # every partition is valid: one insert transaction, staged by each worker from its own partitions
        step = spec.item_unit == "step"
        counts = [(int(m["episodes"]), int(m["steps"]) if step else int(m["episodes"])) for m in summaries]
        results = insert_partitions(client, table, reads, where, counts, timeout, token)
    finally:
        client.cancel(reads + sums)  # the parsed episodes leave the workers' memory
    return _finish(client, table, fmt, source, plan, summaries, results, t0, token)


def _check_totals(plan, summaries, strict: bool, name: str) -> None:
    """:func:`~gear_flow.ingest.dataflow.check_totals` of every partition's summary, before anything is
    inserted: a dataset that fails it raises as nothing inserted into table ``name``."""
    try:
        check_totals(plan, summaries, strict)
    except DatasetError as e:
        raise nothing_inserted(e, name) from None


def _stream_partitions(client, table, fmt, plan, where, gamma, strict, options, timeout, token) -> tuple:
    """A streaming ingestion (:func:`~gear_flow.ingest.dataflow.streams`): every partition validated on its
    worker keeping only summaries, then inserted in waves of one partition per worker, each wave a
    transaction, each partition read again by the worker that stages it."""
    spec = table.spec
    checks = [
        client.submit(_validate_task, fmt, p, spec, gamma, strict, options, workers=[a], allow_other_workers=False,
                      pure=False, key=f"gear-flow-ingest-validate-{token}-{p.index}")
        for p, a in zip(plan.partitions, where)
    ]  # fmt: skip
    summaries = _gather_or_raise(client, checks, table.name)
    _check_totals(plan, summaries, strict, table.name)
    step = spec.item_unit == "step"
    queues = defaultdict(list)
    for i, a in enumerate(where):
        queues[a].append(i)
    results: dict[str, dict[str, Any]] = {}
    wave = 0
    while any(queues.values()):
        now = [q.pop(0) for q in queues.values() if q]
        reads = [
            client.submit(_reread_task, fmt, plan.partitions[i], spec, gamma, strict, options, summaries[i],
                          workers=[where[i]], allow_other_workers=False, pure=False,
                          key=f"gear-flow-ingest-read-{token}-{plan.partitions[i].index}")
            for i in now
        ]  # fmt: skip
        counts = [(int(summaries[i]["episodes"]), int(summaries[i]["steps" if step else "episodes"])) for i in now]
        try:
            got = insert_partitions(client, table, reads, [where[i] for i in now], counts, timeout, f"{token}-{wave}")
        finally:
            client.cancel(reads)  # this wave's episodes leave the workers' memory before the next is read
        for a, r in got.items():
            results.setdefault(a, {**r, "done": []})["done"].extend(r["done"])
        wave += 1
    return summaries, results


def _finish(client, table, fmt, source, plan, summaries, results, t0, token) -> IngestReport:
    """Read back what the shards hold of the ingested episodes and build the report."""
    spec = table.spec
    done = {
        d["index"]: {**d, "worker": r["worker"], "local_shards": r["local_shards"]}
        for r in results.values()
        for d in r["done"]
    }
    ids = (
        np.concatenate([done[p.index]["episode_ids"] for p in plan.partitions])
        if plan.partitions
        else np.zeros(0, np.int64)
    )
    dest = (
        np.concatenate([done[p.index]["shards"] for p in plan.partitions]) if plan.partitions else np.zeros(0, np.int64)
    )
    ids_by = defaultdict(dict)
    for s in np.unique(dest):
        ids_by[table.placement[int(s)]][int(s)] = ids[dest == s]
    back = {
        a: client.submit(
            _stored_task,
            table.name,
            d,
            spec.names,
            workers=[a],
            allow_other_workers=False,
            pure=False,
            key=f"gear-flow-ingest-readback-{token}-{a}",
        )
        for a, d in ids_by.items()
    }
    stored = {s: v for r in client.gather(list(back.values())) for s, v in r.items()}
    parts_info = [
        {
            **part_info(s),
            "read_on": s["worker"],
            "worker": done[s["index"]]["worker"],
            "shards": sorted(set(np.asarray(done[s["index"]]["shards"]).tolist())),
        }
        for s in summaries
    ]
    report = build_report(fmt, source, spec.names, summaries, parts_info, stored, ids, time.perf_counter() - t0)
    if report.episodes_stored < report.episodes_read:
        logger.warning(
            "table %r kept %d of %d ingested episodes (shard capacity %d steps): older ones were evicted",
            table.name,
            report.episodes_stored,
            report.episodes_read,
            spec.capacity,
        )
    return report


def insert_partitions(
    client: Client,
    table: DistributedTable,
    parts: Sequence[Future],
    where: Sequence[str],
    counts: Sequence[tuple[int, int]],
    timeout: float | None,
    token: str,
) -> dict[str, dict[str, Any]]:
    """Insert partitions held on workers as one transaction.

    Admitted once, staged by the workers that hold the partitions (data never
    through the client), applied and committed only if every worker staged
    its part; otherwise aborted everywhere, with nothing stored and the
    limiter's counts as before.

    Parameters
    ----------
    client : distributed.Client
        The client that runs the tasks.
    table : DistributedTable
        The table to insert into.
    parts : sequence of distributed.Future
        ``parts[i]``: a parsed partition or a list of episodes, held on ``where[i]``.
    where : sequence of str
        The worker address holding each of ``parts``.
    counts : sequence of (int, int)
        ``(episodes, items)`` of each of ``parts``.
    timeout : float or None
        Seconds the admission may wait for the rate limiter.
    token : str
        Unique per call; names the transaction and the task keys.

    Returns
    -------
    dict of str to dict
        Per worker address, ``{"worker", "local_shards", "done"}`` as its
        staging task reported.
    """
    from distributed import wait

    from ..distributed.writes import Unstored, insert_held  # (the distributed table imports this package)

    n_eps = [int(c[0]) for c in counts]
    n_items = [int(c[1]) for c in counts]
    ep_off = np.concatenate(([0], np.cumsum(n_eps)[:-1])).astype(int).tolist() if n_eps else []
    it_off = np.concatenate(([0], np.cumsum(n_items)[:-1])).astype(int).tolist() if n_items else []
    mine = defaultdict(list)
    for i, a in enumerate(where):
        mine[a].append(i)
    shards = {s: 0 for s, a in table.placement.items() if a in mine and s not in table.lost}
    results = {}

    def stage(adm: dict) -> list[str]:
        # each worker stages the partitions it holds (the data never passes through the client)
        staged = {
            a: client.submit(
                _stage_task,
                table.name,
                adm["txn"],
                [parts[i] for i in idx],
                [(ep_off[i], it_off[i]) for i in idx],
                adm["first_episode_id"],
                adm["first_stamp"],
                workers=[a],
                allow_other_workers=False,
                pure=False,
                key=f"gear-flow-ingest-stage-{token}-{a}",
            )
            for a, idx in mine.items()
        }
        wait(list(staged.values()))
        bad = [f.exception() for f in staged.values() if f.status == "error"]
        if bad:
            raise Unstored(bad[0], sorted(staged), held=sorted(staged))
        results.update((a, f.result()) for a, f in staged.items())
        return list(staged)

    try:
        applied, _ = insert_held(table, sum(n_items), sum(n_eps), shards, timeout, stage)
    except Unstored as e:
        err = nothing_inserted(e.cause, table.name)
        if isinstance(err, DatasetError):
            raise err from None
        raise GearFlowError(
            f"ingestion into table {table.name!r} failed while the workers staged it ({type(err).__name__}: {err}); "
            "nothing was inserted"
        ) from err
    for a, r in results.items():  # first keys come back per shard, in the order the parts were staged
        at = {s: 0 for s in applied[a]["first_keys"]}
        for d in r["done"]:
            d["first_keys"] = np.empty(len(d["shards"]), dtype=np.int64)
            for j, s in enumerate(np.asarray(d["shards"]).tolist()):
                d["first_keys"][j] = applied[a]["first_keys"][s][at[s]]
                at[s] += 1
    return results
