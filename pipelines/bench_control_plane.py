"""Control-plane benchmark: the cost of a small batch as the number of workers grows.

    python pipelines/bench_control_plane.py [--workers 1,2,4,8] [--repeat 200] [--out PATH]

A learner's small step: sample B=32 single-step items from a Prioritized
table with one shard per worker, then update their priorities.  Worker
processes share this host's cores, so the numbers measure the fan-out of
messages per batch, not a real cluster's network.  Reported per worker count
and per way the messages travel: median ms of the pair (sample, then a
waiting update) and its ratio to the cost with one worker; then the same step
with the update riding on the next sample (``update_priorities(wait=False)``:
one phase of requests per step).  Then a learner on a third host and two
hosts of 4 workers (``distributed.host-id``): draw requests per batch with
the owners drawing and with one worker per host drawing for its host
(target 2).  Targets: 8 workers <= 3x one; with the
learner drawing itself from the shards' published selection state
(``reader``) and its updates riding along, 8 workers <= 1.5x one.
The sweep over the worker counts runs ``--rounds`` times (3), one after the
other, and each count reports the median of its rounds (every round is in the
JSON).
The ways: Dask's comm only (shared memory and TCP lanes off), the workers'
TCP lanes (shared memory off: what a learner on another machine uses by
default, ``gear_flow.distributed.lane``), shared memory with the
same-machine fast lanes and the owners drawing (``lane``), and shared memory
with the learner drawing itself (``reader``: what a learner on the workers'
machine uses by default, ``gear_flow.distributed.reader_draw``).  The
batch bytes are negligible here; the messages are what is measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_json  # noqa: E402

import gear_flow as gf  # noqa: E402

TARGET = 3.0
#: the ride-along step at 8 workers over one, when the learner draws itself
READER_TARGET = 1.5


#: the ways messages travel: name -> (shared memory, TCP lanes, the learner draws itself)
PLANES = {
    "comm": (False, False, False),
    "tcp_lane": (False, True, False),
    "lane": (True, True, False),
    "reader": (True, True, True),
}


def _table(client, workers: int, items: int, shared: bool, reader: bool, name: str):
    import dask

    from gear_flow.distributed import DistributedTable

    spec = gf.TableSpec((gf.ColumnSpec("obs", (8,), np.float32),), capacity=items // workers + 64, num_shards=workers)
    with dask.config.set({"gear-flow.distributed.shared-memory": shared, "gear-flow.distributed.reader-draw": reader}):
        table = DistributedTable.create(client, spec, sampler=gf.Prioritized(0.6, 0.4), seed=0, name=name)
    rng = np.random.default_rng(0)
    eps = [{"obs": rng.standard_normal((50, 8)).astype(np.float32)} for _ in range(items // 50)]
    table.insert(eps, priorities=list(rng.random((len(eps), 50)) + 0.1))
    return table


def _deferred_steps(table, B: int, repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` steps (after 10) whose update rides on the next sample."""
    rng = np.random.default_rng(1)
    td = []
    for i in range(repeat + 10):
        t0 = time.perf_counter()
        b = table.sample(B, 1)
        table.update_priorities(b.keys.numpy(), rng.random(B) + 0.1, wait=False)
        if i >= 10:
            td.append(time.perf_counter() - t0)
    table.flush()
    return td


def run(workers: int, B: int, repeat: int, items: int) -> dict:
    import dask
    from distributed import Client, LocalCluster

    out = {"workers": workers}
    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        for plane, (shared, tcp, reader) in PLANES.items():
            with dask.config.set({"gear-flow.distributed.tcp-lane": tcp}):
                table = _table(client, workers, items, shared, reader, f"cp_{plane}")
                rng = np.random.default_rng(0)
                ts, tu = [], []
                for i in range(repeat + 10):
                    t0 = time.perf_counter()
                    b = table.sample(B, 1)
                    t1 = time.perf_counter()
                    table.update_priorities(b.keys.numpy(), rng.random(B) + 0.1)
                    t2 = time.perf_counter()
                    if i >= 10:
                        ts.append(t1 - t0)
                        tu.append(t2 - t1)
                ts, tu = np.array(ts), np.array(tu)
                td = _deferred_steps(table, B, repeat)  # the update rides on the next sample
                out[plane] = {
                    "sample_ms": 1e3 * float(np.median(ts)),
                    "update_ms": 1e3 * float(np.median(tu)),
                    "pair_ms": 1e3 * float(np.median(ts + tu)),
                    "deferred_pair_ms": 1e3 * float(np.median(td)),
                    "lanes": len(table._ctx.lanes.paths),
                    "requests": dict(table.requests),  # to the workers, over the 3 * (repeat + 10) steps
                    "requests_per_step": sum(table.requests.values()) / (3 * (repeat + 10)),
                    "stats": {k: v for k, v in table.stats.items() if isinstance(v, (int, float))},
                }
                table.close()
    return out


def hosts_run(per_host: int, B: int, repeat: int, items: int) -> dict:
    """A learner on a third host and two hosts of ``per_host`` workers each (simulated on this machine with
    ``distributed.host-id``): requests to the workers per batch, and ms per batch, with the owners drawing
    (one request per worker drawn from) and with one worker per host drawing for its host (target: 2)."""
    import dask
    from distributed import Client, LocalCluster

    kw = dict(threads_per_worker=1, processes=True, dashboard_address=None)
    with dask.config.set({"gear-flow.distributed.host-id": "a"}):
        cluster = LocalCluster(n_workers=per_host, **kw)
    out = {"workers": 2 * per_host}
    with cluster, Client(cluster) as client:
        with dask.config.set({"gear-flow.distributed.host-id": "b"}):
            cluster.scale(2 * per_host)
            client.wait_for_workers(2 * per_host)
        for way, reader in (("owners", False), ("one_per_host", True)):
            with dask.config.set({"gear-flow.distributed.reader-draw": reader}):
                table = _table(client, 2 * per_host, items, True, reader, f"hosts_{way}")
            for _ in range(10):
                table.sample(B, 1)
            table.flush()
            before = dict(table.requests)
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                table.sample(B, 1)
                ts.append(time.perf_counter() - t0)
            sent = {op: n - before.get(op, 0) for op, n in table.requests.items() if n != before.get(op, 0)}
            out[way] = {
                "sample_ms": 1e3 * float(np.median(ts)),
                "requests": sent,
                "draw_requests_per_batch": (sent.get("sample_part", 0) + sent.get("draw_host", 0)) / repeat,
                "requests_per_batch": sum(sent.values()) / repeat,
            }
            table.close()
    return out


def _median_of(runs: list[dict]) -> dict:
    """One worker count's runs from several sweeps: per plane the median of each time, and every round's.

    The machine's speed drifts over minutes (a 2-core VM shared with others: the same sweep ran 3.9 and
    5.6 ms at 8 workers a minute apart), and the ratio divides two clusters' times measured apart; the
    sweeps run one after the other, so the drift weighs on every worker count alike.
    """
    out = {"workers": runs[0]["workers"]}
    for plane in PLANES:
        x = dict(runs[-1][plane])
        for k in ("sample_ms", "update_ms", "pair_ms", "deferred_pair_ms"):
            x[k] = float(np.median([r[plane][k] for r in runs]))
        x["rounds"] = {k: [r[plane][k] for r in runs] for k in ("pair_ms", "deferred_pair_ms")}
        out[plane] = x
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3, help="sweeps over the worker counts, one after the other")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    sweeps = [[run(w, args.batch_size, args.repeat, args.items) for w in counts] for _ in range(args.rounds)]
    res = [_median_of([s[i] for s in sweeps]) for i in range(len(counts))]
    rows = []
    for r in res:
        row = {
            "workers": r["workers"],
            "target": f"<= {TARGET}; reader ride-along <= {READER_TARGET}" if r["workers"] == 8 else "",
        }
        for plane in PLANES:
            x, first = r[plane], res[0][plane]
            x["ratio_to_first"] = x["pair_ms"] / first["pair_ms"]
            x["deferred_ratio_to_first"] = x["deferred_pair_ms"] / first["deferred_pair_ms"]
            row[f"{plane} ms"] = x["pair_ms"]
            row[f"{plane} ratio"] = x["ratio_to_first"]
            row[f"{plane} ride-along ms"] = x["deferred_pair_ms"]
            row[f"{plane} ride-along ratio"] = x["deferred_ratio_to_first"]
        rows.append(row)
    print_table(rows, ["workers", "target"] + [f"{p} {c}" for p in PLANES for c in ("ms", "ratio", "ride-along ms",
                                                                                     "ride-along ratio")])  # fmt: skip
    hosts = hosts_run(4, args.batch_size, args.repeat, args.items)
    print(
        f"\nacross hosts, 2 x 4 workers, B={args.batch_size}: draw requests per batch "
        f"{hosts['owners']['draw_requests_per_batch']:.2f} (owners drawing, "
        f"{hosts['owners']['sample_ms']:.3g} ms) -> {hosts['one_per_host']['draw_requests_per_batch']:.2f} "
        f"(one worker per host drawing, {hosts['one_per_host']['sample_ms']:.3g} ms); target 2"
    )
    out = {
        "args": vars(args),
        "results": res,
        "target_8_workers": TARGET,
        "target_8_workers_reader": READER_TARGET,
        "hosts": hosts,
        "target_hosts_requests_per_batch": 2,
    }
    print(f"\nwrote {write_json('bench_control_plane', out, args.out)}")
    return out


if __name__ == "__main__":
    main()
