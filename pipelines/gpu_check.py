"""GPU check: kernel parity tests and device benchmarks, in one run on one GPU.

    python pipelines/gpu_check.py [--out benchmarks/results/gpu_check.json] [--quick] [--skip-tests]

Sized for at most 8 minutes on an H200 (``--quick``: about 2).  Sections, each
recorded in the JSON as ``{"status": "ok" | "failed" | "skipped", ...}`` and
none able to stop the others:

``tests``
    ``pytest -m gpu`` over tests/test_gpu*.py (kernel/twin parity, GPU tiers,
    LocalTable end to end), in a subprocess; pass/fail counts.
``gather_device`` / ``gather_pinned``
    Window gather of the reference workload (200 episodes x 1000 steps; obs
    float32[256], action int64, reward float32, done bool; B=256 windows of
    L=64) from the ``device`` / ``pinned`` tier into device buffers, against a
    device-to-device / pinned host-to-device copy of the same bytes measured
    in the same run, kernel-only per column (``kernel``, ``ratio``) and fused
    (``kernel_fused``, ``ratio_fused``: one launch a take, what tables use).
    Target: ``ratio_fused`` >= 0.7 (DESIGN.md).
``pinned_shared`` / ``insert_device`` / ``insert_pinned``
    The pinned tier's page-locked shared segment read by a reader's own GPU
    (this process and a spawned one), and collection bandwidth at B=1024
    trajectories; see pipelines/gpu_data_plane.py.
``sumtree``
    Prioritized sampling of B=1024 from N=10M priorities and the update of
    B=1024 priorities (latency, ms), top-k k=1024 of the 10M, and a parity
    check of the 10M-leaf draw against the CPU twin on the same uniforms.
``table_device`` / ``table_pinned``
    LocalTable on the GPU tiers, reference workload, batches as CUDA tensors.
``dask_cuda``
    Only when dask_cuda is importable (skipped, saying so, otherwise): a LocalCUDACluster (one
    worker, RMM pool, gear_flow's preload) and a DistributedTable on each GPU tier: the reference
    episodes in, B windows of L out to this process, every value compared exactly.  In a child
    process, killed with its workers past 4 minutes.

Timing uses CUDA events (median of repeats after warm-up); wall-clock times
include the host overhead a learner would see.  Runs without Dask installed:
gear_flow falls back to its YAML defaults (gear_flow/config.py).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # gear_flow from this checkout, installed or not
sys.path.insert(0, str(ROOT / "pipelines"))

from common import REFERENCE, machine, print_table, write_json  # noqa: E402
from gpu_data_plane import GEAR_COLLECTION_GBPS, bench_insert, check_pinned_shared  # noqa: E402

COLUMNS = (("obs", (256,), np.float32), ("action", (), np.int64), ("reward", (), np.float32), ("done", (), np.bool_))
TARGET_RATIO = 0.7
#: a table's steady state on the device: a LocalTable sample of the reference batch (GB/s), a prioritized
#: sample + update of B=1024 from 10M (ms), a [B, T] host batch's insert against pageable H2D copies
TABLE_SAMPLE_GBPS, TABLE_SELECTION_MS, COLLECTION_HOST_RATIO = 100.0, 0.3, 0.8


class Report:
    """Sections of the run; a failing section records its error and the run goes on."""

    def __init__(self, partial: str | None = None):
        self.sections: dict[str, dict] = {}
        self.partial = partial  # written after every section: a run cut short keeps what it measured

    def run(self, name: str, fn, *args, **kw) -> None:
        t = time.perf_counter()
        try:
            res = fn(*args, **kw)
            res = {"status": "ok", **(res or {})} if not (res or {}).get("status") else res
        except Exception as e:  # recorded, never fatal
            res = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        res["seconds"] = round(time.perf_counter() - t, 2)
        self.sections[name] = res
        if self.partial:
            write_json("gpu_check", {"partial": True, "sections": self.sections, "host": machine()}, self.partial)
        why = res.get("error") or res.get("reason") or ""
        print(
            f"[{name}] {res['status']} ({res['seconds']} s)" + (f": {why}" if res["status"] != "ok" else ""), flush=True
        )


# -- timing ---------------------------------------------------------------------------------------


def event_ms(cp, fn, reps: int, warmup: int = 3) -> dict:
    """Median CUDA-event time (ms) of ``fn`` on the current stream, and median wall time incl. sync."""
    for _ in range(warmup):
        fn()
    cp.cuda.get_current_stream().synchronize()
    ev, wall = [], []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        t = time.perf_counter()
        a.record()
        fn()
        b.record()
        b.synchronize()
        wall.append((time.perf_counter() - t) * 1e3)
        ev.append(cp.cuda.get_elapsed_time(a, b))
    return {"event_ms": float(np.median(ev)), "wall_ms": float(np.median(wall)), "event_ms_min": float(np.min(ev))}


# -- sections --------------------------------------------------------------------------------------


def run_tests(timeout: int) -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"status": "skipped", "reason": "pytest is not importable"}
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_gpu*.py"))
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra", *files]
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, rc = res.stdout + res.stderr, res.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (
            (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""),
            "timeout",
        )
    counts = {
        k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected)", out)
    }
    failed = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    ok = rc == 0 or (rc == 5 and not failed)
    return {"status": "ok" if ok else "failed", "returncode": rc, "counts": counts, "failures": failed[:40],
            "tail": out[-4000:]}  # fmt: skip


def _reference_rings(cp, tier, cap: int):
    """Column rings of the reference workload in ``tier``, filled with random bytes."""
    rings, views = {}, {}
    for name, shape, dtype in COLUMNS:
        ring = tier.empty((cap, *shape), dtype)
        nb = ring.reshape(cap, -1).view(np.uint8).shape[1]
        noise = cp.random.randint(0, 256, (cap, nb), dtype=np.uint8)
        if isinstance(ring, np.ndarray):  # pinned: fill through a device-to-host copy
            noise.get(out=ring.reshape(cap, -1).view(np.uint8))
        else:
            ring.reshape(cap, -1).view(np.uint8)[...] = noise
        rings[name] = ring
        views[name] = ring.reshape(cap, -1).view(np.uint8)
    return rings, views


def _window_sets(n_sets: int, B: int, L: int, episodes: int, T: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_sets):
        e = rng.integers(0, episodes, B)
        t = rng.integers(0, T - L + 1, B)
        out.append(((e * T + t).astype(np.int64), np.zeros(B, np.int64), np.full(B, L, np.int64)))
    return out


def graph_ms(cp, fns, reps: int) -> dict:
    """Median time (ms) of running ``fns`` in order, captured once into a CUDA graph and replayed.

    Graph replay removes the host's launch overhead from the GPU timeline, so
    this measures the kernels themselves.  Falls back to back-to-back launches
    when capture is not possible (recorded in ``method``).
    """
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for f in fns:  # warm-up (and first-use compilation) outside the capture
            f()
        stream.synchronize()
        try:
            stream.begin_capture()
            try:
                for f in fns:
                    f()
            finally:
                graph = stream.end_capture()
            run, method = (lambda: graph.launch(stream)), "cuda graph"
        except Exception as e:
            run, method = (
                (lambda: [f() for f in fns]),
                f"back-to-back launches (capture failed: {type(e).__name__}: {e})",
            )
        res = event_ms(cp, run, reps)
    res["method"] = method
    return res


def bench_gather(tier_name: str, reps: int) -> dict:
    """Gather kernels vs a copy of the same bytes (same run): kernel-only (CUDA graphs) and per take via the tier API.

    Kernel-only, two ways: ``kernel`` launches ``gather_windows`` once per
    column (4 launches a take), ``kernel_fused`` launches ``gather_columns``
    once a take (what tables use: ``StorageTier.gather_columns``).  The
    target applies to the fused ratio.
    """
    import cupy as cp

    from gear_flow.gpu.ops import gather as gops
    from gear_flow.gpu.tiers import DeviceTier, PinnedTier
    from gear_flow.ops.gather import gather_windows as twin

    tier = {"device": DeviceTier, "pinned": PinnedTier}[tier_name]()
    E, T, B, L = REFERENCE["episodes"], REFERENCE["episode_length"], REFERENCE["batch_size"], REFERENCE["length"]
    cap = E * T
    _, views = _reference_rings(cp, tier, cap)
    outs = {n: tier.empty_output((B, L, v.shape[1])) for n, v in views.items()}
    K = 16  # takes per measurement, each with its own random windows (the ring is far larger than L2)
    sets = _window_sets(K, B, L, E, T)
    batch_bytes = B * L * sum(v.shape[1] for v in views.values())
    obs_bytes = B * L * views["obs"].shape[1]

    # correctness on this data: one take against the CPU twin, per column and fused
    s, d, n = sets[0]
    refs = {}
    for name, v in views.items():
        refs[name] = np.empty((B, L, v.shape[1]), np.uint8)
        twin(cp.asnumpy(v) if isinstance(v, cp.ndarray) else v, s, d, n, refs[name])
    parity_windows = parity_fused = True
    for name, v in views.items():
        tier.gather_windows(v, s, d, n, outs[name])
        parity_windows &= bool(np.array_equal(cp.asnumpy(outs[name]), refs[name]))
    for o in outs.values():
        o[...] = 0
    tier.gather_columns(views, s, d, n, outs)
    tier.synchronize()
    for name in views:
        parity_fused &= bool(np.array_equal(cp.asnumpy(outs[name]), refs[name]))
    parity = parity_windows and parity_fused

    # the reference: one contiguous copy of the same bytes out of the ring, per take
    dst = cp.empty(batch_bytes, dtype=np.uint8)
    src = views["obs"]
    src_ptr = int(src.data.ptr) if isinstance(src, cp.ndarray) else int(src.ctypes.data)
    ring_bytes = src.shape[0] * src.shape[1]
    offsets = [int(o) // 256 * 256 for o in np.random.default_rng(1).integers(0, ring_bytes - batch_bytes, K)]
    kind = cp.cuda.runtime.memcpyDefault

    def copier(off: int, nbytes: int):
        return lambda: cp.cuda.runtime.memcpyAsync(
            int(dst.data.ptr), src_ptr + off, nbytes, kind, cp.cuda.get_current_stream().ptr
        )

    # kernel only: windows (and the fused launch's descriptors) already on the device, K takes in one graph
    wins = [gops.upload_windows(*w) for w in sets]
    names = list(views)
    k_all = graph_ms(cp, [gops.launcher(views[nm], outs[nm], w) for w in wins for nm in names], reps)
    k_fused = graph_ms(
        cp, [gops.columns_launcher([views[nm] for nm in names], [outs[nm] for nm in names], w) for w in wins], reps
    )
    k_obs = graph_ms(cp, [gops.launcher(views["obs"], outs["obs"], w) for w in wins], reps)
    c_all = graph_ms(cp, [copier(o, batch_bytes) for o in offsets], reps)
    c_obs = graph_ms(cp, [copier(o, obs_bytes) for o in offsets], reps)

    # per take through the tier API, host overhead included (one upload of descriptors and windows, one launch)
    it = iter(range(1 << 30))

    def take():
        s, d, n = sets[next(it) % K]
        tier.gather_columns(views, s, d, n, outs)

    def take_per_column():
        s, d, n = sets[next(it) % K]
        for name, v in views.items():
            tier.gather_windows(v, s, d, n, outs[name])

    tk = event_ms(cp, take, reps)
    tk_cols = event_ms(cp, take_per_column, reps)
    c1 = event_ms(cp, copier(offsets[0], batch_bytes), reps)
    ratio = c_all["event_ms"] / k_all["event_ms"]
    ratio_fused = c_all["event_ms"] / k_fused["event_ms"]
    why = f"gathered bytes differ from the CPU twin (per column ok: {parity_windows}, fused ok: {parity_fused})"
    return {
        "status": "ok" if parity else "failed",
        "error": None if parity else why,
        "parity_with_twin": parity,
        "parity_per_column": parity_windows,
        "parity_fused": parity_fused,
        "reference": "device-to-device copy" if tier_name == "device" else "pinned host-to-device copy",
        "batch_bytes": batch_bytes,
        "takes_per_graph": K,
        "kernel": {
            "gather": k_all,
            "copy": c_all,
            "ms_per_take": k_all["event_ms"] / K,
            "launches_per_take": len(names),
        },
        "kernel_fused": {
            "gather": k_fused,
            "copy": c_all,
            "ms_per_take": k_fused["event_ms"] / K,
            "launches_per_take": len(
                gops.column_table([views[nm] for nm in names], [outs[nm] for nm in names]).launches
            ),
        },
        "gather_gbps": batch_bytes * K / k_all["event_ms"] / 1e6,
        "gather_fused_gbps": batch_bytes * K / k_fused["event_ms"] / 1e6,
        "copy_gbps": batch_bytes * K / c_all["event_ms"] / 1e6,
        "ratio": ratio,
        "ratio_fused": ratio_fused,
        "meets_target": ratio_fused >= TARGET_RATIO,
        "obs_only": {"gather": k_obs, "copy": c_obs, "ratio": c_obs["event_ms"] / k_obs["event_ms"]},
        "take": {
            "gather": tk,
            "gather_per_column": tk_cols,
            "copy": c1,
            "ratio_event": c1["event_ms"] / tk["event_ms"],
            "ratio_wall": c1["wall_ms"] / tk["wall_ms"],
            "ratio_event_per_column": c1["event_ms"] / tk_cols["event_ms"],
        },  # fmt: skip
    }


def bench_sumtree(N: int, B: int, reps: int) -> dict:
    import cupy as cp

    from gear_flow.gpu.ops import maxtree as gmax
    from gear_flow.gpu.ops import sumtree as gsum
    from gear_flow.ops import sumtree as csum

    tree = gsum.new_tree(N)
    P = tree.shape[0] // 2
    tree[P : P + N] = cp.random.random(N) ** 0.6  # priorities ** alpha
    gsum.rebuild(tree)
    out, w = cp.empty(B, np.int64), cp.empty(B, np.float64)
    scratch = gsum.new_scratch(tree)

    def sample():
        gsum.sample(tree, cp.random.random(B), out, w)

    idx = cp.random.randint(0, N, B, dtype=np.int64)
    vals = cp.random.random(B)

    def update():
        gsum.set_leaves(tree, idx, vals, scratch=scratch)

    def update_no_scratch():
        gsum.set_leaves(tree, idx, vals)

    def sample_host_roundtrip():  # what a host-side caller sees: uniforms up, indices back
        gsum.sample(tree, np.random.random(B), out, w)
        out.get()

    res = {
        "N": N,
        "B": B,
        "sample": event_ms(cp, sample, reps),
        "sample_to_host": event_ms(cp, sample_host_roundtrip, reps),
        "update": event_ms(cp, update, reps),
        "update_without_scratch": event_ms(cp, update_no_scratch, reps),
    }
    # top-k over a flat 10M priority array (a max tree's leaves)
    leaves = tree[P : P + N].copy()
    ki, kv = cp.empty(B, np.int64), cp.empty(B, np.float64)
    res["topk"] = event_ms(cp, lambda: gmax.topk_flat(leaves, B, ki, kv), max(3, reps // 3))
    # parity at full size: the same uniforms through the CPU twin
    u = cp.random.random(B)
    gsum.sample(tree, u, out, w)
    host_tree = cp.asnumpy(tree)
    ref = np.empty(B, np.int64)
    csum.find(host_tree, cp.asnumpy(u) * host_tree[1], ref)
    res["parity_with_twin"] = bool(np.array_equal(cp.asnumpy(out), ref))
    order = np.lexsort((np.arange(N), -host_tree[P : P + N]))[:B]
    res["topk_parity"] = bool(np.array_equal(cp.asnumpy(ki), order))
    ok = res["parity_with_twin"] and res["topk_parity"]
    res["status"] = "ok" if ok else "failed"
    if not ok:
        res["error"] = "device results differ from the CPU twin at full size"
    return res


def bench_table(tier: str, reps: int) -> dict:
    import cupy as cp
    import torch
    from common import make_episodes

    from gear_flow import ColumnSpec, LocalTable, TableSpec

    E, T, B, L = REFERENCE["episodes"], REFERENCE["episode_length"], REFERENCE["batch_size"], REFERENCE["length"]
    spec = TableSpec(tuple(ColumnSpec(n, s, d) for n, s, d in COLUMNS), capacity=E * T, num_shards=1)
    table = LocalTable(spec, tier=tier, seed=0)
    eps = make_episodes(E, T)
    t = time.perf_counter()
    for i in range(0, E, 20):
        table.insert(eps[i : i + 20])
    insert_s = time.perf_counter() - t
    from gear_flow.sample import SampleBuffers

    buf = SampleBuffers(spec, spec.names, B, L, tier=tier)
    batch = table.sample(B, L, out=buf)
    on_cuda = {k: bool(v.is_cuda) for k, v in batch.data.items()}
    if not all(on_cuda.values()):
        return {"status": "failed", "error": f"batch tensors not on the GPU: {on_cuda}"}

    def one():
        b = table.sample(B, L, out=buf)
        b["obs"].sum()  # a learner kernel reading the batch, on torch's stream

    for _ in range(3):
        one()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        one()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    nbytes = B * L * sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for _, s, d in COLUMNS)
    med = float(np.median(ts))
    gbps = nbytes / med / 1e9
    return {"insert_seconds": insert_s, "sample_ms": med * 1e3, "gbps": gbps, "batch_bytes": nbytes,
            "tensors_on_cuda": on_cuda, "cupy": cp.__version__, "target_gbps": TABLE_SAMPLE_GBPS,
            "meets_target": gbps >= TABLE_SAMPLE_GBPS}  # fmt: skip


def bench_table_selection(reps: int) -> dict:
    """Prioritized sample + priority update of B=1024 through a table, device tier vs host tier.

    What ``bench_sumtree`` measures on the bare kernels, through
    :class:`~gear_flow.LocalTable` (one shard, Prioritized(0.6), one float32
    column): ``sample(B, 1)`` of single-step windows then ``update_priorities``
    of the sampled keys, median wall ms per iteration (the device synchronised
    at the end of each, so the update's kernel is included).  N = 50 x the
    reference steps (10M at 200 x 1000; smaller when REFERENCE is shrunk, as
    the emulated test does), B = 1024.  Target on the device: <= 0.3 ms.  Both
    tables get the same seed and inserts, so their first batch must have the
    same keys and probabilities (``parity_with_host``).
    """
    import cupy as cp

    from gear_flow import ColumnSpec, LocalTable, Prioritized, TableSpec
    from gear_flow.sample import SampleBuffers

    N = 50 * REFERENCE["episodes"] * REFERENCE["episode_length"]
    B = 1024
    T = max(1, N // 1000)  # 1000 episodes
    N = T * (N // T)
    spec = TableSpec((ColumnSpec("x", (), np.float32),), capacity=N, num_shards=1)
    rng = np.random.default_rng(0)
    sync_device = getattr(cp.cuda.runtime, "deviceSynchronize", lambda: None)  # the emulation runs synchronously
    tables, insert_s = {}, {}
    for tier in ("device", "host"):
        table = LocalTable(spec, sampler=Prioritized(0.6, 0.4), tier=tier, seed=0, boundary="pad_tail")
        t0 = time.perf_counter()
        per_call = max(1, (1 << 20) // T)  # about 1M steps per insert call
        for e0 in range(0, N // T, per_call):
            n_ep = min(per_call, N // T - e0)
            x = np.arange(e0 * T, (e0 + n_ep) * T, dtype=np.float32)
            eps = [{"x": x[i * T : (i + 1) * T]} for i in range(n_ep)]
            table.insert(eps, priorities=np.random.default_rng(e0).random(n_ep * T) + 0.01)
        sync_device()
        insert_s[tier] = time.perf_counter() - t0
        tables[tier] = table
    res = {"N": N, "B": B, "insert_seconds": insert_s}
    first = {}
    for tier, table in tables.items():
        buf = SampleBuffers(spec, ["x"], B, 1, tier=tier)
        upd = rng.random(B) + 0.01

        def one(table=table, buf=buf, upd=upd):
            b = table.sample(B, 1, out=buf)
            table.update_priorities(b.keys, upd)
            return b

        b = one()
        first[tier] = (b.keys.cpu().numpy().copy(), b.probabilities.cpu().numpy().copy())
        for _ in range(3):
            one()
        sync_device()
        ts, ts_sample = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            b = table.sample(B, 1, out=buf)
            t1 = time.perf_counter()
            table.update_priorities(b.keys, upd)
            sync_device()
            t2 = time.perf_counter()
            ts.append(t2 - t0)
            ts_sample.append(t1 - t0)
        res[tier] = {"sample_and_update_ms": float(np.median(ts)) * 1e3, "sample_ms": float(np.median(ts_sample)) * 1e3}
    res["parity_with_host"] = bool(
        np.array_equal(first["device"][0], first["host"][0]) and np.array_equal(first["device"][1], first["host"][1])
    )
    dev_ms = res["device"]["sample_and_update_ms"]
    res["host_over_device"] = res["host"]["sample_and_update_ms"] / dev_ms if dev_ms > 0 else None
    res["target_ms"] = TABLE_SELECTION_MS
    res["meets_target"] = dev_ms <= TABLE_SELECTION_MS
    if not res["parity_with_host"]:
        res["status"] = "failed"
        res["error"] = "the device-tier table drew other keys than the host-tier table with the same seed"
    return res


#: dask_cuda section: seconds for the whole section (a child process, killed with its workers past it),
#: for the cluster to start, and for any one call on it; and the RMM pool per worker
DASK_CUDA_SECONDS, DASK_CUDA_START_SECONDS, DASK_CUDA_CALL_SECONDS, DASK_CUDA_POOL = 240, 120, 60, "8GB"
_DASK_CUDA_MARK = "GPU_CHECK_DASK_CUDA "


def check_dask_cuda(timeout: float = DASK_CUDA_SECONDS) -> dict:
    """A ``LocalCUDACluster`` (one worker on this GPU, loopback, RMM pool when rmm imports) started by
    :func:`gear_flow.deploy.local.local_cuda_cluster` with gear_flow's preload; on it a ``DistributedTable``
    per GPU tier (``device``, ``pinned``): the reference episodes inserted, B windows of L sampled to this
    client and checked exactly against what was inserted, with timings.

    Runs in a child process of its own session, so that nothing can hang this run: past ``timeout``
    the child and its worker processes are killed and the section fails saying how far it got.
    """
    import json
    import os
    import signal

    try:
        import dask_cuda  # noqa: F401
        import distributed  # noqa: F401
    except ImportError as e:
        return {"status": "skipped", "reason": f"dask_cuda is not importable ({e})"}
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'pipelines')!r}); import gpu_check; gpu_check._dask_cuda_child()"
    )
    # gear_flow from this checkout in the child and in the worker processes it starts (it need not be installed)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the child, its nannies and workers: one session
        out, err = p.communicate()
        timed_out = True
    finally:
        try:  # whatever is left of the child's session (worker processes of a cluster that never closed)
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    res = next((json.loads(ln[len(_DASK_CUDA_MARK) :]) for ln in reversed(out.splitlines())
                if ln.startswith(_DASK_CUDA_MARK)), None)  # fmt: skip
    steps = [ln for ln in err.splitlines() if ln.startswith("STEP ")]
    if res is None:
        why = f"timed out after {timeout:g} s" if timed_out else f"the child exited with {p.returncode}"
        return {"status": "failed", "error": f"{why} during {steps[-1][5:] if steps else 'import'}",
                "steps": steps, "stderr_tail": err[-3000:]}  # fmt: skip
    res["steps"] = steps
    if res.get("status") == "failed":
        res["stderr_tail"] = err[-3000:]
    return res


def _dask_cuda_child() -> None:
    """The body of :func:`check_dask_cuda`, in its child process: prints one JSON line (``_DASK_CUDA_MARK``)."""
    import json
    import os
    import threading

    def step(name: str) -> None:
        print(f"STEP {name}", file=sys.stderr, flush=True)

    def bounded(what: str, fn, /, *args, seconds: float = DASK_CUDA_CALL_SECONDS, **kw):
        """``fn(*args, **kw)`` in a thread of its own, or TimeoutError after ``seconds`` (the call is
        abandoned, the run goes on: a later call never waits behind it)."""
        step(what)
        box: dict = {}

        def run():
            try:
                box["value"] = fn(*args, **kw)
            except BaseException as e:  # handed to the caller
                box["error"] = e

        th = threading.Thread(target=run, name=f"gpu-check {what}", daemon=True)
        th.start()
        th.join(seconds)
        if th.is_alive():
            raise TimeoutError(f"{what}: no answer in {seconds} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    res: dict = {"status": "ok"}
    cluster = client = None
    try:
        from dask.utils import parse_bytes
        from distributed import Client

        from gear_flow.deploy.local import local_cuda_cluster
        from gear_flow.distributed.gpu_memory import PLUGIN_NAME as GPU_MEMORY
        from gear_flow.distributed.gpu_memory import GpuMemory, describe
        from gear_flow.distributed.plugin import PLUGIN_NAME as PLUGIN_NAME_WORKER

        try:
            import rmm  # noqa: F401

            rmm_pool = DASK_CUDA_POOL
        except ImportError as e:
            rmm_pool, res["rmm"] = None, f"no RMM pool: rmm is not importable ({e})"
        t = time.perf_counter()
        cluster = bounded("cluster start", local_cuda_cluster, n_workers=1, rmm_pool_size=rmm_pool, no_dashboard=True,
                          seconds=DASK_CUDA_START_SECONDS)  # fmt: skip
        client = bounded("client", Client, cluster, timeout="60s")
        res["cluster_start_seconds"] = round(time.perf_counter() - t, 2)
        res["rmm_pool_size"] = rmm_pool
        res["worker_plugins"] = bounded("plugins", client.run, lambda dask_worker: sorted(dask_worker.plugins))
        problems = [f"{w}: no gear_flow worker plugin (preload)" for w, names in res["worker_plugins"].items()
                    if PLUGIN_NAME_WORKER not in names]  # fmt: skip
        res["memory"] = bounded("memory", client.run, describe)
        if rmm_pool is not None:  # dask-cuda made the pool; gear_flow's plugin must find it and leave it alone
            want = int(parse_bytes(rmm_pool))
            problems += [f"{w}: RMM pool {m.get('pool_bytes')} bytes, CuPy on RMM {m.get('cupy_on_rmm')} (expected "
                         f"{want}, True)" for w, m in res["memory"].items()
                         if m.get("pool_bytes") != want or m.get("cupy_on_rmm") is not True]  # fmt: skip
            bounded("gpu memory plugin", client.register_plugin, GpuMemory(pool_size=rmm_pool))
            res["gpu_memory_plugin"] = bounded(
                "gpu memory status", client.run, lambda dask_worker: dask_worker.plugins[GPU_MEMORY].status
            )
            problems += [f"{w}: GpuMemory {st}, expected by='existing' and the same pool"
                         for w, st in res["gpu_memory_plugin"].items()
                         if st.get("by") != "existing" or st.get("pool_bytes") != want]  # fmt: skip
        res["setup_problems"] = problems
        res["tiers"] = {}
        import dask

        for tier, shared in (("device", True), ("pinned", True), ("pinned", False)):
            key = tier if shared else f"{tier} (shared memory off: the comm path)"
            try:
                with dask.config.set({"gear-flow.distributed.shared-memory": shared}):
                    res["tiers"][key] = _dask_cuda_table(client, tier, bounded)
            except Exception as e:  # recorded; the other tier still runs
                res["tiers"][key] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                                      "traceback": traceback.format_exc()[-2000:]}  # fmt: skip
        bad = [f"{k}: {v.get('error')}" for k, v in res["tiers"].items() if v.get("status") != "ok"]
        if bad or problems:
            res["status"], res["error"] = "failed", "; ".join(bad + problems)
    except Exception as e:
        res.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
    finally:
        for name, closer in (("client close", client), ("cluster close", cluster)):
            if closer is not None:
                try:
                    bounded(name, closer.close, seconds=30)
                except Exception as e:
                    res.setdefault("close_errors", []).append(f"{name}: {type(e).__name__}: {e}")
    print(_DASK_CUDA_MARK + json.dumps(res, default=str), flush=True)
    sys.stderr.flush()
    os._exit(0)  # an abandoned call (or Dask's threads) must not keep this process alive; the parent reaps the rest


def _dask_cuda_table(client, tier: str, bounded) -> dict:
    """Insert the reference episodes into a DistributedTable on ``tier``, sample, check every value exactly."""
    from common import make_episodes

    from gear_flow import ColumnSpec, TableSpec
    from gear_flow.distributed import DistributedTable

    E, T, B, L = REFERENCE["episodes"], REFERENCE["episode_length"], REFERENCE["batch_size"], REFERENCE["length"]
    spec = TableSpec(tuple(ColumnSpec(n, s, d) for n, s, d in COLUMNS), capacity=E * T, num_shards=1)
    eps = make_episodes(E, T, seed=7)
    for e, ep in enumerate(eps):  # obs[:, 0] says which step it is: every sampled window is checkable
        ep["obs"][:, 0] = np.arange(e * T, (e + 1) * T, dtype=np.float32)  # exact in float32 (< 2**24)
    step_bytes = sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for _, s, d in COLUMNS)
    out: dict = {"status": "ok"}
    table = bounded(f"{tier}: create", DistributedTable.create, client, spec, name=f"gpu-check-{tier}", tier=tier,
                    seed=0)  # fmt: skip
    try:
        t = time.perf_counter()
        for i in range(0, E, 20):
            bounded(f"{tier}: insert {i}", table.insert, eps[i : i + 20])
        dt = time.perf_counter() - t
        out.update(insert_seconds=round(dt, 3), insert_gbps=E * T * step_bytes / dt / 1e9)
        batch = bounded(f"{tier}: sample", table.sample, B, L, timeout=DASK_CUDA_CALL_SECONDS)
        out["devices"] = {k: str(v.device) for k, v in batch.data.items()}
        out["devices"].update({k: str(getattr(batch, k).device) for k in ("keys", "probabilities", "mask")})
        cols = {k: v.cpu().numpy() for k, v in batch.data.items()}
        first = cols["obs"][:, 0, 0].astype(np.int64)
        e, s0 = first // T, first % T
        problems = []
        if not (np.all((0 <= e) & (e < E)) and np.all(s0 <= T - L)):
            problems.append("windows outside the inserted episodes")
        else:
            for name in cols:
                want = np.stack([eps[ei][name][si : si + L] for ei, si in zip(e, s0)])
                if not np.array_equal(cols[name], want):
                    problems.append(
                        f"{name}: {int((cols[name] != want).reshape(B, -1).any(1).sum())} of {B} windows differ"
                    )
        ts = batch.timesteps.cpu().numpy() if batch.timesteps is not None else None
        out["timesteps_match"] = None if ts is None else bool(np.array_equal(ts, s0))
        out["exact"] = not problems
        if problems:
            out.update(status="failed", error="sampled values differ from the inserted ones: " + "; ".join(problems))
        times = []
        for r in range(10):
            t = time.perf_counter()
            bounded(f"{tier}: sample {r}", table.sample, B, L, timeout=DASK_CUDA_CALL_SECONDS)
            times.append(time.perf_counter() - t)
        med = float(np.median(times))
        out.update(sample_ms=med * 1e3, sample_gbps=B * L * step_bytes / med / 1e9, batch_bytes=B * L * step_bytes)
        out["client_stats"] = {k: v for k, v in table.stats.items() if isinstance(v, (int, float))}
        # a co-located learner: a task on the worker samples into (device) buffers of its own
        fut = client.submit(_colocated_learner(), table.name, B, L, tier, pure=False)
        co = bounded(f"{tier}: co-located learner", fut.result, timeout=DASK_CUDA_CALL_SECONDS)
        out["colocated"] = co
        # its batch is where this client's is (CUDA tensors on a GPU; the emulation's are host tensors)
        # (its bytes: its own worker's shard in-process, "local_bytes", when the shard is there)
        moved = sum(co.get(k, 0) for k in ("local_bytes", "shared_bytes", "remote_bytes"))
        if co.get("on_cuda") != out["devices"]["obs"].startswith("cuda") or moved <= 0:
            out.update(status="failed", error=f"co-located learner: {co}")
    finally:
        bounded(f"{tier}: close", table.close, seconds=30)
    return out


def _colocated_learner():
    """The learner task (a closure, so that it travels by value: workers cannot import this script)."""

    def learner(name: str, B: int, L: int, tier: str) -> dict:
        import time

        import numpy as np

        from gear_flow.distributed import DistributedTable
        from gear_flow.sample import SampleBuffers

        t = DistributedTable.attach(name, seed=3)
        out = SampleBuffers(t.spec, t.spec.names, B, L, tier=tier)
        b = t.sample(B, L, out=out)
        on_cuda = all(v.is_cuda for v in b.data.values())
        ts = []
        for _ in range(10):
            a = time.perf_counter()
            b = t.sample(B, L, out=out)
            float(b["obs"].sum())  # the learner reads the batch (waits for the gather)
            ts.append(time.perf_counter() - a)
        return {"on_cuda": on_cuda, "sample_ms": 1e3 * float(np.median(ts)), **dict(t.stats)}

    return learner


def device_info() -> dict:
    import cupy as cp

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    info = {
        "name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "compute_capability": dev.compute_capability,
        "multiprocessors": props["multiProcessorCount"],
        "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
        "cupy": cp.__version__,
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "driver": cp.cuda.runtime.driverGetVersion(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    ap.add_argument("--quick", action="store_true", help="fewer repeats, 1M priorities instead of 10M")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--test-timeout", type=int, default=300)
    args = ap.parse_args(argv)
    reps = 10 if args.quick else 50
    t0 = time.perf_counter()
    rep = Report(partial=str(args.out) + ".partial")
    try:
        from gear_flow import backend

        have_gpu = backend.gpu_available()
    except Exception as e:
        have_gpu = False
        rep.sections["import"] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    if have_gpu:
        rep.run("device", lambda: {"info": device_info()})
    if args.skip_tests:
        rep.sections["tests"] = {"status": "skipped", "reason": "--skip-tests"}
    else:
        rep.run("tests", run_tests, args.test_timeout)
    if not have_gpu:
        for name in ("gather_device", "gather_pinned", "pinned_shared", "insert_device", "insert_pinned", "sumtree",
                     "table_device", "table_pinned", "dask_cuda", "table_selection"):  # fmt: skip
            rep.sections[name] = {"status": "skipped", "reason": "no usable CUDA device (or no CuPy)"}
    else:
        rep.run("gather_device", bench_gather, "device", reps)
        rep.run("gather_pinned", bench_gather, "pinned", reps)
        rep.run("pinned_shared", check_pinned_shared, reps, event_ms, graph_ms, _reference_rings, _window_sets)
        rep.run("sumtree", bench_sumtree, 1_000_000 if args.quick else 10_000_000, 1024, reps)
        rep.run("table_device", bench_table, "device", max(5, reps // 2))
        rep.run("table_pinned", bench_table, "pinned", max(5, reps // 2))
        rep.run("insert_device", bench_insert, "device", max(5, reps // 5))
        rep.run("insert_pinned", bench_insert, "pinned", max(5, reps // 5))
        rep.run("dask_cuda", check_dask_cuda)
        rep.run("table_selection", bench_table_selection, reps)
    s = rep.sections
    rows = []
    for name in ("gather_device", "gather_pinned"):
        r = s.get(name, {})
        rows.append({"check": f"{name} (fused)", "status": r.get("status"),
                     "ms": (r.get("kernel_fused") or {}).get("ms_per_take"), "GB/s": r.get("gather_fused_gbps"),
                     "ref GB/s": r.get("copy_gbps"), "ratio": r.get("ratio_fused"),
                     "target": f">= {TARGET_RATIO}"})  # fmt: skip
        rows.append({"check": f"{name} (per column)", "status": r.get("status"),
                     "ms": (r.get("kernel") or {}).get("ms_per_take"), "GB/s": r.get("gather_gbps"),
                     "ref GB/s": r.get("copy_gbps"), "ratio": r.get("ratio")})  # fmt: skip
    r = s.get("pinned_shared", {})
    rows.append({"check": "pinned_shared (reader's mapping, fused)", "status": r.get("status"),
                 "GB/s": r.get("gather_fused_gbps"), "ref GB/s": r.get("copy_gbps"), "ratio": r.get("ratio_fused"),
                 "target": f">= {TARGET_RATIO}"})  # fmt: skip
    for name in ("insert_device", "insert_pinned"):
        r = s.get(name, {})
        for src in ("episodes_host", "batch_host", "batch_device"):
            x = r.get(src) or {}
            rows.append({"check": f"{name} B=1024 {src}", "status": r.get("status"), "ms": x.get("insert_ms"),
                         "GB/s": x.get("gbps"), "ref GB/s": x.get("copy_gbps"), "ratio": x.get("ratio_to_copy"),
                         "target": {"batch_device": f">= {GEAR_COLLECTION_GBPS} GB/s",
                                    "batch_host": f">= {COLLECTION_HOST_RATIO}x pageable H2D"}.get(src, "")})  # fmt: skip
    st = s.get("sumtree", {})
    for key, label in (("sample", "sample B=1024"), ("update", "update B=1024"), ("topk", "top-k k=1024")):
        rows.append({"check": f"{label} of N={st.get('N', '?')}", "status": st.get("status"),
                     "ms": (st.get(key) or {}).get("event_ms")})  # fmt: skip
    for name in ("table_device", "table_pinned"):
        r = s.get(name, {})
        rows.append({"check": f"{name} sample B=256 x L=64", "status": r.get("status"), "ms": r.get("sample_ms"),
                     "GB/s": r.get("gbps"), "target": f">= {TABLE_SAMPLE_GBPS} GB/s" if name == "table_device" else ""})  # fmt: skip
    r = s.get("table_selection", {})
    for tier in ("device", "host"):
        rows.append({"check": f"table {tier}: prioritized sample + update B=1024 of N={r.get('N', '?')}",
                     "status": r.get("status"), "ms": (r.get(tier) or {}).get("sample_and_update_ms"),
                     "target": f"<= {TABLE_SELECTION_MS} ms" if tier == "device" else ""})  # fmt: skip
    tc = s.get("tests", {})
    rows.append({"check": "pytest -m gpu", "status": tc.get("status"), "ratio": None,
                 "target": " ".join(f"{k}={v}" for k, v in (tc.get("counts") or {}).items())})  # fmt: skip
    rows.append({"check": "dask_cuda", "status": s.get("dask_cuda", {}).get("status")})
    print()
    print_table(rows, ["check", "status", "ms", "GB/s", "ref GB/s", "ratio", "target"])
    total = round(time.perf_counter() - t0, 1)
    path = write_json("gpu_check", {"seconds": total, "sections": s, "summary": rows, "host": machine()}, args.out)
    print(f"\n{total} s; results in {path}")
    return 0 if all(v.get("status") in ("ok", "skipped") for v in s.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
