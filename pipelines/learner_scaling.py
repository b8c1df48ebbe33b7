"""Co-located learners scaling (issue #11): two learners, one per worker, sampling one table at once.

Used by ``bench_distributed.py`` on its 2-worker clusters. Each learner is a task pinned to its
worker that attaches the table (its own shard read in-process) and samples into its own
``SampleBuffers``; starts are synchronised with ``distributed.Event`` s, not sleeps. Besides
GB/s the result holds the CPU every process of the cluster spent, so a shortfall can be told
apart: a machine out of cores (CPU per batch unchanged, cores busy at the limit) or a
serialisation inside the system (cores idle while learners wait).
"""

from __future__ import annotations

import os
import time
import uuid


def _learner(name, B, L, batches, seed, ready, go):
    """Runs on a worker: one learner of :func:`learners_scaling`.

    Warms up, sets the ``ready`` event, waits for ``go``, then samples ``batches`` batches into its
    own buffers. Times are wall (``perf_counter``), this task's thread CPU, and the whole worker
    process's CPU (its event loop and the plugin threads serving the other learner's requests too).
    """
    from distributed import Event, get_worker

    import gear_flow as gf
    from gear_flow.distributed import DistributedTable

    t = DistributedTable.attach(name, seed=seed)
    out = gf.SampleBuffers(t.spec, t.spec.names, B, L)
    for _ in range(2):
        t.sample(B, L, out=out)
    Event(ready).set()
    Event(go).wait()
    start, cpu0, thread0 = time.time(), time.process_time(), time.thread_time()
    t0 = time.perf_counter()
    for _ in range(batches):
        t.sample(B, L, out=out)
    wall = time.perf_counter() - t0
    return {
        "worker": get_worker().address,
        "start": start,
        "wall_s": wall,
        "bytes": batches * sum(a.nbytes for a in out.arrays.values()),
        "thread_cpu_s": time.thread_time() - thread0,
        "process_cpu_s": time.process_time() - cpu0,
        "local_bytes": t.stats["local_bytes"],
        "remote_bytes": t.stats["remote_bytes"],
        "shared_bytes": t.stats["shared_bytes"],
    }


def _learners_at_once(client, name, workers, B, L, batches):
    """One :func:`_learner` per worker of ``workers``, released together; their aggregate GB/s.

    Each learner sets its own ``ready`` event once warmed up; the client waits for all of them and
    then sets the one ``go`` event, so no learner starts while another still attaches or warms up.
    """
    from distributed import Event

    tag = uuid.uuid4().hex
    ready = [Event(f"bench-ready-{tag}-{i}", client=client) for i in range(len(workers))]
    go = Event(f"bench-go-{tag}", client=client)
    futs = [
        client.submit(_learner, name, B, L, batches, i, ready[i].name, go.name, workers=[w], pure=False)
        for i, w in enumerate(workers)
    ]
    for e in ready:
        while not e.wait(timeout=1):
            if any(f.status == "error" for f in futs):
                client.gather(futs)  # raises the learner's error
    cpu0, t0 = _cluster_cpu(client), time.perf_counter()
    go.set()
    each = client.gather(futs)
    cpu1, window = _cluster_cpu(client), time.perf_counter() - t0
    wall = max(r["wall_s"] for r in each)
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    return {
        "gbps": sum(r["bytes"] for r in each) / wall / 1e9,
        "wall_s": wall,
        "start_skew_s": max(r["start"] for r in each) - min(r["start"] for r in each),
        # CPU seconds of every process of the cluster (and this client) from 'go' to the last result:
        # in cores, how much of the machine the run used (2 cores here, shared with other users)
        "cpu_s": cpu,
        "cores_busy": sum(cpu.values()) / window,
        "cpu_ms_per_batch": 1e3 * sum(cpu.values()) / (batches * len(workers)),
        "learners": each,
    }


def _cluster_cpu(client):
    """CPU seconds so far of each worker process, the scheduler and this client process.

    A ``LocalCluster`` runs its scheduler in the client's process: then one ``client`` entry covers both.
    """
    out = dict(client.run(time.process_time))
    if client.run_on_scheduler(os.getpid) != os.getpid():
        out["scheduler"] = client.run_on_scheduler(time.process_time)
    out["client"] = time.process_time()
    return out


def learners_scaling(client, name, B, L, batch_bytes, batches, rounds):
    """Two co-located learners, one per worker, sampling table ``name`` at once, vs one alone.

    Both runs sample the same number of batches per learner on the same cluster and table, so the
    ratio is the scaling issue #11 asks for (target >= 1.6). A first untimed round of both learners
    opens the connections and touches every buffer (otherwise the first timed run, the lone
    learner, pays for it); then ``rounds`` alternating rounds, each side reported by its median.
    """
    workers = sorted(client.nthreads())[:2]
    _learners_at_once(client, name, workers, B, L, max(2, batches // 4))
    ones, twos = [], []
    for _ in range(rounds):
        ones.append(_learners_at_once(client, name, workers[:1], B, L, batches))
        twos.append(_learners_at_once(client, name, workers, B, L, batches))
    one, two = (sorted(r, key=lambda x: x["gbps"])[len(r) // 2] for r in (ones, twos))
    return {
        "batch_bytes": batch_bytes,
        "batches": batches,
        "rounds": rounds,
        "loadavg_1min": os.getloadavg()[0],  # other processes on this machine compete for its cores
        "one": one,
        "two": two,
        "ratio": two["gbps"] / one["gbps"],
        "one_gbps_rounds": [r["gbps"] for r in ones],
        "two_gbps_rounds": [r["gbps"] for r in twos],
    }


def learners_rows(tag, res, rows):
    """Table rows of a :func:`learners_scaling` result (``tag``: workers and data plane)."""
    one, two = res["one"], res["two"]
    rows.append(
        {
            "path": f"one co-located learner alone, {tag}",
            "GB/s": one["gbps"],
            "ref": f"cores busy {one['cores_busy']:.2g}, CPU {one['cpu_ms_per_batch']:.2g} ms/batch",
        }
    )
    rows.append(
        {
            "path": f"two co-located learners at once, {tag}",
            "GB/s": two["gbps"],
            "ratio": res["ratio"],
            "ref": f"one {one['gbps']:.3g} GB/s; cores busy {two['cores_busy']:.2g}, {two['cpu_ms_per_batch']:.2g} ms/batch",
            "target": ">= 1.6",
        }
    )
