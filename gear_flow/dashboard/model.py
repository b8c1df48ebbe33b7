"""What the dashboard page shows, computed from plain dicts: no Dask, no Bokeh.

The scheduler plugin polls, for every table, the coordinator's state
(:meth:`TableGate.public <gear_flow.distributed.gate.TableGate.public>`) and
each shard worker's counters (``ShardHost.info``), and keeps the learners'
transport counters they report.  :func:`snapshot` turns one poll into rows
(one per table, one per shard, one per learner); :func:`rates` turns two
snapshots into insert and sample rates.  The page only displays these rows, so
everything it shows is tested here without a browser.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: the learners' transport counters, as ``DistributedTable.stats`` names them
TRANSPORT_KEYS = ("local_bytes", "shared_bytes", "remote_bytes", "batches")


@dataclass
class Snapshot:
    """One poll of every table.

    Attributes
    ----------
    time : float
        ``time.time()`` of the poll.
    tables : dict of str to dict
        Table name -> its row (see :func:`table_row`).
    shards : list of dict
        One row per shard of every table (see :func:`shard_rows`).
    learners : list of dict
        One row per learner handle that reported its transport counters.
    """

    time: float
    tables: dict = field(default_factory=dict)
    shards: list = field(default_factory=list)
    learners: list = field(default_factory=list)


def step_bytes(config: Mapping[str, Any]) -> int:
    """Bytes of one stored step of a table, from its configuration's spec.

    Parameters
    ----------
    config : mapping
        The table's configuration as the coordinator keeps it: ``spec`` in
        :meth:`TableSpec.to_dict <gear_flow.TableSpec.to_dict>` layout.

    Returns
    -------
    int
        Sum over columns of ``prod(shape) * itemsize``.
    """
    return sum(int(_prod(c["shape"])) * _itemsize(c["dtype"]) for c in config["spec"]["columns"])


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _itemsize(dtype: str) -> int:
    import numpy as np

    return int(np.dtype(dtype).itemsize)


def shard_rows(name: str, public: dict, infos: list[dict], resident: dict) -> list[dict]:
    """One row per shard of table ``name``.

    Parameters
    ----------
    name : str
        The table.
    public : dict
        The coordinator's state of the table (``TableGate.public()``).
    infos : list of dict
        ``ShardHost.info`` of every reachable shard, each with its ``worker``.
    resident : dict
        Worker address -> ``{"data": bytes, "overhead": bytes}`` of the table there.

    Returns
    -------
    list of dict
        Per shard: ``table``, ``shard``, ``worker``, ``state`` (``ok`` or
        ``lost``), ``size``, ``capacity`` (steps), ``steps``, ``bytes`` (stored
        steps times the step's bytes), ``inserted``, ``sampled``, ``evicted``
        (storage overwrites plus remover evictions), ``expired``,
        ``stale_updates``; for a disk shard ``disk_bytes`` (its files' blocks)
        and ``page_in_bytes`` (read from storage by its worker process so far),
        0 otherwise.  Lost shards keep the size the coordinator counted at their loss.
    """
    per_step = step_bytes(public["config"])
    rows = []
    seen = set()
    for i in sorted(infos, key=lambda r: r["shard"]):
        s = int(i["shard"])
        seen.add(s)
        rows.append(
            {
                "table": name,
                "shard": s,
                "worker": i.get("worker", ""),
                "state": "lost" if s in _lost(public) else "ok",
                "size": int(i["size"]),
                "capacity": int(i["capacity"]),
                "steps": int(i["steps_stored"]),
                "bytes": int(i["steps_stored"]) * per_step,
                "inserted": int(i["inserted"]),
                "sampled": int(i["sampled"]),
                "evicted": int(i["evicted"]) + int(i["removed"]),
                "expired": int(i["expired"]),
                "stale_updates": int(i["stale_updates"]),
                "disk_bytes": int((i.get("disk") or {}).get("bytes_on_disk") or 0),
                "page_in_bytes": int((i.get("disk") or {}).get("page_in_bytes") or 0),
            }
        )
    for s, addr in sorted(public["placement"].items(), key=lambda kv: int(kv[0])):
        if int(s) not in seen:
            rows.append(
                {
                    "table": name,
                    "shard": int(s),
                    "worker": addr,
                    "state": "lost" if int(s) in _lost(public) else "unreachable",
                    "size": _last_size(public, int(s)),
                    "capacity": public["config"]["spec"]["capacity"],
                    **dict.fromkeys(
                        ("steps", "bytes", "inserted", "sampled", "evicted", "expired", "disk_bytes", "page_in_bytes"),
                        0,
                    ),
                    "stale_updates": 0,
                }
            )
    for r in rows:
        r["resident_bytes"] = sum(v for v in resident.get(r["worker"], {}).values()) if r["state"] == "ok" else 0
    return rows


def _lost(public: dict) -> set[int]:
    return {int(k) for k in public.get("lost", {})}


def table_row(name: str, public: dict, shards: list[dict], resident: dict) -> dict:
    """The row of one table.

    Parameters
    ----------
    name : str
    public : dict
        The coordinator's state of the table.
    shards : list of dict
        Its rows from :func:`shard_rows`.
    resident : dict
        Worker address -> resident bytes of the table there.

    Returns
    -------
    dict
        ``table``, ``size`` (committed items, the coordinator's count),
        ``max_size``, ``capacity`` (steps, all shards), ``bytes`` (stored),
        ``resident_bytes`` (data and overhead on the workers), ``limiter``
        (kind), ``blocked_inserts`` and ``blocked_samples`` (calls waiting for
        the limiter), ``inserts_in_flight``, ``samples_per_insert`` (samples /
        inserts so far) and ``target_spi`` (the limiter's; None for limiters
        without a ratio), ``evicted``, ``expired``, ``stale_updates``,
        ``lost`` (number of lost shards), ``shards``, ``disk_bytes`` (its
        disk shards' files; 0 on the memory tiers), ``closed`` (closed with
        ``drop=False``: its data stays on the workers until it is dropped).
    """
    lim = public["rate_limiter"]
    ratio = lim["kind"] == "SampleToInsertRatio"
    inserts, samples = int(lim["inserts"]), int(lim["samples"])
    spec = public["config"]["spec"]
    return {
        "table": name,
        "size": int(public["size"]),
        "max_size": int(spec.get("max_size") or spec["capacity"] * spec["num_shards"]),
        "capacity": int(spec["capacity"]) * int(spec["num_shards"]),
        "bytes": sum(r["bytes"] for r in shards),
        "resident_bytes": sum(sum(v.values()) for v in resident.values()),
        "limiter": lim["kind"],
        "blocked_inserts": int(public["waiting"]["inserts"]),
        "blocked_samples": int(public["waiting"]["samples"]),
        "inserts_in_flight": int(public["inserts_in_flight"]),
        "samples_per_insert": samples / inserts if inserts else 0.0,
        "target_spi": float(lim["samples_per_insert"]) if ratio else None,
        "evicted": sum(r["evicted"] for r in shards),
        "expired": sum(r["expired"] for r in shards),
        "stale_updates": sum(r["stale_updates"] for r in shards),
        "lost": len(_lost(public)),
        "shards": len(public["placement"]),
        "disk_bytes": sum(r.get("disk_bytes", 0) for r in shards),
        "closed": bool(public.get("closed")),
    }


def _last_size(public: dict, s: int) -> int:
    """The coordinator's last size of shard ``s``: a lost shard's at its loss (its count went to 0 then)."""
    lost = public.get("lost") or {}
    entry = lost.get(s, lost.get(str(s)))
    if entry and "size_at_loss" in entry:
        return int(entry["size_at_loss"])
    sizes = public["shard_size"]
    return int(sizes.get(s, sizes.get(str(s), 0)))


def learner_rows(reports: dict, now: float | None = None) -> list[dict]:
    """One row per learner handle from the transport counters they reported.

    Parameters
    ----------
    reports : dict
        ``(table, learner) -> {"local_bytes", "remote_bytes", "batches", "time"}``.
    now : float, optional
        Current ``time.time()`` (for ``age_s``).

    Returns
    -------
    list of dict
        ``table``, ``learner``, ``local_bytes`` (read in-process or from shared
        memory), ``remote_bytes`` (received over the Dask comm), ``batches``,
        ``local_share`` (fraction of bytes that did not cross the comm) and
        ``age_s`` (seconds since the report).
    """
    now = time.time() if now is None else now
    rows = []
    for (table, learner), st in sorted(reports.items()):
        local = int(st.get("local_bytes", 0)) + int(st.get("shared_bytes", 0))  # in-process or shared memory
        remote = int(st.get("remote_bytes", 0))
        rows.append(
            {
                "table": table,
                "learner": learner,
                "local_bytes": local,
                "remote_bytes": remote,
                "batches": int(st.get("batches", 0)),
                "local_share": local / (local + remote) if local + remote else 0.0,
                "age_s": max(0.0, now - float(st.get("time", now))),
            }
        )
    return rows


def snapshot(tables: dict, infos: dict, resident: dict, reports: dict, now: float | None = None) -> Snapshot:
    """Rows of every table from one poll.

    Parameters
    ----------
    tables : dict
        Table name -> ``TableGate.public()``.
    infos : dict
        Table name -> list of ``ShardHost.info`` rows (each with ``worker``).
    resident : dict
        Table name -> worker address -> ``ShardHost.nbytes``.
    reports : dict
        The learners' reports (see :func:`learner_rows`).
    now : float, optional

    Returns
    -------
    Snapshot
    """
    now = time.time() if now is None else now
    snap = Snapshot(now)
    for name, public in sorted(tables.items()):
        rows = shard_rows(name, public, infos.get(name, []), resident.get(name, {}))
        snap.tables[name] = table_row(name, public, rows, resident.get(name, {}))
        snap.shards.extend(rows)
    snap.learners = learner_rows(reports, now)
    return snap


def rates(prev: Snapshot | None, cur: Snapshot) -> dict:
    """Items inserted and sampled per second between two snapshots, per table and per shard.

    Parameters
    ----------
    prev, cur : Snapshot
        Consecutive polls (``prev`` None: all rates 0).

    Returns
    -------
    dict
        ``{"tables": {name: (inserts/s, samples/s)}, "shards": {(name, shard): (inserts/s, samples/s)},
        "page_in": {name: bytes/s}}``: page-ins are counted once per worker
        process of a table's disk shards.  A counter that went down (a shard
        restored elsewhere, a restarted worker) counts as 0.
    """
    dt = (cur.time - prev.time) if prev is not None else 0.0
    before = {(r["table"], r["shard"]): r for r in prev.shards} if prev is not None else {}
    shards = {}
    for r in cur.shards:
        p = before.get((r["table"], r["shard"]))
        if p is None or dt <= 0:
            shards[(r["table"], r["shard"])] = (0.0, 0.0)
        else:
            shards[(r["table"], r["shard"])] = (
                max(0, r["inserted"] - p["inserted"]) / dt,
                max(0, r["sampled"] - p["sampled"]) / dt,
            )
    tables = {}
    for (name, _), (i, s) in shards.items():
        a, b = tables.get(name, (0.0, 0.0))
        tables[name] = (a + i, b + s)
    for name in cur.tables:
        tables.setdefault(name, (0.0, 0.0))
    page_in = dict.fromkeys(cur.tables, 0.0)
    if dt > 0:
        was = {(r["table"], r["worker"]): r.get("page_in_bytes", 0) for r in prev.shards}
        now = {(r["table"], r["worker"]): r.get("page_in_bytes", 0) for r in cur.shards}  # one per worker process
        for (name, w), v in now.items():
            if (name, w) in was:
                page_in[name] = page_in.get(name, 0.0) + max(0, v - was[(name, w)]) / dt
    return {"tables": tables, "shards": shards, "page_in": page_in}
