"""Concurrent writers, samplers, priority updaters and deleters on one table of 2 shards
(a LocalTable, and a DistributedTable over two worker processes).

Every thread checks what it can on its own (sampled windows are checked from
the self-describing data alone, since a window may come from an episode whose
writer has not yet recorded it); at the end the counters must reconcile with
what the threads did.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import pytest
from helpers import episode, make_spec, reconcile

from gear_flow import (
    EmptyTableError,
    Fifo,
    LocalTable,
    MinHeap,
    MinSize,
    Prioritized,
    RateLimitTimeout,
    SampleToInsertRatio,
    TableClosedError,
)

DURATION = 1.0  # seconds per configuration, at least ...
MIN_WORK = 20  # ... and until every thread has done this many calls (the machine may be loaded)
CAP = 30.0  # but never longer than this


def check_batch(b, L: int, boundary: str) -> None:
    obs, ep, t, mask = b["obs"].numpy(), b["ep"].numpy(), b["t"].numpy(), b.mask.numpy()
    for r in range(len(b)):
        valid = np.flatnonzero(mask[r])
        assert len(valid) and np.array_equal(valid, np.arange(valid[0], valid[-1] + 1))
        if boundary == "strict":
            assert len(valid) == L
        tag = ep[r, valid[0]]
        assert tag > 0 and np.all(ep[r, valid] == tag)
        ts = t[r, valid]
        assert np.array_equal(ts, int(b.timesteps[r]) + np.arange(len(valid)))
        assert np.array_equal(obs[r, valid, 0], np.full(len(valid), tag, np.float32))
        assert np.array_equal(obs[r, valid, 1], ts.astype(np.float32))
        assert np.array_equal(obs[r, valid, 2], (1000 * tag + ts).astype(np.float32))
        assert not ep[r, ~mask[r]].any() and not obs[r, ~mask[r]].any()


CONFIGS = {  # factories: a rate limiter holds state
    "prioritized-fifo-minsize": lambda: dict(
        sampler=Prioritized(0.6, 0.4), remover=Fifo(), rate_limiter=MinSize(1), max_times_sampled=0
    ),
    "minheap-fifo-ratio-expiry": lambda: dict(  # heap sampling (MinHeap removers are refused: ring storage)
        sampler=MinHeap(), remover=Fifo(), rate_limiter=SampleToInsertRatio(4.0, 8, 400.0), max_times_sampled=6
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_concurrent_use(config, make_table):
    kw = CONFIGS[config]()
    t = make_table(make_spec(capacity=96, num_shards=2, max_size=150), seed=0, **kw)
    stop = threading.Event()
    errors: list[BaseException] = []
    recent: deque[int] = deque(maxlen=256)
    inserted = [0] * 3
    sampled = [0] * 2
    counts = {"updates": 0, "deletes": 0, "timeouts": 0}
    lock = threading.Lock()
    work = dict.fromkeys(["writer0", "writer1", "stream", "sampler0", "sampler1", "updater", "deleter"], 0)

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)
                stop.set()

        return run

    def writer(i):
        rng = np.random.default_rng(i)
        tag = (i + 1) * 1_000_000
        while not stop.is_set():
            eps = []
            for _ in range(int(rng.integers(1, 4))):
                tag += 1
                eps.append(episode(tag, int(rng.integers(1, 9))))
            try:
                r = t.insert(eps, priorities=float(rng.uniform(0.1, 5)), timeout=0.2)
                inserted[i] += r.num_items
            except RateLimitTimeout:
                with lock:
                    counts["timeouts"] += 1
            work[f"writer{i}"] += 1

    def streaming_writer():
        rng = np.random.default_rng(7)
        tag = 9_000_000
        w = t.writer(max_episode_length=6, timeout=0.2)
        before = len(w.ended)
        while not stop.is_set():
            tag += 1
            # n == 6 is ended by max_episode_length (truncated) inside append; longer
            # episodes would continue under a new episode id and break the data's encoding
            n = int(rng.integers(1, 7))
            ep = episode(tag, n)
            try:
                for j in range(n):  # the 6th step ends the episode inside append
                    w.append({k: v[j] for k, v in ep.items()}, priority=float(rng.uniform(0.1, 5)))
                w.end_episode()
            except RateLimitTimeout:
                w.discard()
                with lock:
                    counts["timeouts"] += 1
            work["stream"] += 1
        inserted[2] = sum(n for _, n, _ in w.ended[before:])

    def sampler(i):
        rng = np.random.default_rng(100 + i)
        while not stop.is_set():
            L = int(rng.integers(1, 5))
            boundary = ("strict", "pad_tail", "pad_head")[int(rng.integers(3))]
            try:
                b = t.sample(16, length=L, boundary=boundary, timeout=0.2)
            except (RateLimitTimeout, EmptyTableError):
                continue
            check_batch(b, L, boundary)
            sampled[i] += len(b)
            recent.extend(b.keys.tolist())
            work[f"sampler{i}"] += 1

    def updater():
        rng = np.random.default_rng(200)
        while not stop.is_set():
            keys = list(recent)[-32:]
            if not keys:
                time.sleep(0.001)
                continue
            res = t.update_priorities(keys, rng.uniform(0, 5, len(keys)))
            assert res.applied + res.stale == len(keys)
            with lock:
                counts["updates"] += 1
            work["updater"] += 1

    def deleter():
        rng = np.random.default_rng(300)
        while not stop.is_set():
            time.sleep(0.005)
            keys = list(recent)[-8:]
            if keys:
                res = t.delete(rng.choice(keys, 2))
                assert res.applied + res.stale == 2 or res.applied + res.stale == 1
                with lock:
                    counts["deletes"] += 1
                work["deleter"] += 1

    threads = [threading.Thread(target=guard(lambda i=i: writer(i)), daemon=True) for i in range(2)]
    threads += [threading.Thread(target=guard(streaming_writer), daemon=True)]
    threads += [threading.Thread(target=guard(lambda i=i: sampler(i)), daemon=True) for i in range(2)]
    threads += [
        threading.Thread(target=guard(updater), daemon=True),
        threading.Thread(target=guard(deleter), daemon=True),
    ]
    # compile / load every numba function first, so the threads run real work from the start
    warm = LocalTable(make_spec(capacity=32, num_shards=2), sampler=type(kw["sampler"])(), seed=1)
    warm.insert([episode(1, 5), episode(2, 3)])
    for boundary in ("strict", "pad_tail", "pad_head"):
        warm.sample(4, length=2, boundary=boundary)
    for th in threads:
        th.start()
    t0 = time.monotonic()
    while not stop.is_set() and time.monotonic() - t0 < CAP:
        if time.monotonic() - t0 >= DURATION and min(work.values()) >= MIN_WORK:
            break
        time.sleep(0.02)
    stop.set()
    for th in threads:
        th.join(20)
    assert not any(th.is_alive() for th in threads), "a thread hung (deadlock?)"
    assert not errors, errors
    tot = reconcile(t)
    assert tot["inserted"] == sum(inserted)
    assert tot["sampled"] == sum(sampled)
    limiter = t.info()["rate_limiter"]  # the table's global limiter (the coordinator's, when distributed)
    assert limiter["inserts"] == tot["inserted"]
    assert limiter["samples"] == tot["sampled"]
    assert t.size <= 150
    # every thread did real work
    assert min(inserted) > 0 and min(sampled) > 0
    assert counts["updates"] > 0 and counts["deletes"] > 0, (counts, inserted, sampled)
    assert tot["removed"] + tot["evicted"] > 0


def test_consumers_of_a_table_emptied_under_them_wait_for_the_next_item_and_never_find_it_empty():
    """Three consumers of a max_times_sampled=1 Fifo table fed one item at a time: a consumer admitted while
    the item was there and beaten to it (expired by another's sample before it had the shard's lock) waits
    for the next insert, as a batch short of items does: it never raises EmptyTableError, and every item
    goes exactly once."""
    spec = make_spec(capacity=64, max_size=8)
    t = LocalTable(spec, sampler=Fifo(), remover=Fifo(), max_times_sampled=1, rate_limiter=MinSize(1), seed=0)
    n, got, errors = 200, [], []

    def consumer():
        while True:
            try:
                got.append(int(t.sample(1, timeout=30)["ep"].numpy()[0, 0]))
            except TableClosedError:
                return
            except Exception as e:  # noqa: BLE001  (any error is the failure)
                errors.append(repr(e))
                return

    threads = [threading.Thread(target=consumer) for _ in range(3)]
    for th in threads:
        th.start()
    for i in range(n):
        t.insert(episode(i, 1))
        while t.size and not errors:  # the item taken before the next (the consumers race for each one)
            time.sleep(0)
    t.close()
    for th in threads:
        th.join()
    assert errors == []
    assert sorted(got) == list(range(n)) and len(got) == n
