"""Soak: writers × samplers × priority updaters on a 2-worker LocalCluster, bounded in time.

At the end: no deadlock (every thread and task finished), inserted = stored +
evicted + removed exactly (per shard and in total, and the coordinator agrees),
and the observed samples-per-insert stayed inside the limiter's error buffer.
"""

from __future__ import annotations

import threading
import time

import dask
import numpy as np
import pytest
from distributed import Client, Event, LocalCluster
from helpers import COLUMNS, episode

import gear_flow as gf
from gear_flow.distributed import DistributedTable

pytestmark = pytest.mark.timeout(240)

SOAK_SECONDS = 15


def worker_writer(name, stop_name, seed):
    """A writer task on a worker: streams steps into its local shard until told to stop."""
    import numpy as np
    from distributed import Event

    import gear_flow as gf
    from gear_flow.distributed import DistributedTable

    table = DistributedTable.attach(name, timeout=1.0)
    stop = Event(stop_name)
    rng = np.random.default_rng(seed)
    episodes = 0
    w = table.writer()
    while not stop.is_set():
        n = int(rng.integers(5, 30))
        for t in range(n):
            w.append({"obs": rng.random(3), "ep": 1000 + seed, "t": t, "done": t == n - 1})
        try:
            w.end_episode()
            episodes += 1
        except gf.RateLimitTimeout:
            w.discard()
    return episodes, table.local_shards


def test_soak():
    spi, min_size, buffer = 2.0, 200, 400.0
    limiter = gf.SampleToInsertRatio(samples_per_insert=spi, min_size_to_sample=min_size, error_buffer=buffer)
    with dask.config.set({"distributed.comm.timeouts.connect": "5s"}):
        with (
            LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster,
            Client(cluster) as c,
        ):
            spec = gf.TableSpec(COLUMNS, capacity=1500, num_shards=2)  # small: the rings wrap and evict
            table = DistributedTable.create(
                c, spec, sampler=gf.Prioritized(0.6, 0.4), rate_limiter=limiter, timeout=1.0, seed=0, name="soak"
            )
            stop = threading.Event()
            stop_ev = Event("soak-stop", client=c)
            counts = {"inserts": 0, "samples": 0, "updates": 0, "timeouts": 0}
            lock = threading.Lock()
            errors = []

            def count(k, n=1):
                with lock:
                    counts[k] += n

            def writer(seed):
                rng = np.random.default_rng(seed)
                try:
                    while not stop.is_set():
                        try:
                            table.insert(
                                [episode(int(rng.integers(1, 999)), int(rng.integers(5, 40))) for _ in range(2)]
                            )
                            count("inserts")
                        except gf.RateLimitTimeout:
                            count("timeouts")
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            def sampler(seed):
                rng = np.random.default_rng(seed)
                try:
                    while not stop.is_set():
                        try:
                            b = table.sample(32, int(rng.integers(1, 5)), rng=rng)
                            count("samples")
                            r = table.update_priorities(b.keys, rng.random(len(b)) + 0.01)
                            count("updates", r.applied)
                        except gf.RateLimitTimeout:
                            count("timeouts")
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            tasks = [c.submit(worker_writer, "soak", "soak-stop", 100 + i, pure=False) for i in range(2)]
            threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
            threads += [threading.Thread(target=sampler, args=(10 + i,)) for i in range(3)]
            for th in threads:
                th.start()
            time.sleep(SOAK_SECONDS)
            stop.set()
            stop_ev.set()
            for th in threads:
                th.join(timeout=30)
            assert not any(th.is_alive() for th in threads), "a client thread is stuck"
            task_results = c.gather(tasks)  # the worker writers ended too
            assert not errors, errors

            info = table.info()
            tot = info["totals"]
            assert tot["inserted"] == tot["size"] + tot["evicted"] + tot["removed"] + tot["deleted"] + tot["expired"], (
                tot
            )
            for s in info["shards"]:
                assert s["inserted"] == s["size"] + s["evicted"] + s["removed"] + s["deleted"] + s["expired"], s
            assert info["size"] == info["coordinator_size"]
            assert tot["evicted"] > 0  # the rings wrapped under load
            lim = info["rate_limiter"]
            diff = lim["inserts"] * spi - lim["samples"]
            assert lim["min_diff"] <= diff <= lim["max_diff"], (diff, lim)
            assert lim["samples"] == 32 * counts["samples"]  # every admitted sample was served (no rollback left)
            assert counts["samples"] > 10 and counts["inserts"] > 10 and all(e > 0 for e, _ in task_results)
            ratio = lim["samples"] / max(lim["inserts"] - min_size, 1)
            print(
                f"\nsoak {SOAK_SECONDS}s: {lim['inserts']} items inserted ({tot['inserted_episodes']} episodes, "
                f"{sum(e for e, _ in task_results)} from worker tasks), {counts['samples']} batches sampled, "
                f"{counts['updates']} priorities updated, {tot['stale_updates']} stale, {tot['evicted']} evicted, "
                f"{counts['timeouts']} limiter timeouts; samples/insert after warm-up {ratio:.2f} "
                f"(target {spi}, diff {diff:.0f} within [{lim['min_diff']:.0f}, {lim['max_diff']:.0f}])"
            )
            table.close()
