"""Local (single-process) benchmark on the reference workload of DESIGN.md.

200 episodes x 1000 steps; obs float32[256], action int64, reward float32,
done bool; windows L=64, batch B=256, torch tensors out.  Every path reports
GB/s delivered and its ratio to a single-thread ``np.copyto`` of the same bytes
measured in this run.  The peers run the same workload side by side when they
are installed: TorchRL's replay buffer (SliceSampler / PrioritizedSliceSampler on
a LazyTensorStorage) and DeepMind Reverb (windows written by its Writer, read
through a TrajectoryDataset; its TrajectoryWriter timed writing too).  They need
an environment of their own (torch 2.14, NumPy 1.x: the ``bench`` extra)::

    python3 -m venv .venv-peers && .venv-peers/bin/pip install -q -e '.[pipelines,bench]'
    .venv-peers/bin/python pipelines/bench_local.py

Usage::

    python pipelines/bench_local.py            # full run, writes benchmarks/results/bench_local.json
    python pipelines/bench_local.py --quick    # small sizes, seconds (used by the test suite)
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    alternate,
    make_episodes,
    memcpy_gbps,
    memcpy_step,
    packages,
    print_table,
    reference_columns,
    reference_options,
    rss_bytes,
    timeit,
    write_json,
)

import gear_flow as gf  # noqa: E402


def bench_gear_flow(args, eps, rows, results):
    B, L = args.batch_size, args.length
    cols = reference_columns()
    step_bytes = sum(c.nbytes for c in cols)
    steps = sum(len(e["reward"]) for e in eps)
    batch_bytes = B * L * step_bytes
    pool = args.memcpy_pool_mb << 20
    ref_batch = memcpy_gbps(batch_bytes, repeat=args.repeat, pool_bytes=pool)
    results["memcpy_batch_gbps"] = ref_batch
    rows.append({"path": "memcpy (1 thread), one batch", "GB/s": ref_batch, "x memcpy": 1.0})

    # -- insert (steady state: the ring is full and wraps, evicting) ----------------
    spec = gf.TableSpec(cols, capacity=steps)
    warm = gf.LocalTable(gf.TableSpec(cols, capacity=4 * args.episode_length), seed=0)
    warm.insert(eps[:2])
    warm.sample(B, min(L, args.episode_length))  # compile every kernel before measuring memory
    del warm
    gc.collect()
    rss0 = rss_bytes()
    table = gf.LocalTable(spec, sampler=gf.Uniform(), seed=0)
    per_call = args.insert_batch
    for i in range(0, len(eps), per_call):
        table.insert(eps[i : i + per_call])
    rss1 = rss_bytes()
    call_bytes = per_call * args.episode_length * step_bytes
    ref_ins = memcpy_gbps(call_bytes, repeat=args.repeat, pool_bytes=pool, cold_dst=True)
    k = iter(range(10**9))

    def insert_once():
        i = (next(k) * per_call) % len(eps)
        table.insert(eps[i : i + per_call])

    ts = timeit(insert_once, repeat=max(3, len(eps) // per_call))
    ins = call_bytes / float(np.median(ts)) / 1e9
    results["insert"] = {"gbps": ins, "memcpy_gbps": ref_ins, "ratio": ins / ref_ins, "target": 0.5}
    rows.append(
        {"path": f"insert ({per_call} episodes/call)", "GB/s": ins, "x memcpy": ins / ref_ins, "target": ">= 0.5"}
    )

    # -- memory ---------------------------------------------------------------------
    nb = table.nbytes()
    raw = steps * step_bytes
    results["memory"] = {
        "raw_bytes": raw,
        "rss_delta_bytes": rss1 - rss0,
        "rss_per_raw": (rss1 - rss0) / raw,
        "accounted_per_raw": (nb["data"] + nb["overhead"]) / raw,
        "overhead_bytes_per_step": nb["overhead"] / steps,
        "target": 1.05,
    }
    rows.append(
        {
            "path": "memory resident / raw bytes",
            "ratio": (rss1 - rss0) / raw,
            "note": f"{nb['overhead'] / steps:.1f} B/step overhead",
            "target": "<= 1.05",
        }
    )

    # -- uniform windows -----------------------------------------------------------------
    out = gf.SampleBuffers(spec, spec.names, B, L)
    ts = timeit(lambda: table.sample(B, L, out=out), repeat=args.repeat)
    uni = batch_bytes / float(np.median(ts)) / 1e9
    results["uniform"] = {"gbps": uni, "ratio": uni / ref_batch, "ms": 1e3 * float(np.median(ts)), "target": 1.0}
    rows.append(
        {
            "path": "uniform windows",
            "GB/s": uni,
            "x memcpy": uni / ref_batch,
            "ms": 1e3 * np.median(ts),
            "target": ">= 1.0",
        }
    )
    table = None
    gc.collect()

    # -- prioritized windows + priority update -------------------------------------------------
    table = gf.LocalTable(spec, sampler=gf.Prioritized(0.6, 0.4), seed=0)
    rng = np.random.default_rng(0)
    for i in range(0, len(eps), per_call):
        chunk = eps[i : i + per_call]
        table.insert(chunk, priorities=rng.random(sum(len(e["reward"]) for e in chunk)) + 0.01)

    def prio_once():
        b = table.sample(B, L, out=out)
        table.update_priorities(b.keys, rng.random(B) + 0.01)

    ts = timeit(prio_once, repeat=args.repeat)
    pri = batch_bytes / float(np.median(ts)) / 1e9

    # -- checkpoint while a sampler runs: the pause it sees, and the total time --------------
    import tempfile
    import threading

    stop = threading.Event()
    lat: list[float] = []

    def sampler():
        while not stop.is_set():
            t = time.perf_counter()
            prio_once()
            lat.append(time.perf_counter() - t)

    th = threading.Thread(target=sampler)
    with tempfile.TemporaryDirectory(dir=args.checkpoint_dir) as d:
        th.start()
        time.sleep(0.2)
        ck = table.checkpoint(f"{d}/ck")
        time.sleep(0.2)
        stop.set()
        th.join()
    results["checkpoint"] = {
        "bytes": ck["bytes"],
        "seconds": ck["seconds"],
        "pause_ms": 1e3 * ck["pause_s"],
        "sampler_max_ms": 1e3 * max(lat),
        "sampler_median_ms": 1e3 * float(np.median(lat)),
        "samples_during": len(lat),
    }
    rows.append(
        {
            "path": "checkpoint (sampler running)",
            "GB/s": ck["bytes"] / ck["seconds"] / 1e9,
            "ms": 1e3 * ck["seconds"],
            "note": f"pause {1e3 * ck['pause_s']:.1f} ms; sampler max {1e3 * max(lat):.1f} ms",
        }
    )
    results["prioritized"] = {"gbps": pri, "ratio": pri / ref_batch, "ms": 1e3 * float(np.median(ts)), "target": 0.8}
    rows.append(
        {
            "path": "prioritized windows + update",
            "GB/s": pri,
            "x memcpy": pri / ref_batch,
            "ms": 1e3 * np.median(ts),
            "target": ">= 0.8",
        }
    )
    table = None
    gc.collect()


def bench_latency(args, eps, rows, results):
    """Prioritized sample+update latency at a large vs a small capacity.

    Two variants: the reference columns (what a learner gets; at 10M steps the
    table holds 10.4 GB) and tiny steps (5 bytes) where selection, not the
    copy, dominates.  Both fill the table completely with the reference
    episodes (reused), and both sample B windows of L steps.  The two
    capacities' tables are both built, then timed in turn.
    """
    B, L = args.batch_size, args.length
    tiny = (gf.ColumnSpec("reward", (), np.float32), gf.ColumnSpec("done", (), np.bool_))
    results["latency"] = {}
    for variant, cols in (("reference", reference_columns()), ("tiny", tiny)):
        if variant == "reference" and args.skip_large_reference:
            continue
        names = [c.name for c in cols]
        src = [{k: e[k] for k in names} for e in eps]
        calls = []  # both tables built, then timed in turn: the VM's drift weighs on both capacities alike
        for cap in (args.small_capacity, args.large_capacity):
            spec = gf.TableSpec(cols, capacity=cap)
            table = gf.LocalTable(spec, sampler=gf.Prioritized(0.6, 0.4), seed=0)
            rng = np.random.default_rng(0)
            per = args.insert_batch
            i = 0
            while table.size + per * args.episode_length <= cap:
                chunk = [src[(i + j) % len(src)] for j in range(per)]
                table.insert(chunk, priorities=rng.random(per * args.episode_length) + 0.01)
                i += per
            out = gf.SampleBuffers(spec, spec.names, B, L)

            def once(table=table, out=out, rng=rng):
                b = table.sample(B, L, out=out)
                table.update_priorities(b.keys, rng.random(B) + 0.01)

            calls.append(once)
        small, large = (float(np.median(ts)) for ts in alternate(calls, repeat=args.repeat * 10))
        table = out = once = calls = None
        gc.collect()
        results["latency"][variant] = {
            "small_capacity": args.small_capacity,
            "large_capacity": args.large_capacity,
            "small_ms": 1e3 * small,
            "large_ms": 1e3 * large,
            "ratio": large / small,
            "target": 1.2 if variant == "reference" else None,
        }
        rows.append(
            {
                "path": f"prioritized latency {args.large_capacity:.0e} vs {args.small_capacity:.0e} ({variant})",
                "ms": 1e3 * large,
                "ratio": large / small,
                "target": "<= 1.2" if variant == "reference" else "(info)",
                "note": f"{1e3 * small:.3g} ms at {args.small_capacity:.0e}",
            }
        )


def _floor_state(n: int, B: int, rng) -> dict:
    """Per-item arrays of ``n`` items with the dtypes a shard keeps, and rows for ``B``, for
    :func:`_floor_once`."""
    return {
        "episode": rng.integers(0, 10_000, n),
        "priority": rng.random(n) + 0.01,
        "reward": rng.standard_normal(n, dtype=np.float32),
        "done": np.zeros(n, np.bool_),
        "active": np.ones(n, np.uint8),
        "touched": np.zeros(n, np.int64),
        "rows": [np.empty(B, np.int64), np.empty(B), np.empty(B, np.float32), np.empty(B, np.bool_)],
    }


def _floor_once(tree, fl: dict, slots, rng) -> None:
    """A prioritized draw and update of ``len(slots)`` items as compiled work only: the sum tree's find, the
    reads a sample makes at each drawn item, the writes an update makes, and the tree's set."""
    from gear_flow.ops import sumtree

    sumtree.find(tree, rng.random(len(slots)) * tree[1], slots)
    _floor_take(slots, fl["episode"], fl["priority"], fl["reward"], fl["done"], *fl["rows"])
    p = rng.random(len(slots)) + 0.01
    _floor_update(slots, p, fl["active"], fl["touched"], fl["priority"])
    sumtree.set_leaves(tree, slots, p**0.6)


@njit(cache=True)
def _floor_take(slots, episode, priority, reward, done, o_ep, o_pr, o_rw, o_dn):
    for i in range(slots.shape[0]):  # independent loads, no prefetch pass first: as the table's take
        s = slots[i]
        o_ep[i], o_pr[i], o_rw[i], o_dn[i] = episode[s], priority[s], reward[s], done[s]


@njit(cache=True)
def _floor_update(slots, new, active, touched, priority):
    for i in range(slots.shape[0]):  # as the table's update does
        s = slots[i]
        if active[s] == 1:
            touched[s] = i
            priority[s] = new[i]


def _row(path: str, ours: float, ref: float, target: str, note: str) -> dict:
    """One printed row of a time (seconds) against its reference's."""
    return {"path": path, "ms": 1e3 * ours, "ratio": ours / ref, "target": target, "note": note}


def bench_fixed_cost(args, rows, results):
    """What one call costs beyond the work inside it, each next to that bare work timed alternately in one run.

    * a uniform sample of B=256 tiny steps (L=1) against ``np.take`` of the same rows from each column;
    * a prioritized sample + update of B=1024 against a bare numba sum tree's draw and update of as many
      leaves (``gear_flow.ops.sumtree``, the table's own kernels without the table), and the same memory
      work as the table's compiled alone (the draw, the reads and writes at each item), against the same;
    * a MaxHeap sample + update of B=256 with every priority equal (the ties broken by stamp) against the
      same with distinct priorities;
    * an insert of 1,024 episodes of 64 reference steps against a single-thread copy of the same bytes
      into a cold destination.
    """
    from gear_flow.keys import decode
    from gear_flow.ops import sumtree

    cap = args.large_capacity
    tiny = (gf.ColumnSpec("reward", (), np.float32), gf.ColumnSpec("done", (), np.bool_))
    rng = np.random.default_rng(0)
    per, T = 100, 1000
    src = [{"reward": rng.standard_normal(T, dtype=np.float32), "done": np.arange(T) == T - 1} for _ in range(per)]
    out = results["fixed_cost"] = {"capacity": cap}

    def filled(sampler, priorities):
        table = gf.LocalTable(gf.TableSpec(tiny, capacity=cap), sampler=sampler, seed=0)
        while table.size + per * T <= cap:
            table.insert(src, priorities=rng.random(per * T) + 0.01 if priorities else None)
        return table

    # -- uniform, B=256, L=1: against np.take of the rows it drew -------------------------------------------
    B = 256
    table = filled(gf.Uniform(), False)
    cols = {c.name: np.random.default_rng(1).integers(0, 2, cap).astype(c.dtype) for c in tiny}
    buf = gf.SampleBuffers(table.spec, table.spec.names, B, 1)
    drawn = [np.zeros(B, dtype=np.int64)]

    def sample_uniform():
        t = time.perf_counter()
        b = table.sample(B, 1, out=buf)
        t = time.perf_counter() - t
        drawn[0] = decode(b.keys.numpy())[1] % cap  # the rows the reference takes next (one shard: slot = seq)
        return t

    def take():
        for a in cols.values():
            np.take(a, drawn[0])

    ts, ref = alternate([sample_uniform, take], repeat=args.repeat * 20)
    ours, bare = float(np.median(ts)), float(np.median(ref))
    out["uniform_tiny"] = {"B": B, "us": 1e6 * ours, "np_take_us": 1e6 * bare, "ratio": ours / bare, "target": 5.0}
    note = f"np.take of both columns {1e6 * bare:.1f} us"
    rows.append(_row(f"uniform sample B={B} L=1, tiny steps, vs np.take", ours, bare, "<= 5", note))
    table = buf = None
    gc.collect()

    # -- prioritized, B=1024: sample + update against the bare sum tree's draw + update ----------------------
    B = 1024
    table = filled(gf.Prioritized(0.6, 0.4), True)
    buf = gf.SampleBuffers(table.spec, table.spec.names, B, 1)
    tree = sumtree.new_tree(cap)
    sumtree.set_leaves(tree, np.arange(cap, dtype=np.int64), (rng.random(cap) + 0.01) ** 0.6)
    slots = np.empty(B, dtype=np.int64)

    def table_once():
        b = table.sample(B, 1, out=buf)
        table.update_priorities(b.keys, rng.random(B) + 0.01)

    def bare_once():
        sumtree.find(tree, rng.random(B) * tree[1], slots)
        sumtree.set_leaves(tree, slots, (rng.random(B) + 0.01) ** 0.6)

    ts, ref = alternate([table_once, bare_once], repeat=args.repeat * 10)
    ours, bare = float(np.median(ts)), float(np.median(ref))
    out["prioritized_update"] = {"B": B, "ms": 1e3 * ours, "bare_ms": 1e3 * bare, "ratio": ours / bare, "target": 1.1}
    note = f"numba find + set_leaves {1e3 * bare:.3f} ms"
    rows.append(_row(f"prioritized sample + update B={B} L=1 vs a bare sum tree", ours, bare, "<= 1.1", note))
    # ... and the same memory work compiled without the table (what bounds that ratio): the draw, the take's
    # reads of each item's episode, priority and two columns, the update's `active`, `touched` and priority
    fl = _floor_state(cap, B, rng)
    _floor_once(tree, fl, slots, rng)

    ts, ref = alternate([lambda: _floor_once(tree, fl, slots, rng), bare_once], repeat=args.repeat * 10)
    floor_ms, bare = float(np.median(ts)), float(np.median(ref))
    out["prioritized_update_floor"] = {"B": B, "ms": 1e3 * floor_ms, "bare_ms": 1e3 * bare, "ratio": floor_ms / bare}
    note = f"numba find + set_leaves {1e3 * bare:.3f} ms"
    rows.append(_row(f"  the same memory work compiled, no table, B={B}", floor_ms, bare, "(info)", note))
    table = buf = tree = fl = None
    gc.collect()

    # -- MaxHeap, B=256: every priority equal against distinct priorities -----------------------------------
    B = 256
    heaps = {"equal": filled(gf.MaxHeap(), False), "distinct": filled(gf.MaxHeap(), True)}
    bufs = {k: gf.SampleBuffers(t.spec, t.spec.names, B, 1) for k, t in heaps.items()}

    def heap_once(kind):
        b = heaps[kind].sample(B, 1, out=bufs[kind])
        heaps[kind].update_priorities(b.keys, 1.0 if kind == "equal" else rng.random(B) + 0.01)

    for kind in heaps:  # (the first batch of many ties moves them into the tree: once, O(N))
        heap_once(kind)
    ts, ref = alternate([lambda: heap_once("equal"), lambda: heap_once("distinct")], repeat=args.repeat * 10)
    ours, bare = float(np.median(ts)), float(np.median(ref))
    out["heap_ties"] = {"B": B, "ms": 1e3 * ours, "distinct_ms": 1e3 * bare, "ratio": ours / bare, "target": 2.0}
    note = f"distinct priorities {1e3 * bare:.3f} ms"
    rows.append(
        _row(f"MaxHeap sample + update B={B}, all priorities equal, vs distinct ones", ours, bare, "<= 2", note)
    )
    heaps = bufs = None
    gc.collect()

    # -- insert 1,024 episodes of 64 reference steps against a cold-destination copy ------------------------
    E, T = args.short_episodes, 64
    pools = [make_episodes(E, T, seed=s) for s in (0, 1)]
    spec = gf.TableSpec(reference_columns(), capacity=4 * E * T)
    table = gf.LocalTable(spec, sampler=gf.Uniform(), seed=0)
    nbytes = E * T * sum(c.nbytes for c in reference_columns())
    k = iter(range(10**9))

    def insert_once():
        table.insert(pools[next(k) % 2])

    for _ in range(4):  # the ring full and wrapping, as in a steady state
        insert_once()

    def against_memcpy(key, fn, path, target, **about):
        ts, ref = alternate(
            [fn, memcpy_step(nbytes, pool_bytes=max(args.memcpy_pool_mb << 20, 4 * nbytes), cold_dst=True)],
            repeat=max(5, args.repeat // 2),
        )
        ours, bare = float(np.median(ts)), float(np.median(ref))
        out[key] = {**about, "gbps": nbytes / ours / 1e9, "memcpy_gbps": nbytes / bare / 1e9, "ratio": bare / ours}
        if target is not None:
            out[key]["target"] = target
        rows.append(
            {
                "path": path,
                "GB/s": nbytes / ours / 1e9,
                "x memcpy": bare / ours,
                "ms": 1e3 * ours,
                "target": "(info)" if target is None else f">= {target}",
            }
        )

    against_memcpy(
        "insert_short_episodes", insert_once, f"insert {E} episodes x {T} steps/call", 0.8, episodes=E, steps=T
    )
    # ... and the same steps as one [B, T] batch (a vectorised collector's insert_batch): no per-episode work
    batches = [{c: np.stack([e[c] for e in pool]) for c in pool[0]} for pool in pools]
    pools = None
    against_memcpy(
        "insert_batch", lambda: table.insert_batch(batches[next(k) % 2]),
        f"insert_batch [{E}, {T}] (one array per column)", None, B=E, T=T,
    )  # fmt: skip
    table = batches = None
    gc.collect()


def bench_torchrl(args, eps, rows, results):
    """TorchRL's buffers on the same workload (skipped if torchrl is not installed)."""
    try:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler, SliceSampler
    except ImportError as e:
        results["torchrl"] = {"skipped": str(e)}
        return
    B, L = args.batch_size, args.length
    steps = sum(len(e["reward"]) for e in eps)
    step_bytes = sum(c.nbytes for c in reference_columns())
    batch_bytes = B * L * step_bytes
    ref_batch = results["memcpy_batch_gbps"]

    def td(i, e):
        n = len(e["reward"])
        return TensorDict(
            {
                "obs": torch.from_numpy(e["obs"]),
                "action": torch.from_numpy(e["action"]),
                "reward": torch.from_numpy(e["reward"]),
                "done": torch.from_numpy(e["done"]),
                "episode": torch.full((n,), i, dtype=torch.int64),
            },
            batch_size=[n],
        )

    out = {}
    makers = {
        "uniform": lambda: SliceSampler(slice_len=L, traj_key="episode", strict_length=True),
        "prioritized": lambda: PrioritizedSliceSampler(
            max_capacity=steps, alpha=0.6, beta=0.4, slice_len=L, traj_key="episode", strict_length=True
        ),
    }
    for name, make in makers.items():
        try:
            sampler = make()
        except Exception as e:  # e.g. torchrl's C++ sum tree missing for this torch build
            out[name] = {"unavailable": f"{type(e).__name__}: {e}"}
            rows.append({"path": f"torchrl {name} windows", "note": f"unavailable: {type(e).__name__}"})
            continue
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(steps), sampler=sampler, batch_size=B * L)
        t0 = time.perf_counter()
        for i, e in enumerate(eps):
            rb.extend(td(i, e))
        ins_s = time.perf_counter() - t0
        rng = np.random.default_rng(0)

        def once(rb=rb, name=name, rng=rng):
            s = rb.sample()
            if name == "prioritized":
                rb.update_priority(s["index"], torch.from_numpy(rng.random(len(s["index"]), dtype=np.float32) + 0.01))

        ts = timeit(once, repeat=max(3, args.repeat // 2))
        g = batch_bytes / float(np.median(ts)) / 1e9
        out[name] = {
            "gbps": g,
            "ratio": g / ref_batch,
            "ms": 1e3 * float(np.median(ts)),
            "insert_gbps": steps * step_bytes / ins_s / 1e9,
        }
        ours = results[name]["gbps"]
        rows.append(
            {
                "path": f"torchrl {name} windows",
                "GB/s": g,
                "x memcpy": g / ref_batch,
                "ms": 1e3 * np.median(ts),
                "note": f"gear_flow is {ours / g:.1f}x",
            }
        )
        del rb
        gc.collect()
    results["torchrl"] = out


def bench_reverb(args, eps, rows, results):
    """DeepMind Reverb on the same workload, in this process (:mod:`reverb_peer`; skipped if dm-reverb is not
    installed: the ``bench`` extra, in an environment of its own, as this module's docstring says).  A server
    per table; memory is the process's resident growth per raw byte while one is written."""
    try:
        import reverb
        import reverb_peer
    except ImportError as e:
        results["reverb"] = {"skipped": str(e)}
        return
    B, L = args.batch_size, args.length
    step_bytes = sum(c.nbytes for c in reference_columns())
    steps = sum(len(e["reward"]) for e in eps)
    batch_bytes = B * L * step_bytes
    ref_batch = results["memcpy_batch_gbps"]
    out: dict = {"items": reverb_peer.windows(eps, L)}
    # its TrajectoryWriter, timed writing the uniform table alone (the tables read below come from its Writer)
    server = reverb.Server(tables=reverb_peer.tables(["uniform"], eps, L))
    t0 = time.perf_counter()
    reverb_peer.write(server.localhost_client(), ["uniform"], eps, L, writer="trajectory")
    out["trajectory_writer_gbps"] = steps * step_bytes / (time.perf_counter() - t0) / 1e9
    server.stop()
    del server
    for name in reverb_peer.SELECTORS:
        gc.collect()
        rss0 = rss_bytes()
        server = reverb.Server(tables=reverb_peer.tables([name], eps, L))
        client = server.localhost_client()
        t0 = time.perf_counter()
        reverb_peer.write(client, [name], eps, L)
        ins_s = time.perf_counter() - t0
        rss1 = rss_bytes()
        once = reverb_peer.reader(f"localhost:{server.port}", name, B, client, np.random.default_rng(0))
        ts = timeit(once, repeat=max(3, args.repeat))
        g = batch_bytes / float(np.median(ts)) / 1e9
        ours = results[name]["gbps"]
        out[name] = {
            "gbps": g,
            "ratio": g / ref_batch,
            "ms": 1e3 * float(np.median(ts)),
            "insert_gbps": steps * step_bytes / ins_s / 1e9,
            "insert_ratio": steps * step_bytes / ins_s / 1e9 / results["insert"]["memcpy_gbps"],
            "rss_per_raw": (rss1 - rss0) / (steps * step_bytes),
        }
        rows.append(
            {
                "path": f"reverb {name} windows",
                "GB/s": g,
                "x memcpy": g / ref_batch,
                "ms": 1e3 * np.median(ts),
                "note": (
                    f"gear_flow is {ours / g:.1f}x; insert {out[name]['insert_gbps']:.3f} GB/s "
                    f"(TrajectoryWriter {out['trajectory_writer_gbps']:.4f}); "
                    f"memory {out[name]['rss_per_raw']:.2f}x raw"
                ),
            }
        )
        del once, client
        server.stop()
        del server
        gc.collect()
    results["reverb"] = out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    reference_options(p)
    p.add_argument("--insert-batch", type=int, default=10, help="episodes per insert call")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--small-capacity", type=int, default=100_000)
    p.add_argument("--large-capacity", type=int, default=10_000_000)
    p.add_argument("--skip-large-reference", action="store_true", help="skip the 10 GB reference-column latency run")
    p.add_argument("--short-episodes", type=int, default=1024, help="episodes of 64 steps per insert call")
    p.add_argument("--no-peers", action="store_true", help="skip TorchRL and Reverb")
    p.add_argument("--checkpoint-dir", default=None, help="where the checkpoint test writes (default: system temp)")
    p.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    p.add_argument(
        "--memcpy-pool-mb", type=int, default=256, help="MiB the memcpy references copy from (larger than the caches)"
    )
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/bench_local.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.episode_length, args.repeat = 20, 200, 5
        args.small_capacity, args.large_capacity = 10_000, 200_000
        args.insert_batch = 5
        args.short_episodes = 64
        # what --quick checks is that every path runs and reports, not how fast: a pool this small may sit in
        # the caches, but making 256 MiB of random bytes costs a second per reference (4x the 17 MB batch)
        args.memcpy_pool_mb = 64
    eps = make_episodes(args.episodes, args.episode_length)
    rows: list[dict] = []
    # the versions measured with (the peers need their own environment: NumPy 1.x beside Reverb)
    peers = ("torchrl", "tensordict", "dm-reverb", "tensorflow-cpu")
    results: dict = {"args": vars(args), "packages": packages(("numpy", "numba", "torch", *peers))}
    bench_gear_flow(args, eps, rows, results)
    bench_latency(args, eps, rows, results)
    bench_fixed_cost(args, rows, results)
    if not args.no_peers:
        bench_torchrl(args, eps, rows, results)
        bench_reverb(args, eps, rows, results)
    print_table(rows, ["path", "GB/s", "x memcpy", "ms", "ratio", "target", "note"])
    path = write_json("bench_local", results, args.out)
    print(f"\nwrote {path}")
    return results


if __name__ == "__main__":
    main()
