"""Disk-tier benchmark: a ``disk`` table against the host tier (warm) and against plain reads of its files (cold).

Every row is a ratio to a reference measured in the same run, with its target:

``warm``
    B=256 x L=64 windows from a disk table whose files are in the page cache,
    against the same draws (same generator per call) from a host table of the
    same episodes, the two called in turn (:func:`common.alternate`): >= 0.8x.
``cold``
    The same from a disk table whose pages were just evicted (``flush`` and
    each shard's ``drop_cache``), against ``os.preadv`` of the same windows'
    bytes from the same ring files in the same order (one thread; the cache
    evicted before it too; the two take turns going first).  The windows are
    those the table gathered: each batch is drawn with its own generator, the
    windows read back from its keys and mask, and the reference's bytes are
    checked equal to the batch's.  ``cold_readahead`` is the same inside
    ``DiskTier.readahead()`` and ``cold_stream`` through a
    ``gear_flow.Stream`` over the table (each where this gear_flow has it):
    >= 0.8x.
``reopen``
    ``LocalTable.open`` of a 10 GB table (reference columns) just closed
    (its files cached) and with its files evicted from the page cache:
    <= 0.5 s; the first sample after it (info).
``beyond_ram`` (``--beyond-ram`` only)
    A table of 1.5x the machine's RAM ingested (from a small pool of
    episodes, inserted again and again) and sampled, the process's
    anonymous RSS polled throughout: peak <= 5% of the data.

Usage::

    python pipelines/bench_disk.py                # warm, cold, reopen (10 GB)
    python pipelines/bench_disk.py --quick        # small sizes, seconds (used by the test suite)
    python pipelines/bench_disk.py --beyond-ram   # only the beyond-RAM row (writes ~40 GB under --dir)

The JSON keeps the rows of earlier runs at the same path that this run did not
measure (each row names the command that measured it), so the default run and
a ``--beyond-ram`` run make one file.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    REFERENCE,
    RESULTS,
    alternate,
    make_episodes,
    print_table,
    reference_columns,
    write_json,
)

import gear_flow as gf  # noqa: E402
from gear_flow.keys import decode  # noqa: E402

GB = 1e9


# -- measuring the process ----------------------------------------------------------------------------
def proc_status(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``RssAnon``, ``RssFile``, ``VmRSS``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise KeyError("MemTotal")


def io_counters() -> dict:
    """Bytes this process had read from storage (``/proc/self/io``) and its major faults so far."""
    out = {"read_bytes": 0, "major_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    out["read_bytes"] = int(line.split()[1])
    except OSError:
        pass
    return out


def io_delta(before: dict) -> dict:
    now = io_counters()
    return {k: now[k] - before[k] for k in before}


def filesystem(path: Path) -> dict:
    """The mount holding ``path`` (from ``/proc/mounts``: the longest mount point that is a prefix) and its room."""
    path = path.resolve()
    best = ("", "?", "?")
    with open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if (path == Path(mnt) or Path(mnt) in path.parents) and len(mnt) > len(best[0]):
                best = (mnt, fstype, dev)
    usage = shutil.disk_usage(path)
    return {"mount": best[0], "fstype": best[1], "device": best[2], "free_bytes": usage.free}


class PeakAnon:
    """Polls this process's ``RssAnon`` (and ``RssFile``) from a thread every ``period`` seconds; keeps the peak.

    The ring's pages are a file's (``RssFile``, given back to the page cache
    under pressure): what a table larger than memory must keep small is the
    anonymous memory, which only swap could take away.
    """

    def __init__(self, period: float = 0.02):
        self.period = period
        self.peak_anon = self.peak_file = 0
        #: peak ``RssAnon`` of each phase (:meth:`phase`), in the order they ran
        self.phases: dict[str, int] = {}
        self._phase = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def phase(self, name: str) -> None:
        """From now on the peaks are also ``name``'s (the previous phase's polled once more first)."""
        self.poll()
        self._phase = name
        self.poll()

    def poll(self) -> None:
        anon = proc_status("RssAnon")
        self.peak_anon = max(self.peak_anon, anon)
        self.peak_file = max(self.peak_file, proc_status("RssFile"))
        self.phases[self._phase] = max(self.phases.get(self._phase, 0), anon)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.poll()

    def __enter__(self):
        self.poll()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.poll()


# -- tables ---------------------------------------------------------------------------------------------
def step_nbytes(cols) -> int:
    return sum(c.nbytes for c in cols)


def fill(table, pool: list[dict], steps: int, per_call: int = 10) -> int:
    """Insert episodes of ``pool`` (in turn, again and again) until ``steps`` steps are stored; returns steps."""
    T = len(pool[0]["reward"])
    n, i = 0, 0
    while n + per_call * T <= steps:
        table.insert([pool[(i + j) % len(pool)] for j in range(per_call)])
        n += per_call * T
        i += per_call
    while n + T <= steps:
        table.insert(pool[i % len(pool)])
        n += T
        i += 1
    return n


def disk_table(path: Path, spec, seed: int = 0):
    return gf.LocalTable(spec, sampler=gf.Uniform(), tier="disk", path=path, seed=seed)


def drop_cache(table) -> None:
    """Every shard's files out of the page cache (after ``flush``, so that nothing is dirty)."""
    for s in table.shards:
        s.tier.drop_cache()


def resident_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` now in the page cache (``mincore`` of a fresh read-only mapping of each)."""
    import mmap

    from gear_flow.storage.disk import resident_bytes as mapped_resident

    total = 0
    for p in path.rglob("*"):
        if p.is_file() and p.stat().st_size:
            with open(p, "rb") as f:
                m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            a = np.frombuffer(m, dtype=np.uint8)
            total += mapped_resident(a) or 0
            del a
            m.close()
    return total


def pwrite_seconds(path: Path, pool: list[dict], nbytes: int) -> float:
    """Seconds to write ``nbytes`` of the pool's column bytes to a new file with buffered ``os.pwrite`` (no fsync,
    as an insert does not sync): the page cache's own write path, the reference of an insert into a disk table."""
    chunks = [np.ascontiguousarray(e[c]).view(np.uint8).reshape(-1) for e in pool for c in e]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t, pos, i = time.perf_counter(), 0, 0
        while pos < nbytes:
            c = chunks[i % len(chunks)][: nbytes - pos]
            os.pwrite(fd, c, pos)
            pos += len(c)
            i += 1
        t = time.perf_counter() - t
    finally:
        os.close(fd)
        os.unlink(path)
    return t


def drop_files(path: Path) -> None:
    """Every file under ``path`` out of the page cache (a closed table's: nothing maps them)."""
    for p in path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def touch_all(table) -> None:
    """Read one byte of every page of every file of a disk table through its mappings (the page cache warm)."""
    page = os.sysconf("SC_PAGE_SIZE")
    for s in table.shards:
        for a in s.tier.arrays.values():
            flat = a.reshape(-1).view(np.uint8)
            int(flat[::page].sum())


def out_buffers(table, B: int, L: int):
    return gf.SampleBuffers(table.spec, table.spec.names, B, L, tier=table.shards[0].tier)


# -- the windows a batch gathered, and reading them with os.preadv ---------------------------------------
def batch_windows(table, batch, boundary: str) -> tuple[np.ndarray, ...]:
    """Shard, ring position of the first stored step, head padding and stored steps of each window of ``batch``.

    Read back from the batch itself (its keys and mask), for step items:
    each item starts its window (``pad_head``: ends it), so the item's seq
    and the mask place it.
    """
    sid, seq = decode(np.asarray(batch.keys))
    mask = np.asarray(batch.mask)
    n_valid = mask.sum(1).astype(np.int64)
    dst = mask.argmax(1).astype(np.int64)
    first = seq - n_valid + 1 if boundary == "pad_head" else seq
    cap = np.array([table._by_id[int(i)].capacity for i in sid], dtype=np.int64)
    return sid.astype(np.int64), first % cap, dst, n_valid


class Preadv:
    """Reads windows' bytes from a disk table's ring files with ``os.preadv``, column by column, row by row.

    The order of the table's own gather (each column's windows in the
    batch's order), one call per window (two for one that wraps at the
    ring's end), into reused ``[B, L * step_nbytes]`` buffers; one thread.
    """

    def __init__(self, table, B: int, L: int):
        self.cols = {c.name: c.nbytes for c in table.spec.columns}
        self.fds = {}
        self.cap = {}
        for s in table.shards:
            self.cap[s.shard_id] = s.capacity
            for name, arr in s.store.columns.items():
                self.fds[s.shard_id, name] = os.open(s.tier.path_of(arr), os.O_RDONLY)
        self.bufs = {c: np.zeros((B, L * nb), dtype=np.uint8) for c, nb in self.cols.items()}

    def read(self, windows) -> None:
        sid, start, dst, n_valid = (w.tolist() for w in windows)
        for c, nb in self.cols.items():
            buf = self.bufs[c]
            for b in range(len(start)):
                fd, cap, s, d, n = self.fds[sid[b], c], self.cap[sid[b]], start[b], dst[b], n_valid[b]
                head = min(n, cap - s)
                os.preadv(fd, [buf[b, d * nb : (d + head) * nb]], s * nb)
                if head < n:
                    os.preadv(fd, [buf[b, (d + head) * nb : (d + n) * nb]], 0)

    def same_as(self, batch, windows) -> bool:
        """The bytes :meth:`read` put in its buffers for ``windows`` are ``batch``'s (every column, valid steps)."""
        _, _, dst, n_valid = windows
        for c, nb in self.cols.items():
            got = np.asarray(batch.data[c]).reshape(len(dst), -1).view(np.uint8)
            for b in range(len(dst)):
                sl = slice(int(dst[b]) * nb, int(dst[b] + n_valid[b]) * nb)
                if not np.array_equal(got[b, sl], self.bufs[c][b, sl]):
                    return False
        return True

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def cold_against_preadv(table, ref: Preadv, run, seeds: list[int], repeat: int, batch_bytes: int) -> dict:
    """Seconds of ``run(seed)`` on a cold cache against ``ref`` reading the windows it gathers, also cold.

    ``run(seed)`` gathers its batches and returns ``(seconds, [windows per
    batch], last batch)``; for a seed it gathers the same windows every time
    (checked).  A first call per seed (untimed) finds them; then in each
    round both go, the cache evicted before each, the first of them taking
    turns.
    """
    planned = {}
    for s in seeds[:repeat]:
        _, wins, last = run(s)
        ref.read(wins[-1])
        if not ref.same_as(last, wins[-1]):
            raise AssertionError("os.preadv of the windows read other bytes than the table gathered")
        planned[s] = wins
    ours, theirs, io_ours, io_theirs, same = [], [], [], [], True

    def go_table(s):
        drop_cache(table)
        before = io_counters()
        t, wins, _ = run(s)
        io_ours.append(io_delta(before))
        return t, all(all(np.array_equal(a, b) for a, b in zip(w, p)) for w, p in zip(wins, planned[s]))

    def go_ref(s):
        drop_cache(table)
        before = io_counters()
        t = time.perf_counter()
        for w in planned[s]:
            ref.read(w)
        t = time.perf_counter() - t
        io_theirs.append(io_delta(before))
        return t

    for r, s in enumerate(seeds[:repeat]):
        if r % 2 == 0:
            t, ok = go_table(s)
            theirs.append(go_ref(s))
        else:
            theirs.append(go_ref(s))
            t, ok = go_table(s)
        ours.append(t)
        same = same and ok
    n = len(planned[seeds[0]])
    t_ours, t_ref = float(np.median(ours)), float(np.median(theirs))
    return {
        "gbps": n * batch_bytes / t_ours / GB,
        "preadv_gbps": n * batch_bytes / t_ref / GB,
        "ratio": t_ref / t_ours,
        "ms_per_batch": 1e3 * t_ours / n,
        "preadv_ms_per_batch": 1e3 * t_ref / n,
        "batches": n,
        "rounds": repeat,
        "same_windows": bool(same),
        "read_bytes_per_batch": float(np.median([d["read_bytes"] for d in io_ours])) / n,
        "preadv_read_bytes_per_batch": float(np.median([d["read_bytes"] for d in io_theirs])) / n,
        "major_faults_per_batch": float(np.median([d["major_faults"] for d in io_ours])) / n,
        "seconds": ours,
        "preadv_seconds": theirs,
    }


# -- rows -----------------------------------------------------------------------------------------------
def row(results: dict, name: str, value: dict, target: float, better: str) -> dict:
    """Record ``value`` as row ``name``: its ``target`` and whether it is ``met`` (``better``: ">=" or "<=")."""
    key = "ratio" if "ratio" in value else "seconds_median"
    v = value[key]
    met = v >= target if better == ">=" else v <= target
    results[name] = {**value, "target": target, "target_of": f"{key} {better} {target}", "met": bool(met)}
    return results[name]


def bench_warm_cold(args, pool, rows, results, root: Path) -> None:
    B, L = args.batch_size, args.length
    cols = reference_columns()
    steps = int(args.warm_gb * GB // step_nbytes(cols))
    small = gf.TableSpec(cols, capacity=4 * args.episode_length)
    for first_use in (gf.LocalTable(small, seed=0), disk_table(root / "first_use", small)):
        first_use.insert(pool[:2])  # each tier's kernels loaded before anything is timed
        first_use.sample(B, min(L, args.episode_length))
        first_use.close()
    first_use = None
    gc.collect()
    shutil.rmtree(root / "first_use")
    spec = gf.TableSpec(cols, capacity=steps)
    host = gf.LocalTable(spec, sampler=gf.Uniform(), seed=0)
    disk = disk_table(root / "warm", spec)
    t = time.perf_counter()
    n = fill(host, pool, steps)
    host_s = time.perf_counter() - t
    t = time.perf_counter()
    fill(disk, pool, steps)
    disk_s = time.perf_counter() - t
    data = n * step_nbytes(cols)
    batch_bytes = B * L * step_nbytes(cols)
    boundary = disk.boundary
    results["warm_table_insert"] = {
        "gbps": data / disk_s / GB,
        "host_gbps": data / host_s / GB,
        "ratio": host_s / disk_s,
        "data_bytes": data,
        "target": None,
    }
    rows.append(
        {
            "row": f"insert {data / GB:.2f} GB: disk vs host tier",
            "GB/s": data / disk_s / GB,
            "ref GB/s": data / host_s / GB,
            "ratio": host_s / disk_s,
            "target": "(info)",
            "note": "each tier's pages touched for the first time",
        }
    )

    # -- warm: the same draws from both tables, called in turn --------------------------------------------
    disk.flush()
    touch_all(disk)
    ob_h, ob_d = out_buffers(host, B, L), out_buffers(disk, B, L)
    calls = {"host": 0, "disk": 0}

    def sample(table, out, who):
        def one():
            calls[who] += 1
            table.sample(B, L, out=out, rng=np.random.default_rng(calls[who]))

        return one

    ts_h, ts_d = alternate([sample(host, ob_h, "host"), sample(disk, ob_d, "disk")], repeat=args.repeat)
    st = disk.info()["storage"]
    h, d = float(np.median(ts_h)), float(np.median(ts_d))
    w = row(
        results,
        "warm",
        {
            "gbps": batch_bytes / d / GB,
            "host_gbps": batch_bytes / h / GB,
            "ratio": h / d,
            "ms": 1e3 * d,
            "host_ms": 1e3 * h,
            "data_bytes": data,
            "resident_bytes": st["bytes_resident"],
            "bytes_on_disk": st["bytes_on_disk"],
            "calls": args.repeat,
        },
        0.8,
        ">=",
    )
    rows.append(
        {
            "row": "warm: disk vs host tier",
            "GB/s": w["gbps"],
            "ref GB/s": w["host_gbps"],
            "ratio": w["ratio"],
            "target": ">= 0.8",
            "met": w["met"],
            "note": f"{data / GB:.2f} GB, {st['bytes_resident'] / max(st['bytes_on_disk'], 1):.0%} resident",
        }
    )
    host = ob_h = None
    gc.collect()

    # -- cold: after flush + drop_cache, against os.preadv of the same windows ------------------------------
    disk.flush()
    ref = Preadv(disk, B, L)
    N = args.cold_batches
    seeds = [1000 + 17 * r for r in range(args.cold_repeat)]
    readahead = _readahead()

    def table_run(advise: bool):
        def run(seed):
            wins, b = [], None
            ctx = readahead() if advise else _null()
            t = time.perf_counter()
            with ctx:
                for i in range(N):
                    b = disk.sample(B, L, out=ob_d, rng=np.random.default_rng([seed, i]))
                    wins.append(batch_windows(disk, b, boundary))
            return time.perf_counter() - t, wins, b

        return run

    variants = [("cold", "cold: disk sample vs os.preadv", table_run(False))]
    if readahead is not None:
        variants.append(("cold_readahead", "cold: sample in DiskTier.readahead()", table_run(True)))
    else:
        results["cold_readahead"] = {"skipped": "gear_flow.storage.disk.DiskTier has no readahead()"}
        rows.append({"row": "cold: sample in DiskTier.readahead()", "note": "skipped: no DiskTier.readahead"})
    stream_params = _params(gf.Stream)
    if "readahead" in stream_params:
        k = args.stream_prefetch
        stream_info = {}

        def stream_run(seed):
            wins, b = [], None
            stream = gf.Stream(disk, B, L, prefetch=k, num_batches=N, seed=seed)
            t = time.perf_counter()
            for b in stream:
                wins.append(batch_windows(disk, b, boundary))
                if len(wins) == N:  # before the generator's end (its pool's shutdown is not the batches' cost)
                    t = time.perf_counter() - t
            if hasattr(stream, "stats"):
                stream_info["stats"] = _jsonable(stream.stats())
            return t, wins, b

        variants.append(("cold_stream", f"cold: Stream(prefetch={k}) vs os.preadv", stream_run))
    else:
        results["cold_stream"] = {"skipped": "gear_flow.Stream has no readahead parameter"}
        rows.append({"row": "cold: Stream", "note": "skipped: Stream has no readahead parameter"})
    for key, label, run in variants:
        c = cold_against_preadv(disk, ref, run, seeds, args.cold_repeat, batch_bytes)
        if key == "cold_stream":
            c.update(prefetch=args.stream_prefetch, **stream_info)
        c = row(results, key, c, 0.8, ">=")
        rows.append(
            {
                "row": label,
                "GB/s": c["gbps"],
                "ref GB/s": c["preadv_gbps"],
                "ratio": c["ratio"],
                "target": ">= 0.8",
                "met": c["met"],
                "note": f"{c['read_bytes_per_batch'] / 2**20:.1f} vs {c['preadv_read_bytes_per_batch'] / 2**20:.1f} "
                f"MiB read/batch; {c['major_faults_per_batch']:.0f} major faults/batch"
                + ("" if c["same_windows"] else "; WINDOWS DIFFERED"),
            }
        )
    ref.close()
    disk.close()
    disk = ob_d = None
    gc.collect()
    shutil.rmtree(root / "warm")


def _readahead():
    """``DiskTier.readahead`` (a context manager: gathers advise their windows first), or None where it is absent."""
    from gear_flow.storage.disk import DiskTier

    return getattr(DiskTier, "readahead", None)


def _null():
    import contextlib

    return contextlib.nullcontext()


def _params(fn) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _jsonable(x):
    try:
        return json.loads(json.dumps(x, default=float))
    except (TypeError, ValueError):
        return repr(x)


def bench_reopen(args, pool, rows, results, root: Path) -> None:
    B, L = args.batch_size, args.length
    cols = reference_columns()
    steps = int(args.reopen_gb * GB // step_nbytes(cols))
    spec = gf.TableSpec(cols, capacity=steps)
    path = root / "reopen"
    table = disk_table(path, spec)
    t = time.perf_counter()
    n = fill(table, pool, steps)
    ingest_s = time.perf_counter() - t
    flush = table.flush()
    t = time.perf_counter()
    table.close()
    close_s = time.perf_counter() - t
    table = None  # a closed table's shards still view its mappings: the files stay mapped until it goes
    data = n * step_nbytes(cols)
    on_disk = sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())

    def reopen(cold: bool) -> tuple[float, float, dict]:
        gc.collect()  # a closed table's arrays stay mapped until collected: mapped pages are not evicted
        if cold:
            drop_files(path)
        resident.append(resident_bytes(path))
        before = io_counters()
        t = time.perf_counter()
        tb = gf.LocalTable.open(path)
        opened = time.perf_counter() - t
        io = io_delta(before)
        t = time.perf_counter()
        tb.sample(B, L)
        first = time.perf_counter() - t
        tb.close()
        return opened, first, io

    pwrite_s = pwrite_seconds(root / "pwrite.bin", pool, data)
    out = {"data_bytes": data, "bytes_on_disk": on_disk, "steps": n, "ingest_gbps": data / ingest_s / GB}
    out["pwrite_gbps"] = data / pwrite_s / GB
    out["flush_s"], out["close_s"] = flush["seconds"], close_s
    for cold in (False, True):
        resident: list[int] = []
        runs = [reopen(cold) for _ in range(args.reopen_repeat)]
        key = "reopen_cold" if cold else "reopen_warm"
        r = row(
            results,
            key,
            {
                **out,
                "seconds_median": float(np.median([o for o, _, _ in runs])),
                "seconds": [o for o, _, _ in runs],
                "first_sample_s": float(np.median([f for _, f, _ in runs])),
                "open_read_bytes": float(np.median([io["read_bytes"] for _, _, io in runs])),
                "resident_before_open_bytes": resident,
            },
            0.5,
            "<=",
        )
        rows.append(
            {
                "row": f"reopen {data / GB:.1f} GB ({'files evicted' if cold else 'files cached'})",
                "s": r["seconds_median"],
                "target": "<= 0.5 s",
                "met": r["met"],
                "note": f"first sample {1e3 * r['first_sample_s']:.0f} ms; open read "
                f"{r['open_read_bytes'] / 2**20:.0f} MiB; {max(resident) / 2**20:.0f} MiB cached before",
            }
        )
    results["ingest"] = {
        "gbps": out["ingest_gbps"],
        "pwrite_gbps": out["pwrite_gbps"],
        "ratio": out["ingest_gbps"] / out["pwrite_gbps"],
        "data_bytes": data,
        "flush_s": flush["seconds"],
        "close_s": close_s,
        "target": None,
    }
    rows.append(
        {
            "row": f"ingest {data / GB:.1f} GB (insert) vs buffered os.pwrite",
            "GB/s": out["ingest_gbps"],
            "ref GB/s": out["pwrite_gbps"],
            "ratio": results["ingest"]["ratio"],
            "target": "(info)",
            "note": f"then flush {flush['seconds']:.1f} s, close {close_s:.1f} s",
        }
    )
    shutil.rmtree(path)


def bench_beyond_ram(args, pool, rows, results, root: Path) -> None:
    B, L = args.batch_size, args.length
    cols = reference_columns()
    ram = mem_total()
    want = args.beyond_ram_factor * ram
    steps = int(math.ceil(want / step_nbytes(cols) / 1000) * 1000)
    room = filesystem(root)
    if room["fstype"] in ("tmpfs", "ramfs"):
        results["beyond_ram"] = {"skipped": f"{root} is on {room['fstype']} (memory)"}
        rows.append({"row": "beyond RAM", "note": results["beyond_ram"]["skipped"]})
        return
    if room["free_bytes"] < 1.1 * steps * (step_nbytes(cols) + 48):
        results["beyond_ram"] = {"skipped": f"{root}: {room['free_bytes'] / GB:.0f} GB free"}
        rows.append({"row": "beyond RAM", "note": results["beyond_ram"]["skipped"]})
        return
    spec = gf.TableSpec(cols, capacity=steps)
    path = root / "beyond_ram"
    anon0 = proc_status("RssAnon")
    try:
        with PeakAnon() as mon:
            mon.phase("ingest")
            table = disk_table(path, spec)
            t = time.perf_counter()
            n = fill(table, pool, steps)
            ingest_s = time.perf_counter() - t
            mon.phase("flush")
            f = table.flush()
            mon.phase("sample")
            ob = out_buffers(table, B, L)
            # first use, untimed: torch's import and the gather's compiled code load here, from a disk whose cache
            # the ingestion just evicted (seconds, which the first timed batches would otherwise count)
            table.sample(B, L, out=ob, rng=np.random.default_rng([6, 0]))
            before = io_counters()
            t = time.perf_counter()
            for i in range(args.beyond_ram_batches):
                table.sample(B, L, out=ob, rng=np.random.default_rng([7, i]))
            sample_s = time.perf_counter() - t
            io = io_delta(before)
            readahead = _readahead()
            ra_s = None
            if readahead is not None:  # other windows (other seeds): as cold as the first
                mon.phase("sample_readahead")
                t = time.perf_counter()
                with readahead():
                    for i in range(args.beyond_ram_batches):
                        table.sample(B, L, out=ob, rng=np.random.default_rng([8, i]))
                ra_s = time.perf_counter() - t
            mon.phase("info")
            st = table.info()["storage"]
            mon.phase("close")
            close_t = time.perf_counter()
            table.close()
            close_s = time.perf_counter() - close_t
        data = n * step_nbytes(cols)
        batch_bytes = B * L * step_nbytes(cols)
        r = row(
            results,
            "beyond_ram",
            {
                "ratio": mon.peak_anon / data,
                "mem_total_bytes": ram,
                "data_bytes": data,
                "data_per_ram": data / ram,
                "bytes_on_disk": st["bytes_on_disk"],
                "peak_rss_anon_bytes": mon.peak_anon,
                "peak_rss_anon_by_phase_bytes": mon.phases,
                "rss_anon_before_bytes": anon0,
                "peak_rss_file_bytes": mon.peak_file,
                "ingest_gbps": data / ingest_s / GB,
                "ingest_s": ingest_s,
                "flush_s": f["seconds"],
                "close_s": close_s,
                "sample_gbps": args.beyond_ram_batches * batch_bytes / sample_s / GB,
                "sample_readahead_gbps": None if ra_s is None else args.beyond_ram_batches * batch_bytes / ra_s / GB,
                "sample_batches": args.beyond_ram_batches,
                "sample_read_bytes_per_batch": io["read_bytes"] / args.beyond_ram_batches,
                "filesystem": room,
            },
            0.05,
            "<=",
        )
    finally:
        shutil.rmtree(path, ignore_errors=True)
    rows.append(
        {
            "row": f"beyond RAM: {data / GB:.1f} GB = {data / ram:.2f}x RAM, peak RssAnon / data",
            "ratio": r["ratio"],
            "target": "<= 0.05",
            "met": r["met"],
            "note": f"peak RssAnon {mon.peak_anon / GB:.2f} GB (before {anon0 / GB:.2f}); ingest "
            f"{r['ingest_gbps']:.2f} GB/s, flush {f['seconds']:.0f} s, sample {r['sample_gbps']:.2f} GB/s"
            + ("" if ra_s is None else f" ({r['sample_readahead_gbps']:.2f} in readahead())"),
        }
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=REFERENCE["batch_size"])
    p.add_argument("--length", type=int, default=REFERENCE["length"])
    p.add_argument("--episode-length", type=int, default=REFERENCE["episode_length"])
    p.add_argument("--pool-episodes", type=int, default=100, help="distinct episodes, inserted again and again")
    p.add_argument("--warm-gb", type=float, default=1.5, help="size of the warm/cold tables (each tier)")
    p.add_argument("--repeat", type=int, default=50, help="warm calls of each tier")
    p.add_argument("--cold-batches", type=int, default=8, help="batches per cold measurement")
    p.add_argument("--cold-repeat", type=int, default=4, help="cold rounds (each: the table and os.preadv)")
    p.add_argument("--stream-prefetch", type=int, default=4)
    p.add_argument("--reopen-gb", type=float, default=10.0)
    p.add_argument("--reopen-repeat", type=int, default=3)
    p.add_argument("--rows", default="warm,cold,reopen", help="of the default run: warm,cold (one table) and reopen")
    p.add_argument("--beyond-ram", action="store_true", help="run only the beyond-RAM row (~1.5x RAM to disk)")
    p.add_argument("--beyond-ram-factor", type=float, default=1.5)
    p.add_argument("--beyond-ram-batches", type=int, default=20)
    p.add_argument("--dir", default="/work/tmp/bench_disk", help="where the tables go (a disk, not tmpfs)")
    p.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/bench_disk.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.pool_episodes, args.episode_length = 8, 500
        args.warm_gb, args.repeat, args.cold_batches, args.cold_repeat = 0.02, 5, 2, 2
        args.reopen_gb, args.reopen_repeat, args.stream_prefetch = 0.02, 2, 2
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    root = Path(__import__("tempfile").mkdtemp(prefix="run-", dir=root))
    out_path = Path(args.out) if args.out else RESULTS / "bench_disk.json"
    command = " ".join(["pipelines/bench_disk.py", *(sys.argv[1:] if argv is None else argv)])
    t0 = time.perf_counter()
    rows: list[dict] = []
    results: dict = {}
    fs = filesystem(root)
    if fs["fstype"] in ("tmpfs", "ramfs"):
        print(f"warning: {root} is on {fs['fstype']}: 'cold' reads come from memory", file=sys.stderr)
    pool = make_episodes(args.pool_episodes, args.episode_length)
    try:
        if args.beyond_ram:
            bench_beyond_ram(args, pool, rows, results, root)
        else:
            which = set(args.rows.split(","))
            if which & {"warm", "cold"}:
                bench_warm_cold(args, pool, rows, results, root)
            if "reopen" in which:
                bench_reopen(args, pool, rows, results, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seconds = time.perf_counter() - t0
    print_table(rows, ["row", "GB/s", "ref GB/s", "ratio", "s", "target", "met", "note"])
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    for k in results:
        results[k] = {**results[k], "measured_by": command, "measured_at": stamp}
    payload = _merge(out_path, results)
    payload["runs"] = (payload.get("runs") or [])[-9:] + [
        {"command": command, "time": stamp, "seconds": seconds, "rows": sorted(results), "args": vars(args)}
    ]
    payload["memory_bytes"] = mem_total()
    payload["filesystem"] = fs
    path = write_json("bench_disk", payload, str(out_path))
    print(f"\n{seconds:.0f} s; wrote {path}")
    return payload


#: the rows a run may write (an earlier file's other keys, of an older version of this script, are dropped)
ROWS = (
    "warm", "warm_table_insert", "cold", "cold_readahead", "cold_stream", "reopen_warm", "reopen_cold", "ingest",
    "beyond_ram",
)  # fmt: skip


def _merge(path: Path, results: dict) -> dict:
    """The rows of an earlier run at ``path`` that this one did not measure, with this run's."""
    try:
        old = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        old = {}
    kept = {k: v for k, v in old.items() if k in ROWS or k == "runs"}
    return {**kept, **results}


if __name__ == "__main__":
    main()
