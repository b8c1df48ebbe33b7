"""A distributed Queue/Stack of size 1 and 2 under several producers and consumers (issue 15, point 1),
on the shared 2-worker cluster: the coordinator counts admitted inserts and serves waiters in order."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import gear_flow as gf
from gear_flow.distributed import DistributedTable

X = (gf.ColumnSpec("x", (), np.float32),)


def one(v: float) -> dict:
    return {"x": np.array([v], np.float32)}


def run_all(fns):
    out, errors = [None] * len(fns), []

    def call(i):
        try:
            out[i] = fns[i]()
        except Exception as e:  # noqa: BLE001  (reported by the test)
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(fns))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not any(th.is_alive() for th in threads), "a call is still blocked"
    assert not errors, errors
    return out


@pytest.mark.parametrize("kind", ["queue", "stack"])
def test_issue_scenario_three_producers_four_samples(dist_client, kind):
    """One item in a queue of 1, three producers, four samples: all four items, every time."""
    make = DistributedTable.queue if kind == "queue" else DistributedTable.stack
    for trial in range(4):
        t = make(dist_client, gf.TableSpec(X, capacity=64, num_shards=2), 1, timeout=20, seed=trial)
        try:
            t.insert(one(0))

            def consume(t=t):
                return [float(t.sample(1)["x"].numpy()[0, 0]) for _ in range(4)]

            res = run_all([consume] + [lambda v=v, t=t: t.insert(one(v)) for v in (1.0, 2.0, 3.0)])
            got = res[0]
            assert got[0] == 0.0 and sorted(got) == [0.0, 1.0, 2.0, 3.0], (trial, got)
            info = t.info()
            assert info["totals"]["removed"] == 0 and info["totals"]["evicted"] == 0
            assert info["size"] == info["coordinator_size"] == 0
        finally:
            t.close()


@pytest.mark.parametrize("kind", ["queue", "stack"])
def test_producers_and_consumers_on_a_queue_of_two(dist_client, kind):
    make = DistributedTable.queue if kind == "queue" else DistributedTable.stack
    n = 10
    for rep in range(2):
        t = make(dist_client, gf.TableSpec(X, capacity=128, num_shards=2), 2, timeout=30, seed=rep)
        try:

            def consume(k, t=t):
                return [float(t.sample(1)["x"].numpy()[0, 0]) for _ in range(k)]

            def produce(p, t=t):
                for i in range(n):
                    t.insert(one(100 * p + i))

            res = run_all([lambda: consume(15), lambda: consume(15)] + [lambda p=p: produce(p) for p in range(3)])
            every = res[0] + res[1]
            assert sorted(every) == sorted(100.0 * p + i for p in range(3) for i in range(n))
            if kind == "queue":
                for c in (0, 1):
                    for p in range(3):
                        mine = [v for v in res[c] if v // 100 == p]
                        assert mine == sorted(mine)
            tot = t.info()["totals"]
            assert tot["removed"] == 0 and tot["evicted"] == 0 and tot["expired"] == 3 * n
        finally:
            t.close()
