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
    in the same run.  Target: ratio >= 0.7 (DESIGN.md).
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
    A LocalCUDACluster round trip, only when dask_cuda is importable.

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


class Report:
    """Sections of the run; a failing section records its error and the run goes on."""

    def __init__(self):
        self.sections: dict[str, dict] = {}

    def run(self, name: str, fn, *args, **kw) -> None:
        t = time.perf_counter()
        try:
            res = fn(*args, **kw)
            res = {"status": "ok", **(res or {})} if not (res or {}).get("status") else res
        except Exception as e:  # recorded, never fatal
            res = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        res["seconds"] = round(time.perf_counter() - t, 2)
        self.sections[name] = res
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
    """Gather kernels vs a copy of the same bytes (same run): kernel-only (CUDA graphs) and per take via the tier API."""
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

    # correctness on this data: one take against the CPU twin
    s, d, n = sets[0]
    parity = True
    for name, v in views.items():
        tier.gather_windows(v, s, d, n, outs[name])
        ref = np.empty((B, L, v.shape[1]), np.uint8)
        twin(cp.asnumpy(v) if isinstance(v, cp.ndarray) else v, s, d, n, ref)
        parity &= bool(np.array_equal(cp.asnumpy(outs[name]), ref))

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

    # kernel only: windows already on the device, K takes captured in one graph
    wins = [gops.upload_windows(*w) for w in sets]
    k_all = graph_ms(cp, [gops.launcher(views[nm], outs[nm], w) for w in wins for nm in views], reps)
    k_obs = graph_ms(cp, [gops.launcher(views["obs"], outs["obs"], w) for w in wins], reps)
    c_all = graph_ms(cp, [copier(o, batch_bytes) for o in offsets], reps)
    c_obs = graph_ms(cp, [copier(o, obs_bytes) for o in offsets], reps)

    # per take through the tier API, host overhead included (window upload, 4 launches)
    it = iter(range(1 << 30))

    def take():
        s, d, n = sets[next(it) % K]
        for name, v in views.items():
            tier.gather_windows(v, s, d, n, outs[name])

    tk = event_ms(cp, take, reps)
    c1 = event_ms(cp, copier(offsets[0], batch_bytes), reps)
    ratio = c_all["event_ms"] / k_all["event_ms"]
    return {
        "status": "ok" if parity else "failed",
        "error": None if parity else "gathered bytes differ from the CPU twin",
        "parity_with_twin": parity,
        "reference": "device-to-device copy" if tier_name == "device" else "pinned host-to-device copy",
        "batch_bytes": batch_bytes,
        "takes_per_graph": K,
        "kernel": {"gather": k_all, "copy": c_all, "ms_per_take": k_all["event_ms"] / K},
        "gather_gbps": batch_bytes * K / k_all["event_ms"] / 1e6,
        "copy_gbps": batch_bytes * K / c_all["event_ms"] / 1e6,
        "ratio": ratio,
        "meets_target": ratio >= TARGET_RATIO,
        "obs_only": {"gather": k_obs, "copy": c_obs, "ratio": c_obs["event_ms"] / k_obs["event_ms"]},
        "take": {
            "gather": tk,
            "copy": c1,
            "ratio_event": c1["event_ms"] / tk["event_ms"],
            "ratio_wall": c1["wall_ms"] / tk["wall_ms"],
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
    return {"insert_seconds": insert_s, "sample_ms": med * 1e3, "gbps": nbytes / med / 1e9, "batch_bytes": nbytes,
            "tensors_on_cuda": on_cuda, "cupy": cp.__version__}  # fmt: skip


def check_dask_cuda() -> dict:
    try:
        import dask_cuda  # noqa: F401
        from distributed import Client
    except ImportError as e:
        return {"status": "skipped", "reason": f"no dask_cuda ({e})"}
    from dask_cuda import LocalCUDACluster

    def on_worker():
        import numpy as np

        from gear_flow import ColumnSpec, LocalTable, TableSpec

        spec = TableSpec((ColumnSpec("obs", (8,), np.float32),), capacity=1000)
        t = LocalTable(spec, tier="device", seed=0)
        t.insert({"obs": np.ones((100, 8), np.float32)})
        b = t.sample(16, 4)
        return {"shape": list(b["obs"].shape), "is_cuda": bool(b["obs"].is_cuda), "sum": float(b["obs"].sum())}

    with LocalCUDACluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        res = client.submit(on_worker, pure=False).result(timeout=120)
    return {"worker": res, "status": "ok" if res["is_cuda"] and res["sum"] == 16 * 4 * 8 else "failed"}


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
    rep = Report()
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
                     "table_device", "table_pinned", "dask_cuda"):  # fmt: skip
            rep.sections[name] = {"status": "skipped", "reason": "no usable CUDA device (or no CuPy)"}
    else:
        rep.run("gather_device", bench_gather, "device", reps)
        rep.run("gather_pinned", bench_gather, "pinned", reps)
        rep.run("pinned_shared", check_pinned_shared, reps, event_ms, graph_ms, _reference_rings, _window_sets)
        rep.run("insert_device", bench_insert, "device", max(5, reps // 5))
        rep.run("insert_pinned", bench_insert, "pinned", max(5, reps // 5))
        rep.run("sumtree", bench_sumtree, 1_000_000 if args.quick else 10_000_000, 1024, reps)
        rep.run("table_device", bench_table, "device", max(5, reps // 2))
        rep.run("table_pinned", bench_table, "pinned", max(5, reps // 2))
        rep.run("dask_cuda", check_dask_cuda)
    s = rep.sections
    rows = []
    for name in ("gather_device", "gather_pinned"):
        r = s.get(name, {})
        rows.append({"check": name, "status": r.get("status"), "ms": (r.get("kernel") or {}).get("ms_per_take"),
                     "GB/s": r.get("gather_gbps"), "ref GB/s": r.get("copy_gbps"), "ratio": r.get("ratio"),
                     "target": f">= {TARGET_RATIO}"})  # fmt: skip
    r = s.get("pinned_shared", {})
    rows.append({"check": "pinned_shared (reader's mapping)", "status": r.get("status"), "GB/s": r.get("gather_gbps"),
                 "ref GB/s": r.get("copy_gbps"), "ratio": r.get("ratio"), "target": f">= {TARGET_RATIO}"})  # fmt: skip
    for name in ("insert_device", "insert_pinned"):
        r = s.get(name, {})
        rows.append({"check": f"{name} B=1024", "status": r.get("status"), "ms": r.get("insert_ms"),
                     "GB/s": r.get("gbps"), "ref GB/s": r.get("h2d_copy_gbps"), "ratio": r.get("ratio_to_h2d_copy"),
                     "target": f">= {GEAR_COLLECTION_GBPS} GB/s"})  # fmt: skip
    st = s.get("sumtree", {})
    for key, label in (("sample", "sample B=1024"), ("update", "update B=1024"), ("topk", "top-k k=1024")):
        rows.append({"check": f"{label} of N={st.get('N', '?')}", "status": st.get("status"),
                     "ms": (st.get(key) or {}).get("event_ms")})  # fmt: skip
    for name in ("table_device", "table_pinned"):
        r = s.get(name, {})
        rows.append({"check": name, "status": r.get("status"), "ms": r.get("sample_ms"), "GB/s": r.get("gbps")})
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
