"""Ingestion into a distributed table, as a Dask dataflow: files are read on the workers owning the shards.

For a :class:`~gear_flow.distributed.DistributedTable`:

1. **plan** (one small task on a shard worker): list the partitions (Minari
   episode chunks, D4RL row ranges, episode chunks of Parquet files) and what the metadata promises;
2. **read + validate** (one task per partition, pinned with ``workers=[addr]``
   to a worker that hosts shards, balanced by steps per hosted shard): parse,
   derive ``rtg``/``timestep``, check every episode against the table's spec.
   The parsed episodes stay on that worker as the task's result; only a
   summary (counts, per-episode checksums, source ids) reaches the client;
3. only if *every* partition is valid, **insert** (one task per worker, on
   the same worker, reading its partitions' results in place): the task
   attaches to the table (:meth:`DistributedTable.attach`) and inserts
   partition by partition; writer affinity routes them to that worker's own
   shards, so the data goes file → worker → local shard and never through
   the client.  Episodes are never split;
4. **read back** (one task per worker): counts and checksums of what the
   shards hold, for the :class:`~gear_flow.ingest.IngestReport`.

A malformed file stops the ingestion in step 2 with a
:class:`~gear_flow.errors.DatasetError` and nothing inserted.  Should an
insert itself fail in step 3 (a lost worker, a rate-limiter timeout), the
partitions already inserted are deleted again before the error is raised
(their items are removed; their steps stay in the rings until overwritten).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import defaultdict

import numpy as np

from ..errors import DatasetError, ShardLostError
from .common import Plan, parse_partition
from .dataflow import check_totals, nothing_inserted, part_info
from .formats import FORMATS
from .report import IngestReport, build_report, stored_summary

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


def _insert_task(name: str, parsed_list: list, timeout) -> dict:
    """Insert this worker's partitions through a worker-side handle (writer affinity: its own shards)."""
    from distributed import get_worker

    from ..distributed.api import DistributedTable

    table = DistributedTable.attach(name)
    done, error = [], None
    for p in parsed_list:
        if not p.episodes:
            done.append(
                {
                    "index": p.partition.index,
                    "episode_ids": np.zeros(0, np.int64),
                    "first_keys": np.zeros(0, np.int64),
                    "shards": np.zeros(0, np.int64),
                    "lengths": np.zeros(0, np.int64),
                }
            )
            continue
        try:
            r = table.insert(p.episodes, timeout=timeout)
        except Exception as e:  # reported, and the partitions already inserted are rolled back by the client
            error = e
            break
        done.append(
            {
                "index": p.partition.index,
                "episode_ids": r.episode_ids,
                "first_keys": r.first_keys,
                "shards": r.shards,
                "lengths": np.array([len(next(iter(e.values()))) for e in p.episodes], dtype=np.int64),
            }
        )
    return {"worker": get_worker().address, "local_shards": table.local_shards, "done": done, "error": error}


def _stored_task(name: str, ids_by_shard: dict, names) -> dict:
    from distributed import get_worker

    from ..distributed.plugin import PLUGIN_NAME

    host = get_worker().plugins[PLUGIN_NAME].host
    return stored_summary({int(s): host.shard(name, s) for s in ids_by_shard}, ids_by_shard, names)


# -- distributed: the client side ------------------------------------------------------------------


def assign_partitions(parts, shards_per_worker: dict[str, int]) -> list[str]:
    """A worker for each partition: largest first, to the worker with the fewest steps per hosted shard."""
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


def ingest_distributed(table, fmt, source, gamma, strict, chunk, options, timeout, client, t0) -> IngestReport:
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
        try:
            check_totals(plan, summaries, strict)
        except DatasetError as e:
            raise nothing_inserted(e, table.name) from None
        # every partition is valid: insert, each worker its own partitions, in place
        mine = defaultdict(list)
        for i, a in enumerate(where):
            mine[a].append(i)
        ins = {
            a: client.submit(
                _insert_task,
                table.name,
                [reads[i] for i in idx],
                timeout,
                workers=[a],
                allow_other_workers=False,
                pure=False,
                key=f"gear-flow-ingest-insert-{token}-{a}",
            )
            for a, idx in mine.items()
        }
        results = _collect_inserts(client, table, ins)
    finally:
        client.cancel(reads + sums)  # the parsed episodes leave the workers' memory
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


def _collect_inserts(client, table, ins: dict) -> dict:
    """Insert results by worker; on any failure, delete what the others inserted, then raise."""
    from distributed import wait

    wait(list(ins.values()))
    results, errors = {}, []
    for a, f in ins.items():
        if f.status == "error":
            errors.append(f.exception())
        else:
            results[a] = f.result()
            if results[a]["error"] is not None:
                errors.append(results[a]["error"])
    if not errors:
        return results
    keys = []
    for r in results.values():
        for d in r["done"]:
            for fk, t in zip(d["first_keys"], d["lengths"]):
                keys.append(fk + np.arange(t if table.spec.item_unit == "step" else 1, dtype=np.int64))
    if keys:
        table.delete(np.concatenate(keys))
        logger.error(
            "ingestion into %r failed during insert; rolled back %d items", table.name, sum(len(k) for k in keys)
        )
    raise errors[0]
