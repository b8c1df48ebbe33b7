"""A KeyboardInterrupt (a notebook's interrupt, Ctrl-C) raised in a LocalTable call while it waits leaves the
table as if the call had not been made: no lock kept, nothing counted, later calls served.

The interrupt is a real SIGINT sent to the main thread once it is seen blocked (its stack inside the wait),
while another thread holds the shard lock it waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time

import numpy as np
import pytest
from dist_support import coordinator, wait_for
from helpers import episode, make_spec

import gear_flow as gf
from gear_flow.errors import HeldInterrupt
from gear_flow.table.admission import acquire_all

pytestmark = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="a signal's handler runs in the main thread"
)


@pytest.fixture(autouse=True)
def _python_sigint_handler():
    """Python's own SIGINT handler (raises KeyboardInterrupt) for the test: something imported earlier in the
    same process may have put another there (dask_jobqueue's runner: sys.exit)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _interrupt_once_blocked_in(func_name: str, timeout: float = 30.0) -> threading.Thread:
    """A thread that sends SIGINT to the main thread once the main thread's stack is in ``func_name``."""
    main = threading.main_thread().ident
    seen = threading.Event()

    def watch():
        while not seen.wait(0.002):  # (polls the main thread's stack: it blocks in a lock, nothing to notify)
            frame = sys._current_frames().get(main)
            while frame is not None:
                if frame.f_code.co_name == func_name:
                    seen.set()
                    signal.pthread_kill(main, signal.SIGINT)
                    return
                frame = frame.f_back

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


class _Holder:
    """Holds a shard's lock on its own thread until released."""

    def __init__(self, lock):
        self.taken, self.go = threading.Event(), threading.Event()
        self.th = threading.Thread(target=self._run, args=(lock,), daemon=True)
        self.th.start()
        assert self.taken.wait(10)

    def _run(self, lock):
        with lock:
            self.taken.set()
            self.go.wait(60)

    def release(self):
        self.go.set()
        self.th.join(10)


def _free(lock) -> bool:
    """Whether another thread can take ``lock`` now (the main thread does not hold it)."""
    out = []
    th = threading.Thread(target=lambda: out.append(lock.acquire(timeout=5) and (lock.release() or True)))
    th.start()
    th.join(10)
    return out == [True]


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_sample_interrupted_while_it_waits_for_a_shards_lock_keeps_no_lock_and_counts_nothing(tier, tmp_path):
    """A sample interrupted while it waited for shard 1's lock (held by a long insert) kept shard 0's lock for
    good, so every later call hung (a sample with timeout=1 still waiting after 10 s), and the limiter counted
    the batch it never took: on a Queue an item was left that no sample could take."""
    kw = {"tier": "disk", "path": tmp_path / "t"} if tier == "disk" else {}
    t = gf.LocalTable.queue(make_spec(capacity=64, num_shards=2), 100, **kw)
    t.insert([episode(1, 3)], shard=0)
    before = dict(vars(t.rate_limiter.state))
    holder = _Holder(t.shards[1].lock)
    watcher = _interrupt_once_blocked_in(acquire_all.__name__)
    try:
        with pytest.raises(KeyboardInterrupt):
            t.sample(1)
    finally:
        watcher.join(10)
        holder.release()
    assert _free(t.shards[0].lock) and _free(t.shards[1].lock)
    assert dict(vars(t.rate_limiter.state)) == before
    got = [
        int(t.sample(1, timeout=5).timesteps.numpy().ravel()[0]) for _ in range(3)
    ]  # every item still goes out, in order
    assert got == [0, 1, 2] and t.size == 0
    t.close()


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_an_insert_interrupted_while_it_waits_for_a_shards_lock_counts_nothing(tier, tmp_path):
    """An insert interrupted while it waited for its shard's lock (held by a long sample's gather) stayed
    counted: the limiter's inserts and the items in flight one item above what the table stored, for good (the
    limiter then admitted against a size the table never reached)."""
    kw = {"tier": "disk", "path": tmp_path / "t"} if tier == "disk" else {}
    t = gf.LocalTable(make_spec(capacity=64, num_shards=1), rate_limiter=gf.SampleToInsertRatio(1.0, 1, 3.0), **kw)
    step = episode(1, 1)
    t.insert([step])
    before = dict(vars(t.rate_limiter.state))
    holder = _Holder(t.shards[0].lock)
    watcher = _interrupt_once_blocked_in(acquire_all.__name__)
    try:
        with pytest.raises(KeyboardInterrupt):
            t.insert([step])
    finally:
        watcher.join(10)
        holder.release()
    assert _free(t.shards[0].lock)
    assert dict(vars(t.rate_limiter.state)) == before
    assert t._admission.in_flight == 0 and t.admitted_size == t.size == 1
    for _ in range(3):  # the limiter's 3 inserts ahead of the samples, all there to take
        t.insert([step], timeout=5)
    assert t.size == 4 and dict(vars(t.rate_limiter.state))["inserts"] == before["inserts"] + 3
    t.close()


def _signalled_as_it_runs(monkeypatch, cls, name: str) -> list:
    """Wrap method ``cls.name`` so that its first run sends SIGINT to the main thread and then goes on: the
    interrupt lands at its next call, inside that step of a table's call (where a Ctrl-C can land)."""
    real, main, sent = getattr(cls, name), threading.main_thread().ident, []

    def step(self, *args, **kwargs):
        if not sent and threading.get_ident() == main:
            sent.append(name)
            signal.pthread_kill(main, signal.SIGINT)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, step)
    return sent


def test_a_prioritized_insert_interrupted_in_its_sum_tree_repair_is_stored_whole(monkeypatch):
    """A Ctrl-C that landed in an insert's sum-tree repair (SumTree._apply_pending) left the tree's inner sums
    stale for good: the draws and the probabilities they reported no longer matched the priorities.  The
    insert's steps hold the interrupt: it is raised once the insert is stored whole."""
    from gear_flow.selectors.trees import SumTree

    t = gf.LocalTable(make_spec(capacity=64, num_shards=1), sampler=gf.Prioritized(1.0))
    t.insert([episode(i, 1) for i in range(3)])
    # the next cell of a notebook: its kernel puts Python's own handler back in for each cell it runs
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sent = _signalled_as_it_runs(monkeypatch, SumTree, "_apply_pending")
    with pytest.raises(HeldInterrupt) as held:  # (a KeyboardInterrupt: the insert is done)
        t.insert([episode(3, 1)])
    monkeypatch.undo()
    assert sent == ["_apply_pending"] and held.value.result.episode_ids.tolist() == [3]
    assert t.size == 4 and t.info()["rate_limiter"]["inserts"] == 4
    b = t.sample(400)
    assert np.allclose(b.probabilities.numpy(), 0.25)  # four equal priorities (before: 1/3, the root stale)
    assert sorted(set(b.data["ep"].numpy().ravel().tolist())) == [0, 1, 2, 3]
    t.close()


def test_a_queue_sample_interrupted_in_its_commit_takes_its_item_once(monkeypatch):
    """A Ctrl-C that landed in a Queue sample's commit (Shard._drop_items) left the item taken but counted:
    the table's size one above its items for good, and the next sample of the last item waited out its
    timeout.  The sample's steps hold the interrupt: it is raised once the item is taken and counted."""
    from gear_flow.shard import Shard

    q = gf.LocalTable.queue(make_spec(capacity=64, num_shards=1), 16)
    q.insert([episode(i, 1) for i in range(3)])
    sent = _signalled_as_it_runs(monkeypatch, Shard, "_drop_items")
    with pytest.raises(HeldInterrupt) as held:
        q.sample(1)
    monkeypatch.undo()
    assert sent == ["_drop_items"] and q.size == 2
    assert held.value.result.data["ep"].numpy().ravel().tolist() == [0]  # its batch, for a caller that wants it
    got = [int(q.sample(1, timeout=5).data["ep"].numpy().ravel()[0]) for _ in range(2)]
    assert got == [1, 2] and q.size == 0  # in order, the interrupted call's item 0 taken once
    q.insert([episode(9, 1)])
    assert q.sample(1, timeout=5).data["ep"].numpy().ravel().tolist() == [9]
    q.close()


def test_a_table_leaves_a_programs_own_sigint_handler_alone():
    """A table's call puts its handler in only in place of Python's own: one of the program's is left as it is
    (it decides what a Ctrl-C does).  Outside a call, its handler raises at once, as Python's own."""

    def own(signum, frame):
        raise SystemExit(1)

    signal.signal(signal.SIGINT, own)
    t = gf.LocalTable(make_spec(capacity=8, num_shards=1))
    t.insert([episode(1, 2)])
    t.sample(2)
    assert signal.getsignal(signal.SIGINT) is own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t.sample(2)
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    t.close()


@pytest.mark.parametrize("call", ["insert", "sample"])
def test_an_interrupt_held_before_a_calls_wait_comes_while_it_waits_and_leaves_nothing(call):
    """A SIGINT that found a call's section before its admission wait (the limiter's check, or the wait for
    the table's condition while other threads are busy) was held through the whole wait: it came only when
    another thread made room (3 s in the hunt), and then after the call went through, an item taken for
    nobody.  The wait raises a held interrupt at its next turn: the call leaves its line, as interrupted
    while it waits."""
    q = gf.LocalTable.queue(make_spec(capacity=64, num_shards=1), 2)
    q.insert([episode(100, 1)])
    q.sample(1)  # (a first call's set-up done)
    main = threading.main_thread().ident
    if call == "insert":
        q.insert([episode(1, 1), episode(2, 1)])  # full
        real = q.rate_limiter.check_insert_size

        def check(k):  # in the insert's section, before its wait
            signal.pthread_kill(main, signal.SIGINT)
            return real(k)

        q.rate_limiter.check_insert_size = check
        go = lambda: q.insert([episode(3, 1)], timeout=20)  # noqa: E731
    else:
        real = q._can_sample

        def check(B):  # in the sample's section, before its wait (an empty Queue)
            q._can_sample = real
            signal.pthread_kill(main, signal.SIGINT)
            return real(B)

        q._can_sample = check
        go = lambda: q.sample(1, timeout=20)  # noqa: E731
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as got:
        go()
    assert type(got.value) is KeyboardInterrupt and time.monotonic() - start < 5  # (before: 20 s, its timeout)
    if call == "insert":
        q.rate_limiter.check_insert_size = real
        assert q.info()["waiting"]["inserts"] == 0
        assert [int(q.sample(1, timeout=5).data["ep"].numpy().ravel()[0]) for _ in range(2)] == [1, 2]
        assert q.size == 0  # the interrupted insert stored nothing
    else:
        assert q.info()["waiting"]["samples"] == 0
        q.insert([episode(7, 1)])
        assert q.sample(1, timeout=5).data["ep"].numpy().ravel().tolist() == [7]  # to the next sample
    q.close()


def test_an_interrupt_as_a_woken_wait_retakes_the_tables_lock_keeps_the_lock_with_its_holder():
    """A sample waiting for an item, woken by an insert that still held the table's condition (waiting for a
    shard's lock), was interrupted as it re-took the condition's lock inside ``Condition.wait``: let in there,
    the KeyboardInterrupt left without the lock, and the sample then released the inserting thread's lock;
    that insert died with ``RuntimeError: release unlocked lock``, keeping a shard's lock for good and its
    items counted (a hunt's repro: 11 of 11).  Held, the interrupt is raised at the wait's next turn with
    the lock taken back."""
    from gear_flow.interrupts import _SECTIONS

    t = gf.LocalTable(make_spec(capacity=64, num_shards=1))
    t.insert([episode(100, 1)])
    t.delete(t.sample(1).keys.numpy())  # (a first call's set-up done; empty again)
    main, shard = threading.main_thread().ident, _Holder(t.shards[0].lock)  # (as a disk table's flush holds it)
    done = []

    def insert():
        try:
            done.append(t.insert([episode(1, 1)], timeout=20))
        except BaseException as e:  # noqa: BLE001 - what the test reports
            done.append(e)

    def in_(ident, name) -> bool:
        f = sys._current_frames().get(ident)
        while f is not None:
            if f.f_code.co_name == name:
                return True
            f = f.f_back
        return False

    def drive():
        wait_for(lambda: t._admission.waiting("sample") == 1, "the sample to wait")  # (info waits for the shard)
        inserter = threading.Thread(target=insert, daemon=True)
        inserter.start()  # it admits (waking the sample), then waits for the shard's lock holding the condition
        wait_for(lambda: in_(inserter.ident, acquire_all.__name__), "the insert to wait for the shard's lock")
        wait_for(lambda: in_(main, "_acquire_restore"), "the woken sample to wait for the condition's lock")
        # the signal handled (held, or raised out of the wait) before the insert can let go of the lock; one that
        # comes as the frame is entered, before its acquire blocks, is handled only once the acquire returns: sent
        # again then (signals of one kind coalesce: the handler runs once)
        handled = lambda: _SECTIONS.pending is not None or not in_(main, "_acquire_restore")  # noqa: E731
        for _ in range(100):
            signal.pthread_kill(main, signal.SIGINT)
            end = time.monotonic() + 0.2
            while not handled() and time.monotonic() < end:
                time.sleep(0.002)  # (polls what the handler sets)
            if handled():
                break
        shard.release()

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    with pytest.raises(KeyboardInterrupt) as got:
        t.sample(1, timeout=20)
    driver.join(30)
    wait_for(lambda: done, "the insert to end")
    assert type(got.value) is KeyboardInterrupt
    assert not isinstance(done[0], BaseException), done[0]
    assert _free(t.shards[0].lock) and t.size == 1 and t._admission.in_flight == 0
    assert t.sample(1, timeout=5).data["ep"].numpy().ravel().tolist() == [1]
    t.close()


def test_a_writers_episode_stored_before_the_interrupt_is_not_buffered_again(monkeypatch):
    """An episode whose insert held a SIGINT to its end was stored, but the writer kept its steps buffered
    (the KeyboardInterrupt came before it cleared them): its retry, as the docstring invites, stored the
    episode twice (a hunt: 6 steps for 3 appended).  The HeldInterrupt says the insert is done, and the
    writer clears the steps it stored."""
    from gear_flow.shard import Shard

    t = gf.LocalTable(make_spec(capacity=64, num_shards=1))
    w = t.writer()
    steps = episode(5, 3)
    for i in range(3):
        w.append({k: v[i] for k, v in steps.items()})
    sent = _signalled_as_it_runs(monkeypatch, Shard, "insert")  # in the insert's section, once admitted
    with pytest.raises(HeldInterrupt) as held:
        w.end_episode()
    monkeypatch.undo()
    assert sent == ["insert"] and w.pending == 0 and t.size == 3
    assert [e[0] for e in w.ended] == held.value.result.episode_ids.tolist()
    assert w.end_episode() is None and t.size == 3  # nothing left to store twice
    t.close()


def test_an_interrupt_just_after_a_calls_change_still_reaches_the_caller_with_its_answer(monkeypatch):
    """A SIGINT that came once a Queue sample had taken its item, while the call built its batch (or as a
    writer cleared the steps its insert had stored), found no section: a plain KeyboardInterrupt, the item
    lost (or the steps kept, for a retry to store twice).  The whole call is the section: the interrupt comes
    as a HeldInterrupt with the batch, and the writer's steps leave with their insert."""
    from gear_flow.sample import SampleBuffers
    from gear_flow.writers.buffer import StepBuffer

    q = gf.LocalTable.queue(make_spec(capacity=64, num_shards=1), 8)
    q.insert([episode(i, 1) for i in range(2)])
    sent = _signalled_as_it_runs(monkeypatch, SampleBuffers, "batch")  # the item taken, the batch being built
    with pytest.raises(HeldInterrupt) as held:
        q.sample(1)
    monkeypatch.undo()
    assert sent == ["batch"] and held.value.result.data["ep"].numpy().ravel().tolist() == [0]
    assert q.sample(1, timeout=5).data["ep"].numpy().ravel().tolist() == [1]
    q.close()

    t = gf.LocalTable(make_spec(capacity=64, num_shards=1))
    w, steps = t.writer(), episode(5, 3)
    for i in range(3):
        w.append({k: v[i] for k, v in steps.items()})
    sent = _signalled_as_it_runs(monkeypatch, StepBuffer, "clear")  # stored, the steps leaving the buffer
    with pytest.raises(HeldInterrupt):
        w.end_episode()
    monkeypatch.undo()
    assert sent == ["clear"] and w.pending == 0 and t.size == 3
    assert w.end_episode() is None and t.size == 3
    t.close()


@pytest.mark.parametrize("kind", ["episode", "trajectory", "vector"])
def test_every_writers_rows_leave_it_with_the_insert_that_stored_them(monkeypatch, kind):
    """A writer's insert that held a SIGINT to its end raised a HeldInterrupt before the writer let go of the
    rows it stored (a TrajectoryWriter's chunk, a VectorWriter's ended episodes): the next flush or
    end_episode stored them again.  Each writer's insert and its letting go are one section."""
    from gear_flow.shard import Shard

    t = gf.LocalTable(make_spec(capacity=64, num_shards=1))
    steps = episode(5, 2)
    one = [{k: v[i] for k, v in steps.items()} for i in range(2)]
    if kind == "vector":
        w = gf.VectorWriter(t, 2)
        w.append({k: np.stack([v, v]) for k, v in one[0].items()})
        last = lambda: w.append({k: np.stack([v, v]) for k, v in one[1].items()}, done=[True, True])  # noqa: E731
        again = w.flush
    else:
        w = t.writer() if kind == "episode" else gf.TrajectoryWriter(t, chunk_length=8, overlap=1)
        w.append(one[0])
        w.append(one[1])
        last = again = w.end_episode
    sent = _signalled_as_it_runs(monkeypatch, Shard, "insert")  # in the table's insert, once admitted
    with pytest.raises(HeldInterrupt):
        last()
    monkeypatch.undo()
    stored = t.size
    assert sent == ["insert"] and stored == (4 if kind == "vector" else 2)
    again()  # (a retry, or the next chunk's flush)
    assert t.size == stored and t.info()["totals"]["inserted"] == stored  # stored once
    t.close()


def test_a_trajectory_writers_append_that_stored_a_full_chunk_keeps_its_step_when_interrupted(monkeypatch):
    """An append that inserts the full chunk first, interrupted while that insert changed the table, raised the
    HeldInterrupt ("the call is done") before buffering its own step: the step was left out for good, as
    nobody retries a done call (a hunt: 3 of 4 steps stored).  The step is buffered before the interrupt
    comes."""
    from gear_flow.shard import Shard

    t = gf.LocalTable.queue(make_spec(capacity=64, num_shards=1), 8)
    steps = episode(5, 4)
    one = [{k: v[i] for k, v in steps.items()} for i in range(4)]
    w = gf.TrajectoryWriter(t, chunk_length=3, overlap=0)
    for step in one[:3]:
        w.append(step)
    sent = _signalled_as_it_runs(monkeypatch, Shard, "insert")  # in the chunk's insert, once admitted
    with pytest.raises(HeldInterrupt):
        w.append(one[3])
    monkeypatch.undo()
    assert sent == ["insert"] and t.size == 3 and w.pending == 1
    w.end_episode()
    assert [t.sample(1, timeout=5).data["t"].numpy().ravel().tolist()[0] for _ in range(4)] == [0, 1, 2, 3]
    assert t.size == 0 and [n for _, n in w.chunks] == [3, 1]
    t.close()


class _SignalledList(list):
    """A list whose first ``extend`` sends SIGINT to the main thread first (it lands there, before the items go
    in)."""

    sent = False

    def extend(self, items):
        if not self.sent:
            self.sent = True
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        super().extend(items)


def test_a_vector_writers_step_and_the_end_it_marks_are_kept_together_when_interrupted(monkeypatch):
    """A VectorWriter's append interrupted after it buffered the step but before it marked the episodes the
    step ends: a plain KeyboardInterrupt with the step kept and its ``done`` forgotten, so neither retry was
    right (a flush stored nothing; appending the step again buffered it twice) and the episode was never
    stored (a hunt).  The two are one section: the interrupt comes once both are done.  And an append whose
    first flush of episodes ended before is interrupted once they went in buffers its step before the
    HeldInterrupt comes, as a done call must."""
    from gear_flow.shard import Shard

    t = gf.LocalTable.queue(make_spec(capacity=64, num_shards=1), 16)
    w, e = gf.VectorWriter(t, 1), episode(10, 3)
    for j in range(2):
        w.append({k: v[j : j + 1] for k, v in e.items()})
    w._ending = _SignalledList()
    with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
        w.append({k: v[2:3] for k, v in e.items()}, done=[True])
    assert type(got.value) is HeldInterrupt and w.pending.tolist() == [3] and list(w._ending) == [(0, False)]

    sent = _signalled_as_it_runs(monkeypatch, Shard, "insert")  # as this append first inserts the ended episode
    nxt = episode(20, 2)
    with pytest.raises(HeldInterrupt):
        w.append({k: v[0:1] for k, v in nxt.items()})
    monkeypatch.undo()
    assert sent == ["insert"] and t.size == 3 and w.pending.tolist() == [1]
    w.append({k: v[1:2] for k, v in nxt.items()}, done=[True])
    got = [t.sample(1, timeout=5).data for _ in range(5)]
    assert [(int(b["ep"].numpy().ravel()[0]), int(b["t"].numpy().ravel()[0])) for b in got] == [
        (10, 0), (10, 1), (10, 2), (20, 0), (20, 1),
    ]  # fmt: skip
    assert [(env, n) for env, _, n, _ in w.ended] == [(0, 3), (0, 2)] and t.size == 0
    t.close()


def _interrupt_once(pred, timeout: float = 60.0) -> threading.Thread:
    """A thread that sends SIGINT to the main thread once ``pred()`` holds (the call is seen waiting)."""
    main = threading.main_thread().ident

    def watch():
        end = time.monotonic() + timeout
        while not pred() and time.monotonic() < end:
            time.sleep(0.01)  # polling what the table reports, not a barrier
        signal.pthread_kill(main, signal.SIGINT)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th


def test_a_sample_interrupted_while_it_waits_for_an_empty_queue_is_withdrawn(make_table):
    """A distributed sample interrupted while it waited at the coordinator (an empty Queue) stayed in the
    coordinator's line: the next insert's item was granted to it, counted as handed out to nobody, and the
    next sample waited out its timeout with the item stored.  It is withdrawn: the next item goes to the next
    sample, and the limiter counts only the samples served."""
    t = make_table.queue(make_spec(capacity=64, num_shards=2), 4)
    t.insert([episode(1, 1)])
    assert t.sample(1, timeout=10).timesteps.numpy().ravel().tolist() == [0]  # (a first call's set-up done)
    samples = t.info()["rate_limiter"]["samples"]
    watcher = _interrupt_once(lambda: t.info()["waiting"]["samples"] == 1)
    try:
        with pytest.raises(KeyboardInterrupt):
            t.sample(1, timeout=60)
    finally:
        watcher.join(70)
    wait_for(lambda: t.info()["waiting"]["samples"] == 0, "the interrupted sample to leave the line", 20)
    t.insert([episode(7, 1)])
    got = t.sample(1, timeout=10)
    assert got.data["ep"].numpy().ravel().tolist() == [7]
    assert t.info()["rate_limiter"]["samples"] == samples + 1 and t.size == 0


def test_cancelled_distributed_calls_waiting_at_the_coordinator_are_withdrawn(dist_client):
    """A ``sample_async`` cancelled while it waited for an empty Queue, and an ``insert_async`` cancelled while
    it waited for room in a full one, stayed in the coordinator's lines: the next item was granted to the
    abandoned sample (the next sample then timed out with the item stored), and the abandoned insert was
    admitted once room was made, so the queue counted as full for good (the next insert timed out)."""
    from gear_flow.distributed import DistributedTable

    spec = make_spec(capacity=64, num_shards=2)
    t = DistributedTable.queue(dist_client, spec, 2)
    lines = coordinator(t, blocking=False)

    async def cancelled_while_waiting(call, kind):
        task = asyncio.ensure_future(call)
        while (await lines.lookup())["waiting"][kind] == 0:
            await asyncio.sleep(0.01)  # polling the coordinator's line, not a barrier
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        end = time.monotonic() + 20  # well before the call's own timeout would take it out of the line
        while (await lines.lookup())["waiting"][kind]:
            assert time.monotonic() < end, f"the cancelled call stayed in the coordinator's line of {kind}"
            await asyncio.sleep(0.01)

    try:
        dist_client.sync(cancelled_while_waiting, t.sample_async(1, timeout=60), "samples")
        t.insert([episode(1, 1)])
        assert t.sample(1, timeout=10).data["ep"].numpy().ravel().tolist() == [1]
        t.insert([episode(2, 1), episode(3, 1)])  # full
        dist_client.sync(cancelled_while_waiting, t.insert_async([episode(4, 1)], timeout=60), "inserts")
        assert t.sample(1, timeout=10).data["ep"].numpy().ravel().tolist() == [2]
        t.insert([episode(5, 1)], timeout=10)  # the room the sample made, not taken by the cancelled insert
        got = [t.sample(1, timeout=10).data["ep"].numpy().ravel().tolist() for _ in range(2)]
        assert got == [[3], [5]] and t.size == 0
        state = t.info()["rate_limiter"]
        assert (state["inserts"], state["samples"]) == (4, 4)
    finally:
        t.close()


def _cancel_once_answered(monkeypatch, module, op, commit=None):
    """Wrap ``module.call`` (a worker request) so that the task set in the returned dict is cancelled once a
    request ``op`` (with ``commit`` when given) has been answered: as ``asyncio.wait_for`` timing out while the
    replies come back."""
    real, target = module.call, {}

    async def call(ctx, addr, what, **kw):
        got = await real(ctx, addr, what, **kw)
        if what == op and (commit is None or kw.get("commit") == commit) and target.get("task") is not None:
            target.pop("task").cancel()
        return got

    monkeypatch.setattr(module, "call", call)
    return target


def _run_cancelled(client, target, call):
    """``call()``'s coroutine run as the task ``target`` names (the wrapped request cancels it): its answer, or
    ``"cancelled"``."""

    async def run():
        target["task"] = task = asyncio.ensure_future(call())
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"

    return client.sync(run)


def _settled(t, n):
    info = t.info()
    return (info["size"], info["coordinator_size"], info["waiting"]) == (n, n, {"inserts": 0, "samples": 0})


def test_an_insert_cancelled_once_its_parts_are_applied_is_committed(dist_client, monkeypatch):
    """An ``insert_async`` cancelled while its apply replies came back (a two-worker insert) was neither
    committed nor aborted: its items stayed on the workers uncounted by the coordinator, and its open
    transaction kept the Queue's horizon below them, so nothing was handed out again (the next sample timed
    out).  Begun, the apply goes to its end and the insert is committed: the cancel came too late, and the
    call returns what it stored."""
    from gear_flow.distributed import DistributedTable, transactions

    t = DistributedTable.queue(dist_client, make_spec(capacity=64, num_shards=2), 8)
    try:
        target = _cancel_once_answered(monkeypatch, transactions, "apply")

        got = _run_cancelled(dist_client, target, lambda: t.insert_async([episode(i, 1) for i in (10, 11, 12, 13)]))
        assert "task" not in target and _settled(t, 4), t.info()  # (workers and coordinator agree)
        assert got != "cancelled" and got.num_items == 4 and sorted(set(got.shards.tolist())) == [0, 1]
        assert t.info()["rate_limiter"]["inserts"] == 4
        assert [t.sample(1, timeout=10).data["ep"].numpy().ravel().tolist() for _ in range(4)] == [
            [10],
            [11],
            [12],
            [13],
        ]
    finally:
        t.close()


def test_a_queue_sample_cancelled_once_a_worker_committed_it_returns_its_batch(dist_client, monkeypatch):
    """A Queue's ``sample_async`` cancelled once one worker had committed its part of the batch (its items
    handed out) gave its grant back as if nothing had been: those items were delivered to nobody, and the
    coordinator went on counting them (2 items stored on the workers, 4 at the coordinator).  Begun, the
    commit goes to its end and the batch is returned: every item goes out once, in order."""
    from gear_flow.distributed import DistributedTable, transport

    t = DistributedTable.queue(dist_client, make_spec(capacity=64, num_shards=2), 8)
    try:
        t.insert([episode(i, 1) for i in (10, 11, 12, 13)])
        target = _cancel_once_answered(monkeypatch, transport, "finish_sample", commit=True)

        got = _run_cancelled(dist_client, target, lambda: t.sample_async(2, timeout=10))
        assert "task" not in target and _settled(t, 2), t.info()  # (workers and coordinator agree)
        assert got != "cancelled" and got.data["ep"].numpy().ravel().tolist() == [10, 11]
        assert t.info()["rate_limiter"]["samples"] == 2
        assert [t.sample(1, timeout=10).data["ep"].numpy().ravel().tolist() for _ in range(2)] == [[12], [13]]
    finally:
        t.close()


def _interrupt_at(monkeypatch, where: str) -> list:
    """A real SIGINT to this (main) thread at one point of a blocking distributed insert over the workers'
    lanes; the returned list gets ``where`` once it was sent.

    ``parts``: in the insert's own steps, after its admission, while its parts are cut (no request under way);
    ``write``, ``apply``: once the workers' replies to that request were read; ``commit``: as the commit is
    about to go to the coordinator."""
    from gear_flow.distributed import thread_insert, writes
    from gear_flow.distributed.transport import CoordinatorClient

    fired = []

    def fire():
        if not fired and threading.current_thread() is threading.main_thread():
            fired.append(where)
            signal.raise_signal(signal.SIGINT)

    if where == "parts":
        real_parts = writes.insert_parts

        def insert_parts(*args, **kw):
            fire()
            return real_parts(*args, **kw)

        monkeypatch.setattr(writes, "insert_parts", insert_parts)
    elif where in ("write", "apply"):
        real_lanes = thread_insert._over_lanes

        def over_lanes(table, requests):
            got = real_lanes(table, requests)
            if any(op == where for _, op, _ in requests):
                fire()
            return got

        monkeypatch.setattr(thread_insert, "_over_lanes", over_lanes)
    else:
        real_commit = CoordinatorClient.commit_insert

        def commit_insert(self, *args, **kw):
            if self.blocking:
                fire()
            return real_commit(self, *args, **kw)

        monkeypatch.setattr(CoordinatorClient, "commit_insert", commit_insert)
    return fired


@contextlib.contextmanager
def _queue(client, over_lanes: bool):
    """A 2-shard Queue of 16 (closed after) whose blocking inserts go from the caller's thread over its workers'
    lanes (``over_lanes``: each worker's lane learnt by an insert to its shard, then an insert in the thread;
    items 1 to 4), or by the event loop (no lane; empty)."""
    import dask

    from gear_flow.distributed import DistributedTable

    lanes = {"gear-flow.distributed.shared-memory": False, "gear-flow.distributed.tcp-lane": over_lanes}
    with dask.config.set(lanes):
        t = DistributedTable.queue(client, make_spec(capacity=64, num_shards=2), 16, timeout=10)
        try:
            if over_lanes:
                t.insert([episode(1, 1)], shard=0)  # (the event loop's path: each learns its worker's lane)
                t.insert([episode(2, 1)], shard=1)
                t.insert([episode(3, 1), episode(4, 1)])
                assert t.stats["insert_in_thread"] == 1
            yield t
        finally:
            t.close()


def _stored_items(t, n: int) -> list[int]:
    """Every item of a Queue table ``t`` once ``n`` are stored and counted: its ``ep``, in order (the next
    sample waits for an item the workers or the coordinator miss)."""
    wait_for(lambda: _settled(t, n) and t.info()["inserts_in_flight"] == 0, "workers and coordinator to agree", 20)
    return [t.sample(1).data["ep"].numpy().ravel().tolist()[0] for _ in range(n)]


@pytest.mark.parametrize("where", ["parts", "write", "apply", "commit"])
def test_a_blocking_insert_interrupted_midway_leaves_workers_and_coordinator_agreeing(dist_client, monkeypatch, where):
    """A blocking insert sent over the workers' lanes from the caller's thread, interrupted by a SIGINT in the
    middle: in its own steps after its admission, it stayed in flight at the coordinator for good (the
    queue's next items never went out); once its single worker had written its part, its admission was given
    back with the items stored (2 more on the workers than the coordinator counted); once its workers had
    applied, or just before its commit, it was never committed (in flight for good, its items uncounted).
    Interrupted in its own steps, it is given back; interrupted once the workers may hold its items, it is
    finished in the background, stored and counted; the caller gets the KeyboardInterrupt either way (one
    holding the insert's end, its result once stored, when it goes on), and every item goes out once, in
    order."""
    from gear_flow.errors import InterruptedInFlight

    with _queue(dist_client, over_lanes=True) as t:
        fired = _interrupt_at(monkeypatch, where)
        with pytest.raises(KeyboardInterrupt) as got:
            t.insert([episode(10, 1), episode(11, 1)], shard=0 if where == "write" else None)
        assert fired == [where]
        monkeypatch.undo()
        stored = [] if where == "parts" else [10, 11]
        assert (type(got.value) is InterruptedInFlight) == bool(stored)
        if stored:
            assert got.value.outcome.result(timeout=20).num_items == 2
        n = 4 + len(stored)
        assert _stored_items(t, n) == [1, 2, 3, 4, *stored]
        t.insert([episode(12, 1)])
        assert t.sample(1).data["ep"].numpy().ravel().tolist() == [12]
        assert t.size == 0 and t.info()["rate_limiter"]["inserts"] == n + 1


def _writer_holding(t, kind: str):
    """A writer of ``kind`` of ``t`` holding 2 steps of episode 10 (a VectorWriter: of 2 environments), and its
    call that inserts them (ending the episode; a VectorWriter's last step) and the one that retries it."""
    steps = episode(10, 2)
    one = [{k: v[i] for k, v in steps.items()} for i in range(2)]
    if kind == "vector":
        w = gf.VectorWriter(t, 2)
        w.append({k: np.stack([v, v]) for k, v in one[0].items()})
        return w, lambda: w.append({k: np.stack([v, v]) for k, v in one[1].items()}, done=[True, True]), w.flush
    w = t.writer() if kind == "episode" else gf.TrajectoryWriter(t, chunk_length=8, overlap=1)
    for step in one:
        w.append(step)
    return w, w.end_episode, w.end_episode


@pytest.mark.parametrize(
    "kind, where",
    [("episode", "parts"), ("episode", "write"), ("episode", "commit"), ("trajectory", "commit"), ("vector", "commit")],
)
def test_every_writers_distributed_insert_interrupted_as_it_went_on_is_stored_once(
    dist_client, monkeypatch, kind, where
):
    """A writer's blocking distributed insert interrupted once its workers might hold its items (one writing
    the episode, or as the commit went to the coordinator; a VectorWriter's two episodes on two workers,
    staged and applied) went on to its end in the background, stored, but the caller got a plain
    KeyboardInterrupt, the call's word for "left nothing", and the writer kept the rows: the retry its
    docstring invites stored them twice (4 items for 2 appended).  The interrupt now carries the insert's
    end (:class:`~gear_flow.errors.InterruptedInFlight`); the writer waits for it, lets go of the rows it
    stored and raises a HeldInterrupt, as over a LocalTable.  Interrupted before anything was sent, the
    insert left nothing: a plain KeyboardInterrupt, the rows kept and stored once by the retry."""
    with _queue(dist_client, over_lanes=True) as t:
        w, last, again = _writer_holding(t, kind)
        fired = _interrupt_at(monkeypatch, where)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            last()
        monkeypatch.undo()
        stored = where != "parts"
        assert fired == [where] and type(got.value) is (HeldInterrupt if stored else KeyboardInterrupt)
        if kind == "episode":
            assert w.pending == (0 if stored else 2)
            if stored:
                assert [e[0] for e in w.ended] == got.value.result.episode_ids.tolist()
        again()  # the retry (the next flush): stores what is left, nothing twice
        n = 4 + (4 if kind == "vector" else 2)
        assert _stored_items(t, n) == [1, 2, 3, 4] + [10] * (n - 4)
        assert t.info()["rate_limiter"]["inserts"] == n  # (each stored once)


@pytest.mark.parametrize("kind", ["episode", "trajectory", "vector"])
def test_a_writers_insert_interrupted_again_while_it_is_awaited_is_settled_by_the_writers_next_call(
    dist_client, monkeypatch, kind
):
    """A second interrupt while a writer waited for the end of its insert (interrupted as the commit went,
    finished in the background) came at once, the rows kept: the insert then stored them, and the retry the
    docstrings invite stored them again (4 items for 2 appended; a VectorWriter's two episodes, 8 for 4).
    The writer's next call now waits for that end first, and lets go of what it stored."""
    from gear_flow.distributed import thread_insert
    from gear_flow.errors import InterruptedInFlight

    main, real_finish, seen = threading.main_thread().ident, thread_insert._finish, []

    def waiting_in(caller: str) -> bool:  # whether the main thread waits on a future's result in `caller`
        f = sys._current_frames().get(main)
        while f is not None and f.f_code.co_name != "result":
            f = f.f_back
        names = []
        while f is not None and len(names) < 3:  # (the wait, its helper, the caller)
            names.append(f.f_code.co_name)
            f = f.f_back
        return caller in names

    def interrupt_again():  # (the loop's executor: the insert's end waits for it)
        end = time.monotonic() + 20
        while not waiting_in("_table_insert") and time.monotonic() < end:
            time.sleep(0.002)  # polls the main thread's stack: it blocks on a lock, nothing to notify
        seen.append(waiting_in("_table_insert"))
        signal.pthread_kill(main, signal.SIGINT)
        while waiting_in("_table_insert") and time.monotonic() < end:
            time.sleep(0.002)

    async def finish(*args):
        await asyncio.get_running_loop().run_in_executor(None, interrupt_again)
        return await real_finish(*args)

    with _queue(dist_client, over_lanes=True) as t:
        w, last, again = _writer_holding(t, kind)
        fired = _interrupt_at(monkeypatch, "commit")
        monkeypatch.setattr(thread_insert, "_finish", finish)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            last()
        monkeypatch.undo()
        assert fired == ["commit"] and seen == [True] and type(got.value) is InterruptedInFlight
        assert got.value.outcome.result(timeout=20).num_items == (4 if kind == "vector" else 2)
        again()  # the retry: settles the insert first, and stores nothing twice
        n = 4 + (4 if kind == "vector" else 2)
        assert t.info()["rate_limiter"]["inserts"] == n
        assert _stored_items(t, n) == [1, 2, 3, 4] + [10] * (n - 4)
        if kind == "episode":
            assert w.pending == 0 and [e[0] for e in w.ended] == got.value.outcome.result().episode_ids.tolist()


@pytest.mark.parametrize("over_lanes", [True, False], ids=["lanes", "loop"])
@pytest.mark.parametrize("kind", ["episode", "trajectory", "vector"])
def test_a_writers_insert_interrupted_once_it_returned_lets_go_of_what_it_stored(
    dist_client, monkeypatch, kind, over_lanes
):
    """A SIGINT landing once a distributed insert had returned, before its writer let go of the rows it stored
    (a hunt's forced repro), came as a plain KeyboardInterrupt, the word for "nothing stored", the rows kept:
    the writer's retry stored them again (4 items for 2).  The writer's insert and its letting go are one
    section, as over a LocalTable, whose waits still let interrupts in: a HeldInterrupt, the rows let go."""
    from gear_flow.distributed import thread_insert

    real, armed = thread_insert.insert, []

    def insert(*args, **kw):
        res = real(*args, **kw)
        if armed and armed.pop():
            signal.raise_signal(signal.SIGINT)  # (handled here: the insert returned, the writer not yet let go)
        return res

    with _queue(dist_client, over_lanes=over_lanes) as t:
        w, last, again = _writer_holding(t, kind)
        monkeypatch.setattr(thread_insert, "insert", insert)
        armed.append(True)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            last()
        monkeypatch.undo()
        assert not armed and type(got.value) is HeldInterrupt
        again()  # the retry: nothing left to store
        before = [1, 2, 3, 4] if over_lanes else []
        n = len(before) + (4 if kind == "vector" else 2)
        assert t.info()["rate_limiter"]["inserts"] == n
        assert _stored_items(t, n) == before + [10] * (n - len(before))


@contextlib.contextmanager
def _full_table(client):
    """A 2-shard table of ``max_size`` 4 (closed after) holding 4 items, whose blocking inserts go from the
    caller's thread over its workers' lanes (each learnt by an insert to its shard)."""
    import dask

    from gear_flow.distributed import DistributedTable

    lanes = {"gear-flow.distributed.shared-memory": False, "gear-flow.distributed.tcp-lane": True}
    with dask.config.set(lanes):
        t = DistributedTable.create(client, make_spec(capacity=64, num_shards=2, max_size=4), timeout=10)
        try:
            t.insert([episode(1, 2)], shard=0)  # (the event loop's path: each learns its worker's lane)
            t.insert([episode(2, 2)], shard=1)
            yield t
        finally:
            t.close()


def test_a_writers_distributed_insert_interrupted_in_its_eviction_is_stored_once(dist_client, monkeypatch):
    """An insert past ``max_size`` interrupted while it evicted (after its commit: stored, the eviction going on
    on the event loop) raised a plain KeyboardInterrupt, and its writer kept the rows for a retry to store
    twice.  Its interrupt carries the stored insert's result: the writer lets go of the rows (HeldInterrupt)."""
    from gear_flow.distributed import writes

    real, main, fired = writes.LoopInserter.__call__, threading.main_thread().ident, []

    async def answer(self, req):
        if isinstance(req, writes.Evict) and not fired:  # (the event loop's thread: the caller waits for it)
            fired.append(req.size)
            signal.pthread_kill(main, signal.SIGINT)
        return await real(self, req)

    with _full_table(dist_client) as t:
        w = t.writer()
        steps = episode(10, 2)
        for i in range(2):
            w.append({k: v[i] for k, v in steps.items()})
        monkeypatch.setattr(writes.LoopInserter, "__call__", answer)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            w.end_episode()
        monkeypatch.undo()
        assert fired == [6] and type(got.value) is HeldInterrupt and w.pending == 0
        assert [e[0] for e in w.ended] == got.value.result.episode_ids.tolist()
        assert w.end_episode() is None
        wait_for(lambda: t.info()["inserts_in_flight"] == 0 and t.size == 4, "the eviction to end", 20)
        assert t.info()["totals"]["inserted"] == 6  # (the episode once)


def test_an_episode_writers_append_whose_catch_up_insert_stored_keeps_its_step_when_interrupted(
    dist_client, monkeypatch
):
    """An EpisodeWriter with ``max_episode_length`` whose automatic end had failed inserts that full episode
    first at its next append; interrupted once that insert stored (a HeldInterrupt: "the call is done"), the
    append had not buffered its own step, lost for good (a fuzz's find, 20 times; 3 of 4 steps stored).  The
    step is buffered before the interrupt comes, as a TrajectoryWriter's and a VectorWriter's append do."""
    steps = episode(10, 2)
    one = [{k: v[i] for k, v in steps.items()} for i in range(2)]
    last = {k: v[0] for k, v in episode(12, 1).items()}
    with _queue(dist_client, over_lanes=True) as t:
        w = t.writer(max_episode_length=2)
        w.append(one[0])
        fired = _interrupt_at(monkeypatch, "parts")  # the automatic end interrupted before anything was sent
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            w.append(one[1])
        monkeypatch.undo()
        assert fired == ["parts"] and type(got.value) is KeyboardInterrupt and w.pending == 2
        armed = _held_after_commit(monkeypatch)
        armed.append(True)
        with pytest.raises(KeyboardInterrupt) as got:
            w.append(last)  # its catch-up insert of episode 10, then its own step
        monkeypatch.undo()
        assert type(got.value) is HeldInterrupt and w.pending == 1
        w.end_episode()
        assert _stored_items(t, 7) == [1, 2, 3, 4, 10, 10, 12]


@pytest.mark.parametrize("where", ["write", "commit"])
def test_an_insert_past_max_size_interrupted_as_it_went_on_is_evicted_before_its_outcome_ends(
    dist_client, monkeypatch, where
):
    """A blocking insert over the lanes past ``max_size``, interrupted once its workers might hold its items:
    the event loop finished its store in the background but not the eviction after it, so the table stayed
    over ``max_size`` (6 items of 4) until some later insert evicted.  The eviction now follows the store
    there, and the interrupt's outcome ends once both did."""
    from gear_flow.errors import InterruptedInFlight

    with _full_table(dist_client) as t:
        fired = _interrupt_at(monkeypatch, where)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            t.insert([episode(10, 2)], shard=0 if where == "write" else None)
        monkeypatch.undo()
        assert fired == [where] and type(got.value) is InterruptedInFlight
        assert got.value.outcome.result(timeout=20).num_items == 2
        assert t.size == 4 and t.info()["totals"]["inserted"] == 6
        assert t.info()["inserts_in_flight"] == 0


def test_an_insert_interrupted_as_it_asks_its_eviction_is_evicted_in_the_background(dist_client, monkeypatch):
    """A blocking insert over the lanes past ``max_size``, interrupted once stored, as its eviction was about to
    be asked (a fuzz's find): its InterruptedInFlight said the eviction went on in the background, but it had
    never begun, and the table stayed over ``max_size`` (6 items of 4) until some later insert evicted.  The
    eviction is begun there, and the outcome ends once it did."""
    from gear_flow.distributed import thread_insert, writes
    from gear_flow.errors import InterruptedInFlight

    real, fired = thread_insert.ThreadInserter.__call__, []

    def answer(self, req):
        if isinstance(req, writes.Evict) and not fired:
            fired.append(req.size)
            signal.raise_signal(signal.SIGINT)  # (handled here: the eviction not asked yet)
        return real(self, req)

    with _full_table(dist_client) as t:
        monkeypatch.setattr(thread_insert.ThreadInserter, "__call__", answer)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            t.insert([episode(10, 2)])
        monkeypatch.undo()
        assert fired == [6] and type(got.value) is InterruptedInFlight
        assert got.value.outcome.result(timeout=20).num_items == 2
        assert t.size == 4 and t.info()["totals"]["inserted"] == 6


def _held_after_commit(monkeypatch) -> list:
    """Each True appended to the returned list sends one SIGINT from a blocking insert's own steps after its
    commit (building its answer), where it is held to the call's end."""
    from gear_flow.distributed import writes

    real, main, armed = writes.insert_result, threading.main_thread().ident, []

    def insert_result(*args, **kw):
        if armed and armed.pop() and threading.get_ident() == main:
            signal.pthread_kill(main, signal.SIGINT)
        return real(*args, **kw)

    monkeypatch.setattr(writes, "insert_result", insert_result)
    return armed


def test_an_interrupt_held_to_the_end_of_a_stored_inserts_steps_carries_its_answer(dist_client, monkeypatch):
    """A SIGINT that found a blocking insert over the lanes in its own steps after the commit (building its
    answer) was held to the call's end, then raised as a plain KeyboardInterrupt, the word for "left
    nothing", with the insert stored: a writer's retry stored its episode twice (a hunt: 6 items for 3).  It
    comes as a HeldInterrupt with the insert's answer; the writer lets go of the rows."""
    with _queue(dist_client, over_lanes=True) as t:
        armed = _held_after_commit(monkeypatch)
        armed.append(True)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            t.insert([episode(5, 1)], shard=0)
        assert type(got.value) is HeldInterrupt and got.value.result.num_items == 1
        w, last, again = _writer_holding(t, "episode")
        armed.append(True)
        with pytest.raises(KeyboardInterrupt) as got:
            last()
        monkeypatch.undo()
        assert type(got.value) is HeldInterrupt and w.pending == 0 and w.ended[0][0] == got.value.result.episode_ids[0]
        assert again() is None
        assert _stored_items(t, 7) == [1, 2, 3, 4, 5, 10, 10]


def test_an_insert_interrupted_while_the_event_loop_applies_it_carries_what_it_stored(dist_client, monkeypatch):
    """A blocking insert the event loop carries (no lanes), interrupted once its workers applied it: the loop
    finished it (stored and counted) for a caller who got a plain KeyboardInterrupt and could not tell, so a
    writer's retry stored it twice.  The interrupt is an :class:`InterruptedInFlight` whose ``outcome`` is the
    insert's result once it ended; a writer waits for it and raises a HeldInterrupt with its steps let go
    (one episode: its worker writes it whole, no apply)."""
    from gear_flow.distributed import transactions
    from gear_flow.errors import InterruptedInFlight

    real, main, fired = transactions.call, threading.main_thread().ident, []

    async def call(ctx, addr, what, **kw):
        got = await real(ctx, addr, what, **kw)
        if what in ("write", "apply") and not fired:  # (on the event loop's thread, the caller waiting)
            fired.append(what)
            signal.pthread_kill(main, signal.SIGINT)
        return got

    with _queue(dist_client, over_lanes=False) as t:
        monkeypatch.setattr(transactions, "call", call)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            t.insert([episode(3, 1), episode(4, 1)])
        assert type(got.value) is InterruptedInFlight
        res = got.value.outcome.result(timeout=20)
        assert fired == ["apply"] and res.num_items == 2 and sorted(set(res.shards.tolist())) == [0, 1]

        fired.clear()
        w, last, again = _writer_holding(t, "episode")
        with pytest.raises(KeyboardInterrupt) as held:
            last()
        assert fired == ["write"] and type(held.value) is HeldInterrupt and w.pending == 0
        assert [e[0] for e in w.ended] == held.value.result.episode_ids.tolist()
        monkeypatch.undo()
        assert again() is None
        assert _stored_items(t, 4) == [3, 4, 10, 10]
        assert t.stats["insert_in_thread"] == 0


def test_a_second_interrupt_as_the_first_cancels_the_call_still_says_how_it_ends(dist_client, monkeypatch):
    """A blocking insert the event loop carries, interrupted once its workers applied it, and interrupted again
    as the caller's wait handed its cancel to the loop (a double Ctrl-C; a fuzz's find): the second interrupt
    came as a plain KeyboardInterrupt, "nothing stored", and the insert went on and stored (a writer's retry
    stored it twice).  The second one waits for the cancel to be handed over, and the first comes, holding
    the insert's end (:class:`~gear_flow.errors.InterruptedInFlight`)."""
    from gear_flow.distributed import transactions, transport
    from gear_flow.errors import InterruptedInFlight

    real_call, real_leave, main, fired = transactions.call, transport._Caller.leave, threading.main_thread().ident, []

    async def call(ctx, addr, what, **kw):
        got = await real_call(ctx, addr, what, **kw)
        if what == "apply" and not fired:  # (on the event loop's thread, the caller waiting)
            fired.append(what)
            signal.pthread_kill(main, signal.SIGINT)
        return got

    def leave(self, loop):
        if fired == ["apply"]:
            fired.append("leave")
            signal.raise_signal(signal.SIGINT)  # (handled here, before the cancel is handed to the loop)
        return real_leave(self, loop)

    with _queue(dist_client, over_lanes=False) as t:
        monkeypatch.setattr(transactions, "call", call)
        monkeypatch.setattr(transport._Caller, "leave", leave)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            t.insert([episode(3, 1), episode(4, 1)])
        monkeypatch.undo()
        assert fired == ["apply", "leave"] and type(got.value) is InterruptedInFlight
        assert got.value.outcome.result(timeout=20).num_items == 2
        assert _stored_items(t, 2) == [3, 4]


def test_a_queue_sample_interrupted_once_a_worker_committed_it_carries_its_batch(dist_client, monkeypatch):
    """A blocking Queue sample interrupted once a worker had committed its part (its items handed out) went on
    to its end on the event loop, for a caller who got a plain KeyboardInterrupt: the batch's items left the
    queue for nobody.  The interrupt is an :class:`InterruptedInFlight` whose ``outcome`` is the batch."""
    from gear_flow.distributed import transport
    from gear_flow.errors import InterruptedInFlight

    real, main, fired = transport.call, threading.main_thread().ident, []

    async def call(ctx, addr, what, **kw):
        got = await real(ctx, addr, what, **kw)
        if what == "finish_sample" and kw.get("commit") and not fired:  # (the event loop's thread)
            fired.append(what)
            signal.pthread_kill(main, signal.SIGINT)
        return got

    with _queue(dist_client, over_lanes=False) as t:
        t.insert([episode(i, 1) for i in (10, 11, 12, 13)])
        monkeypatch.setattr(transport, "call", call)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            t.sample(2, timeout=10)
        monkeypatch.undo()
        assert fired == ["finish_sample"] and type(got.value) is InterruptedInFlight
        assert got.value.outcome.result(timeout=20).data["ep"].numpy().ravel().tolist() == [10, 11]
        assert [t.sample(1, timeout=10).data["ep"].numpy().ravel().tolist() for _ in range(2)] == [[12], [13]]
        assert t.size == 0 and t.info()["rate_limiter"]["samples"] == 4


def test_held_interrupts_come_at_the_next_request_or_at_the_calls_end():
    """A SIGINT that finds the main thread in a plan's code (or the driver's) is only recorded; it comes where
    an answer checks, or when the call ends; one that finds it answering a request comes at once; the handler
    replaced is back after the call."""
    from gear_flow.interrupts import HeldInterrupts
    from gear_flow.table import planner

    before, seen = signal.getsignal(signal.SIGINT), []

    def plan():
        signal.raise_signal(signal.SIGINT)  # (its handler has run by the next line)
        seen.append("went on")
        seen.append((yield "a"))
        return "done"

    def answer(req):
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        interrupts.check()  # delivered once
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # answering: at once
        return req.upper()

    with HeldInterrupts() as interrupts:
        assert signal.getsignal(signal.SIGINT) is not before
        assert planner.run(plan(), answer, None, interrupts) == "done"
    assert seen == ["went on", "A"] and signal.getsignal(signal.SIGINT) is before

    def last_step():
        yield "a"
        signal.raise_signal(signal.SIGINT)
        seen.append("ended")
        return 1

    with pytest.raises(KeyboardInterrupt):
        with HeldInterrupts() as interrupts:
            planner.run(last_step(), lambda req: None, None, interrupts)
    assert seen[-1] == "ended" and signal.getsignal(signal.SIGINT) is before

    def interrupted(req):
        raise KeyboardInterrupt

    def hand_over(plan, req, error):
        signal.raise_signal(signal.SIGINT)  # a second one while the first is handed over: held, not raised here
        seen.append("handed")
        return True

    with pytest.raises(KeyboardInterrupt):
        with HeldInterrupts() as interrupts:
            planner.run(last_step(), interrupted, hand_over, interrupts)
    assert seen[-1] == "handed" and signal.getsignal(signal.SIGINT) is before


def test_an_interrupt_as_a_call_goes_to_the_event_loop_cancels_it_there(dist_client):
    """A blocking call hands its coroutine to the client's event loop and waits; interrupted before the loop
    had started it (the loop busy), Dask's own sync failed its cancel (``NameError: cannot access free variable
    'future'``, logged by tornado) and the coroutine then ran for a caller gone (a Queue's sample taking its
    items for nobody).  It is cancelled before it runs.  A step a call has begun and nothing may stop midway
    (``sync_to_end``: an insert's abort or eviction) runs to its end all the same."""
    from gear_flow.distributed.transport import Context

    ctx, ran = Context(client=dist_client), []

    async def call():
        ran.append("ran")

    async def after():
        await asyncio.sleep(0.05)  # (a few turns of the loop: a task started then has run)
        return "after"

    def interrupted_as_it_goes(sync):
        busy = threading.Event()
        dist_client.loop.add_callback(busy.wait, 30)  # the loop's thread held until released
        watcher = _interrupt_once_blocked_in(
            "result"
        )  # (concurrent.futures.Future.result: not the watcher's own start)
        try:
            with pytest.raises(KeyboardInterrupt):
                sync(call)
        finally:
            watcher.join(10)
            busy.set()
        assert ctx.sync(after) == "after"

    interrupted_as_it_goes(ctx.sync)
    assert ran == []
    # a step a call has begun (an abort, an eviction): interrupted as it goes to the loop, it still runs there
    interrupted_as_it_goes(ctx.sync_to_end)
    assert ran == ["ran"]


def test_an_interrupt_landing_as_the_call_is_handed_to_the_loop_cancels_it_once_started(dist_client, monkeypatch):
    """An interrupt that landed once the loop had started the call but before the caller held the call's future
    (the loop's thread quicker than the caller's, on a busy host) left the call running to its end for a caller
    gone: a create's name registered and its table built for nobody (a CI run: its name never freed).  It is
    cancelled there as well."""
    from gear_flow.distributed.transport import Context

    ctx, started, ended = Context(client=dist_client), threading.Event(), []
    main, real = threading.main_thread().ident, Context._start

    async def call():
        started.set()
        try:
            await asyncio.sleep(30)  # (what a cancel cuts short)
            ended.append("ran to its end")
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    def start(self, coro, caller=None):
        fut = real(self, coro, caller)
        assert started.wait(10)
        signal.pthread_kill(main, signal.SIGINT)  # lands before the future is returned to the caller
        threading.Event().wait(10)  # (interrupted)
        return fut

    monkeypatch.setattr(Context, "_start", start)
    with pytest.raises(KeyboardInterrupt):
        ctx.sync(call)
    monkeypatch.undo()
    wait_for(lambda: ended, "the call to end")
    assert ended == ["cancelled"]


def test_a_call_interrupted_as_it_is_handed_to_the_loop_still_says_how_it_ended(dist_client, monkeypatch):
    """An interrupt that landed once a blocking insert or Queue sample was handed to the event loop but before
    the caller held its future (the caller's thread descheduled while the loop ran the call, on a busy host)
    came as a plain KeyboardInterrupt, the word for "left nothing", while the call went on past what it could
    take back: a writer's retry stored its episode twice (6 items for 3), a sample's items left the queue for
    nobody (a hunt: 3 % of such interrupts).  The call's end is held from before it is handed over: the
    writer waits for it (stored: a HeldInterrupt, its rows let go), the sample's interrupt carries its batch."""
    from gear_flow.distributed.transport import Context
    from gear_flow.errors import InterruptedInFlight

    main, real, armed = threading.main_thread().ident, Context._start, []

    def start(self, coro, caller=None):
        fut = real(self, coro, caller)
        if armed and armed.pop() and threading.get_ident() == main:
            fut.exception(10)  # (the call ran to its end meanwhile)
            signal.pthread_kill(main, signal.SIGINT)  # lands before the future is returned to the caller
            threading.Event().wait(10)  # (interrupted)
        return fut

    with _queue(dist_client, over_lanes=False) as t:
        t.insert([episode(i, 1) for i in (1, 2)])
        w, last, again = _writer_holding(t, "episode")
        monkeypatch.setattr(Context, "_start", start)
        armed.append(True)
        with pytest.raises(KeyboardInterrupt) as got:  # (a plain one, uncaught, would stop the test run)
            last()
        assert type(got.value) is HeldInterrupt and w.pending == 0 and got.value.result.num_items == 2
        armed.append(True)
        with pytest.raises(KeyboardInterrupt) as got:
            t.sample(2, timeout=10)
        monkeypatch.undo()
        assert type(got.value) is InterruptedInFlight
        assert got.value.outcome.result(timeout=10).data["ep"].numpy().ravel().tolist() == [1, 2]
        assert again() is None
        assert _stored_items(t, 2) == [10, 10]


def test_a_sample_interrupted_between_two_reader_drawn_parts_counts_none_of_it(dist_client):
    """A sample drawn from the shards' published states in the caller's thread, interrupted once one worker's
    part was drawn and booked, before the next: the grant was given back (the limiter never counted the
    batch), but the booked part still reached its owner's count: the shards counted more samples than the
    limiter, for good.  A sample's reader draws are counted once the sample stands."""
    from gear_flow.distributed import DistributedTable, reader_draw

    t = DistributedTable.create(dist_client, make_spec(capacity=64, num_shards=2), sampler=gf.Prioritized(0.6))
    t.insert([episode(i, 3) for i in range(8)])
    for _ in range(3):  # (64 rows: both shards' parts drawn, but for a chance of 2 in 2**64)
        t.sample(64, timeout=10)
    real, calls = reader_draw.generator, []

    def generator(seed):  # the second worker's part: the first one's is drawn and booked already
        calls.append(seed)
        if len(calls) == 2 and threading.current_thread() is threading.main_thread():
            signal.raise_signal(signal.SIGINT)
        return real(seed)

    def counts():
        t.flush()
        info = t.info()
        return info["rate_limiter"]["samples"], info["totals"]["sampled"]

    drawn = t.stats["reader_draws"]
    reader_draw.generator = generator
    try:
        with pytest.raises(KeyboardInterrupt):
            t.sample(64, timeout=10)
    finally:
        reader_draw.generator = real
    assert len(calls) == 2 and t.stats["reader_draws"] > drawn  # (landed after a part drawn in this thread)
    wait_for(lambda: len(set(counts())) == 1, "the shards' sample counts to be the limiter's", 10)
    assert counts() == (192, 192)
    t.sample(64, timeout=10)
    wait_for(lambda: counts() == (256, 256), "the next sample to be counted alike", 10)
    t.close()


def test_a_delete_cancelled_once_its_workers_removed_the_items_is_counted(dist_client, monkeypatch):
    """A ``delete_async`` cancelled (a blocking ``delete`` interrupted) once its workers had removed the items
    never told the coordinator: the workers held 4 items fewer than the coordinator counted, for good, and a
    Queue's sample of what the coordinator counted then timed out with the items it had stored.  Begun on the
    workers, the removal goes to its end and is counted: the cancel came too late, and the call returns it."""
    from gear_flow.distributed import DistributedTable, transport

    t = DistributedTable.create(dist_client, make_spec(capacity=64, num_shards=2))
    try:
        t.insert([episode(i, 2) for i in range(4)])
        keys = np.unique(t.sample(32).keys.numpy())[:4]
        assert len(keys) == 4
        target = _cancel_once_answered(monkeypatch, transport, "delete")

        got = _run_cancelled(dist_client, target, lambda: t.delete_async(keys))
        assert "task" not in target and _settled(t, 4), t.info()  # (workers and coordinator agree)
        assert got != "cancelled" and got.applied == 4 and t.info()["rate_limiter"]["deletes"] == 4
    finally:
        t.close()


def test_a_step_its_caller_stopped_waiting_for_is_kept_until_it_ends(dist_client):
    """asyncio keeps tasks weakly: a step on the event loop whose caller was interrupted (it goes on to its end
    there), waiting on something only it held (a lane reply's reader), was collected midway ("Task was
    destroyed but it is pending!": a sample's finish or give-back in the hunt).  The context keeps it."""
    import gc
    import weakref

    from gear_flow.distributed.transport import Context

    ctx, seen = Context(client=dist_client), []

    async def step():
        seen.append(weakref.ref(asyncio.current_task()))
        await asyncio.get_running_loop().create_future()  # nothing else holds what it waits for

    watcher = _interrupt_once_blocked_in("result")  # (concurrent.futures.Future.result: not the watcher's own start)
    try:
        with pytest.raises(KeyboardInterrupt):
            ctx.sync_to_end(step)
    finally:
        watcher.join(10)
    gc.collect()
    task = seen[0]()
    assert task is not None and not task.done()
    dist_client.loop.add_callback(task.cancel)


def test_a_checkpoint_cancelled_while_its_workers_write_waits_for_them_before_removing_its_files(
    dist_client, monkeypatch, tmp_path
):
    """A ``checkpoint_async`` cancelled (a blocking ``checkpoint`` interrupted) while its workers wrote removed
    its temporary directory under them: each worker still writing failed (a ``FileNotFoundError`` traceback in
    its log per interrupted checkpoint).  The cancel now waits for the workers' writes to end, then removes
    what they wrote and is raised: nothing is left on disk, and no worker's write fails."""
    from gear_flow.distributed import DistributedTable, transport

    t = DistributedTable.create(dist_client, make_spec(capacity=64, num_shards=2))
    assert len(t._view.workers()) == 2
    try:
        t.insert([episode(i, 2) for i in range(4)])
        real, target, sent, answers = transport.call, {}, [], []
        first_answered = asyncio.Event()

        async def call(ctx, addr, what, **kw):
            if what != "checkpoint":
                return await real(ctx, addr, what, **kw)
            sent.append(addr)
            if len(sent) > 1:  # the second worker writes once the call is cancelled
                await first_answered.wait()
            got = await real(ctx, addr, what, **kw)
            answers.append(addr)
            if len(answers) == 1:
                target.pop("task").cancel()
                first_answered.set()
            return got

        monkeypatch.setattr(transport, "call", call)
        final = tmp_path / "ckpt"
        got = _run_cancelled(dist_client, target, lambda: t.checkpoint_async(final))
        assert got == "cancelled"
        assert len(answers) == 2  # both workers' writes ended before the call did (before: only the first's)
        assert not final.exists() and list(tmp_path.iterdir()) == []  # what they wrote removed
        monkeypatch.setattr(transport, "call", real)
        assert t.checkpoint(final)["shards"] == [0, 1]  # (the table goes on)
    finally:
        t.close()


def _reply_held(monkeypatch, transport, op, interrupt):
    """Wrap the coordinator requests (``transport.coord``) so that the first request ``op`` is sent and answered,
    then ``interrupt()`` runs and the answer is held back until the returned event is set: a reply still on its
    way when the caller gives up."""
    real, released = transport.coord, threading.Event()

    async def coord(ctx, what, name, **kw):
        got = await real(ctx, what, name, **kw)
        if what == op and not released.is_set():
            interrupt()
            while not released.is_set():  # (polls a condition the test's main thread sets)
                await asyncio.sleep(0.01)
        return got

    monkeypatch.setattr(transport, "coord", coord)
    return released


@pytest.mark.parametrize("restore", [False, True])
def test_a_create_or_restore_interrupted_as_its_name_is_registered_leaves_the_name_free(
    dist_client, monkeypatch, tmp_path, restore
):
    """A blocking create (or restore) interrupted while the coordinator's answer to its registration was on its
    way left the name registered, with no worker holding the table, for good: attaching said the worker has no
    such table, and creating it again that the name is taken (a hunt's interrupted restores: 1 in 20).  The
    registration now ends, then everything is taken back."""
    from dist_support import tables_here

    from gear_flow.distributed import DistributedTable, transport

    spec, name = make_spec(capacity=64, num_shards=2), f"held-{int(restore)}"
    if restore:
        t = DistributedTable.create(dist_client, spec)
        t.insert([episode(i, 2) for i in range(4)])
        t.checkpoint(tmp_path / "ck")
        t.close()
    main = threading.main_thread().ident
    released = _reply_held(monkeypatch, transport, "register", lambda: signal.pthread_kill(main, signal.SIGINT))
    try:
        with pytest.raises(KeyboardInterrupt):
            if restore:
                DistributedTable.restore(dist_client, tmp_path / "ck", name=name)
            else:
                DistributedTable.create(dist_client, spec, name=name)
    finally:
        released.set()
    names = lambda: transport.CoordinatorClient.of(dist_client).list()  # noqa: E731
    wait_for(lambda: name not in names(), "the interrupted call to take its name back")
    assert all(name not in held for held in dist_client.run(tables_here).values())
    monkeypatch.undo()
    t = DistributedTable.create(dist_client, spec, name=name)  # the name is free
    t.insert([episode(9, 2)])
    assert t.info()["size"] == 2
    t.close()


def test_a_create_interrupted_while_its_workers_build_drops_nothing_before_it_is_built(dist_client, monkeypatch):
    """A blocking create interrupted once one worker had built its shards, the other still building: the
    takeback sent each worker its drop at once, so a worker still building kept its part for a table the
    coordinator no longer knew.  The takeback now waits for every worker's build to end, then drops them."""
    from dist_support import tables_here

    from gear_flow.distributed import DistributedTable, transport

    main, real, released, sent, answered = threading.main_thread().ident, transport.call, threading.Event(), [], []

    async def call(ctx, addr, what, **kw):
        if what == "create":
            sent.append(addr)
            while len(sent) > 1 and not released.is_set():  # the second worker builds once the caller gave up
                await asyncio.sleep(0.01)  # (polls a condition the test's main thread sets)
        got = await real(ctx, addr, what, **kw)
        if what == "create":
            answered.append(addr)
            if len(answered) == 1:
                signal.pthread_kill(main, signal.SIGINT)
        return got

    monkeypatch.setattr(transport, "call", call)
    try:
        with pytest.raises(KeyboardInterrupt):
            DistributedTable.create(dist_client, make_spec(capacity=64, num_shards=2), name="built-held")
    finally:
        released.set()
    names = lambda: transport.CoordinatorClient.of(dist_client).list()  # noqa: E731
    wait_for(lambda: "built-held" not in names(), "the interrupted create to be taken back")
    assert len(answered) == 2  # both workers' builds ended before the drops (before: the held one's cut off)
    wait_for(lambda: all("built-held" not in h for h in dist_client.run(tables_here).values()), "the drops")


def test_a_shard_restore_cancelled_once_its_worker_rebuilt_the_shard_is_counted(dist_client, monkeypatch, tmp_path):
    """A ``restore_shard_async`` replacing a live shard, cancelled (a blocking ``restore_shard`` interrupted) once
    its worker had rebuilt the shard from the checkpoint, never told the coordinator: the worker held the
    checkpoint's items while the coordinator counted what the shard held before, for good (a hunt of
    interrupted shard restores: 9 such breaks in 21 interrupted restores).  Begun on the worker, the restore
    goes to its end and is counted: the cancel came too late, and the call returns its report."""
    from gear_flow.distributed import DistributedTable, transport

    t = DistributedTable.create(dist_client, make_spec(capacity=64, num_shards=2))
    try:
        t.insert([episode(i, 2) for i in range(4)])
        t.checkpoint(tmp_path / "ck")
        t.insert([episode(i, 2) for i in range(4, 8)])  # after the checkpoint: dropped by the replace
        before = t.info()["size"]
        target = _cancel_once_answered(monkeypatch, transport, "restore")

        got = _run_cancelled(dist_client, target, lambda: t.restore_shard_async(0, tmp_path / "ck", replace=True))
        assert "task" not in target and got != "cancelled", got
        info = t.info()
        assert info["size"] == info["coordinator_size"] == before - got["dropped_items"] + got["items_restored"], info
        assert got["dropped_items"] > got["items_restored"]  # (the replace took the later inserts out)
    finally:
        t.close()


def test_a_shard_restore_begun_while_an_interrupted_one_still_ends_waits_for_it(dist_client, monkeypatch, tmp_path):
    """A ``restore_shard`` interrupted once begun goes on to its end in the background; the caller's next one
    (trying again) was planned against the placement from before it, so the two dropped each other's copy or
    counted one beside the other: the workers' size off the coordinator's, for good (a hunt of interrupted
    shard restores: its last 2 breaks).  A restore of a shard now waits for the one under way."""
    from gear_flow.distributed import DistributedTable, transport

    t = DistributedTable.create(dist_client, make_spec(capacity=64, num_shards=2))
    try:
        t.insert([episode(i, 2) for i in range(4)])
        t.checkpoint(tmp_path / "ck")
        t.insert([episode(i, 2) for i in range(4, 8)])
        old = t.placement[0]
        other = next(a for a in dist_client.scheduler_info()["workers"] if a != old)
        real, first, sent = transport.call, {}, []

        async def call(ctx, addr, what, **kw):
            sent.append((addr, what))
            if what == "restore" and not first:  # the first restore's rebuild held until the second one began
                first["held"] = True
                while not first.get("go"):
                    await asyncio.sleep(0.01)  # (polls a flag the test's coroutine sets)
            return await real(ctx, addr, what, **kw)

        def waits_for_the_lock(task) -> bool:
            c = task.get_coro()
            while c is not None:
                if getattr(c, "cr_code", None) is not None and c.cr_code.co_name == "acquire":
                    return True
                c = getattr(c, "cr_await", None)
            return False

        monkeypatch.setattr(transport, "call", call)

        async def run():
            one = asyncio.ensure_future(t.restore_shard_async(0, tmp_path / "ck", worker=other, replace=True))
            while not first.get("held"):
                await asyncio.sleep(0.01)
            one.cancel()  # the caller interrupted: the restore goes on in the background
            two = asyncio.ensure_future(t.restore_shard_async(0, tmp_path / "ck", worker=old, replace=True))
            while not (waits_for_the_lock(two) or (old, "info") in sent[sent.index((other, "restore")) :]):
                await asyncio.sleep(0.01)  # (the second one blocked, or planned against the old placement)
            first["go"] = True
            return await asyncio.gather(one, two, return_exceptions=True)

        got_one, got_two = dist_client.sync(run)
        monkeypatch.undo()
        assert got_one["worker"] == other and got_two["worker"] == old, (got_one, got_two)
        assert got_two["dropped_items"] == got_one["items_restored"]  # it replaced the first one's copy
        info = t.info()
        assert info["size"] == info["coordinator_size"] == t.size, info
        assert t.placement[0] == old
        name = t.name

        def shards_here(dask_worker):
            tables = dask_worker.plugins["gear-flow"].host.tables
            return sorted(tables.table(name).shards) if name in tables else []

        held = dist_client.run(shards_here)
        assert sorted(s for shards in held.values() for s in shards) == [0, 1], held  # one copy of each
    finally:
        t.close()
