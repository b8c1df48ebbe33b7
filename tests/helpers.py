"""Shared helpers for the core tests: self-describing episodes and window checks.

Every step of an episode built by :func:`episode` encodes where it comes from:
``ep`` holds the episode's tag (>= 1, so that zero padding is never a valid
tag), ``t`` its index in the episode, and ``obs`` ``[tag, t, 1000 * tag + t]``.
A sampled window can then be checked, from the data alone, to be ``L``
consecutive steps of one episode (:func:`check_windows`).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading

import numpy as np

from gear_flow import ColumnSpec, GearFlowError, LocalTable, RateLimitTimeout, TableSpec
from gear_flow.keys import decode

COLUMNS = (
    ColumnSpec("obs", (3,), np.float32),
    ColumnSpec("ep", (), np.int64),
    ColumnSpec("t", (), np.int32),
    ColumnSpec("done", (), np.bool_),
)


def make_spec(
    capacity: int = 64, num_shards: int = 1, item_unit: str = "step", max_size: int | None = None
) -> TableSpec:
    return TableSpec(COLUMNS, capacity=capacity, num_shards=num_shards, item_unit=item_unit, max_size=max_size)


def episode(tag: int, length: int) -> dict:
    t = np.arange(length)
    return {
        "obs": np.stack([np.full(length, tag), t, 1000 * tag + t], axis=1).astype(np.float32),
        "ep": np.full(length, tag, dtype=np.int64),
        "t": t.astype(np.int32),
        "done": t == length - 1,
    }


def scalar_episode(length: int, start: float = 0.0) -> dict:
    """For tables with one float32 column ``x``."""
    return {"x": (start + np.arange(length)).astype(np.float32)}


def x_spec(capacity: int = 32, num_shards: int = 1, max_size: int | None = None, item_unit: str = "step") -> TableSpec:
    return TableSpec(
        (ColumnSpec("x", (), np.float32),),
        capacity=capacity,
        num_shards=num_shards,
        max_size=max_size,
        item_unit=item_unit,
    )


class Catalog:
    """What was inserted: episode id -> (tag, length, first key)."""

    def __init__(self):
        self.by_id: dict[int, tuple[int, int, int]] = {}

    def insert(self, table: LocalTable, tags_lengths, priorities=None, **kw):
        eps = [episode(tag, n) for tag, n in tags_lengths]
        res = table.insert(eps, priorities, **kw)
        for (tag, n), eid, fk in zip(tags_lengths, res.episode_ids, res.first_keys):
            self.by_id[int(eid)] = (tag, n, int(fk))
        return res


def check_windows(batch, catalog: Catalog, length: int, boundary: str, item_unit: str = "step") -> None:
    """Assert every window of ``batch`` is consecutive steps of one episode, padded correctly."""
    L = length
    obs = batch["obs"].numpy()
    ep = batch["ep"].numpy()
    t = batch["t"].numpy()
    done = batch["done"].numpy()
    mask = batch.mask.numpy()
    keys = batch.keys.numpy()
    assert obs.shape == (len(batch), L, 3) and mask.shape == (len(batch), L)
    for b in range(len(batch)):
        eid = int(batch.episode_ids[b])
        assert eid in catalog.by_id, f"row {b}: episode id {eid} was never inserted"
        tag, T, first_key = catalog.by_id[eid]
        m = mask[b]
        valid = np.flatnonzero(m)
        assert len(valid) >= 1, f"row {b}: empty window"
        assert np.array_equal(valid, np.arange(valid[0], valid[-1] + 1)), f"row {b}: mask not contiguous {m}"
        n = len(valid)
        if boundary == "strict":
            assert n == L
        elif boundary == "pad_tail":
            assert valid[0] == 0
        else:
            assert valid[-1] == L - 1
        ts = t[b, valid]
        t0 = int(batch.timesteps[b])
        assert np.array_equal(ts, t0 + np.arange(n)), f"row {b}: steps {ts} not consecutive from {t0}"
        assert 0 <= t0 and t0 + n <= T
        if n < L:  # truncated only by the episode's edge
            if boundary == "pad_tail":
                assert t0 + n == T, f"row {b}: tail padding before the episode's end"
            else:
                assert t0 == 0, f"row {b}: head padding after the episode's start"
        assert np.all(ep[b, valid] == tag)
        assert np.array_equal(obs[b, valid], np.stack([np.full(n, tag), ts, 1000 * tag + ts], 1).astype(np.float32))
        assert np.array_equal(done[b, valid], ts == T - 1)
        pad = ~m
        assert not obs[b, pad].any() and not ep[b, pad].any() and not t[b, pad].any() and not done[b, pad].any()
        shard, seq = decode(np.array([keys[b]]))
        fshard, fseq = decode(np.array([first_key]))
        assert shard[0] == fshard[0], f"row {b}: key's shard differs from the episode's"
        if item_unit == "step":
            item_t = t0 + n - 1 if boundary == "pad_head" else t0
            assert seq[0] == fseq[0] + item_t, f"row {b}: key is not the window's item step"
        else:
            assert seq[0] == fseq[0]


def reconcile(table: LocalTable) -> dict:
    """Assert the accounting identity on ``info()`` and return the totals."""
    info = table.info()
    tot = info["totals"]
    assert tot["inserted"] == tot["size"] + tot["evicted"] + tot["removed"] + tot["deleted"] + tot["expired"], tot
    assert tot["size"] == info["size"] == table.size == sum(s["size"] for s in info["shards"])
    assert info.get("coordinator_size", info["size"]) == info["size"], info  # distributed: global count == shards
    for s in info["shards"]:
        assert s["inserted"] == s["size"] + s["evicted"] + s["removed"] + s["deleted"] + s["expired"], s
    return tot


def chi2_sf(x: float, df: int) -> float:
    """Upper tail of chi-square: 1 - P(df/2, x/2), the regularized lower incomplete gamma by its series."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    term = total = 1.0 / a
    n = 0
    while term > 1e-17 * total:
        n += 1
        term *= z / (a + n)
        total += term
    return 1.0 - math.exp(-z + a * math.log(z) - math.lgamma(a)) * total


def chi2_critical(df: int, p: float = 1e-4) -> float:
    """``x`` with ``chi2_sf(x, df) == p`` (bisection); scipy is not a dependency."""
    lo, hi = 0.0, df + 40.0 * math.sqrt(2.0 * df) + 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if chi2_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
    return hi


def shard_state(s) -> tuple:
    """Everything of one shard that an applied call could change (copies)."""
    return (
        s.ring.write_pos,
        {k: v.copy() for k, v in s.ring.columns.items()},
        s.active.copy(),
        s.priority.copy(),
        s.sampler.tree.copy() if hasattr(s.sampler, "tree") else None,
        s.remover.tree.copy() if hasattr(s.remover, "tree") else None,
        len(s.index),
        s.max_priority,
    )


@contextlib.contextmanager
def registered_kinds(selector: dict | None = None, rate_limiter: dict | None = None):
    """Custom selector and limiter kinds registered for the block, removed after it: a registration left
    behind is shipped to every cluster later tests start, whose processes cannot import the tests' modules."""
    import gear_flow as gf
    from gear_flow.rate_limiters import REGISTRY as LIMITERS
    from gear_flow.selectors import REGISTRY as SELECTORS

    added = [(SELECTORS, k) for k in (selector or {}) if k not in SELECTORS]
    added += [(LIMITERS, k) for k in (rate_limiter or {}) if k not in LIMITERS]
    try:
        for kind, cls in (selector or {}).items():
            gf.register_selector(kind, cls)
        for kind, cls in (rate_limiter or {}).items():
            gf.register_rate_limiter(kind, cls)
        yield
    finally:
        for registry, kind in added:
            registry.pop(kind, None)


class Script:
    """A scripted executor for sans-I/O steps: answers each request with ``answers[kind](request)`` (None
    when the script has none for its kind) and records ``(kind, request)`` in order."""

    def __init__(self, **answers):
        self.answers = answers
        self.seen = []

    def __call__(self, req):
        kind = type(req).__name__
        self.seen.append((kind, req))
        return self.answers.get(kind, lambda r: None)(req)

    def kinds(self):
        return [k for k, _ in self.seen]


def delete_race(table, deleter, items: int = 80, seed: int = 0) -> tuple[list[int], list[int], list[str]]:
    """A producer inserting one-step items ``{"x": i}`` into ``table`` and deleting each on ``deleter`` (a
    handle of the same table) as soon as it is stored, while a consumer samples one at a time.

    Returns
    -------
    tuple of (list of int, list of int, list of str)
        The values the consumer got, in order; the values whose delete applied; the errors either met
        (a rate limiter's timeout is the workload's, not an error).
    """
    got, deleted, errors, done = [], [], [], threading.Event()
    rng = np.random.default_rng(seed)

    def producer():
        for i in range(items):
            try:
                k = np.asarray(table.insert({"x": np.full(1, i, np.float32)}, timeout=2).first_keys)[:1]
                if deleter.delete(k).applied == 1:
                    deleted.append(i)
            except RateLimitTimeout:
                pass
            except Exception as e:  # surfaced by the caller
                errors.append(repr(e))
            threading.Event().wait(float(rng.uniform(0, 0.01)))  # (the workload's pace, not a barrier)
        done.set()

    def consumer():
        while not done.is_set():
            try:
                got.extend(int(v) for v in table.sample(1, timeout=0.2)["x"].numpy().ravel())
            except RateLimitTimeout:
                pass
            except GearFlowError as e:  # EmptyTableError; a sample redone too often
                errors.append(repr(e))

    threads = [threading.Thread(target=f) for f in (producer, consumer)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    return got, deleted, errors


def owned_segments(pids) -> list[str]:
    """The names in /dev/shm owned by any of ``pids`` (:func:`gear_flow.storage.shared.segment_owner`), sorted."""
    from gear_flow.storage.shared import SHM_DIR, segment_owner

    pids = set(pids)
    return sorted(n for n in os.listdir(SHM_DIR) if segment_owner(n) in pids)


def killed_workers() -> list[int]:
    """The suite's forked workers that started and never ended normally: killed (by the test, or by their
    nanny when they did not close in time), so their shared-memory segments stay until a sweep."""
    return sorted(marked(".started") - marked(".exited"))


def marked(suffix: str) -> set[int]:
    """The pids with a mark ending in ``suffix`` (``.started``, ``.exited``) in the suite's marks directory
    (``GEAR_FLOW_TEST_MARKS``, set by conftest; ``forkserver_preload`` writes them)."""
    marks = os.environ.get("GEAR_FLOW_TEST_MARKS")
    if not marks or not os.path.isdir(marks):
        return set()
    return {int(n[: -len(suffix)]) for n in os.listdir(marks) if n.endswith(suffix)}
