"""Writers beyond EpisodeWriter: overlapping chunks with created items, vectorised envs, priority write-back."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import gear_flow as gf

COLS = (gf.ColumnSpec("obs", (3,), np.float32), gf.ColumnSpec("t", (), np.int64))


def step(env: int, t: int, ep: int = 0) -> dict:
    return {"obs": np.array([env, t, ep], np.float32), "t": np.int64(t)}


def read_all(table) -> np.ndarray:
    """Every stored row once, in insertion order (the table is a queue of step items)."""
    b = table.sample(table.size, 1, timeout=0)
    return b["obs"].numpy()[:, 0]


# -- TrajectoryWriter -------------------------------------------------------------------------------
def test_n_step_items_are_exactly_the_created_ones_across_chunks():
    table = gf.LocalTable(gf.TableSpec(COLS, capacity=512), sampler=gf.Prioritized(alpha=1.0), seed=0)
    n_steps, L = 30, 3
    with gf.TrajectoryWriter(table, chunk_length=8, overlap=L - 1, items="created") as w:
        for t in range(n_steps):
            w.append(step(0, t))
            if t == 9:
                assert table.size > 0, "a chunk is sampleable before the episode ends"
            if w.episode_steps >= L:
                w.create_item(L, priority=1.0)
        w.end_episode()
    # every L-step window of the episode is one item, drawn with probability 1 / (n_steps - L + 1)
    b = table.sample(4000, L, boundary="strict")
    t = b["t"].numpy()
    assert np.all(np.diff(t, axis=1) == 1), "every window is L consecutive steps"
    assert sorted(set(t[:, 0].tolist())) == list(range(n_steps - L + 1))
    assert np.allclose(b.probabilities.numpy(), 1 / (n_steps - L + 1))
    assert [n for _, n in w.chunks] == [8, 8, 8, 8, 6]  # 2 rows shared by consecutive chunks


def test_an_item_created_on_the_rows_kept_by_a_flush_goes_in_with_them():
    """After an explicit ``flush`` the writer keeps ``overlap`` rows: an item created on them is inserted
    with them when the episode ends (it was lost: nothing was pending), and one reaching before them is
    refused (it marked the wrong step: the index wrapped round to the last row)."""
    spec = gf.TableSpec((gf.ColumnSpec("t", (), np.int64),), capacity=256)
    table = gf.LocalTable(spec, sampler=gf.Prioritized(alpha=1.0), seed=0)
    w = gf.TrajectoryWriter(table, chunk_length=16, overlap=2, items="created")
    for t in range(10):
        w.append({"t": t})
        if t == 5:
            w.create_item(2, priority=1.0)  # window 4, 5
    w.flush()  # rows 0..9 inserted with the item at 4; rows 8, 9 kept
    with pytest.raises(gf.SpecError, match="create the item before flushing"):
        w.create_item(3, priority=1.0)  # window 7..9: step 7 went with the chunk
    w.create_item(2, priority=1.0)  # window 8, 9
    w.end_episode()
    b = table.sample(500, 2, boundary="strict")
    assert sorted(set(b["t"].numpy()[:, 0].tolist())) == [4, 8]
    assert [n for _, n in w.chunks] == [10, 2]
    with pytest.raises(gf.InvalidDataError, match="priority must be a number"):
        gf.TrajectoryWriter(table, chunk_length=4, overlap=1).append({"t": 0}, priority="a")


def test_sequences_every_period_steps():
    table = gf.LocalTable(gf.TableSpec(COLS, capacity=512), sampler=gf.Prioritized(alpha=1.0), seed=1)
    w = gf.TrajectoryWriter(table, chunk_length=12, overlap=7, items="created")
    for t in range(40):
        w.append(step(0, t))
        if w.episode_steps >= 8 and (w.episode_steps - 8) % 4 == 0:
            w.create_item(8, priority=2.0)  # 8-step sequences starting every 4 steps
    w.close()
    starts = set(table.sample(2000, 8, boundary="strict")["t"].numpy()[:, 0].tolist())
    assert starts == set(range(0, 33, 4))


def test_chunk_insert_blocked_by_the_limiter_appends_nothing_and_retries():
    table = gf.LocalTable.queue(gf.TableSpec(COLS, capacity=256), 6)
    w = gf.TrajectoryWriter(table, chunk_length=4, overlap=1, timeout=0)
    for t in range(7):
        w.append(step(0, t))  # the 5th append inserts rows 0-3
    with pytest.raises(gf.RateLimitTimeout):
        w.append(step(0, 7))  # rows 3-6 would make 8 > 6 waiting items
    assert w.pending == 3 and table.size == 4
    assert read_all(table)[:, 1].tolist() == [0, 1, 2, 3]  # reading the queue empties it
    w.append(step(0, 7))
    w.end_episode()
    rows = table.sample(table.size, 1, timeout=0)["t"].numpy()[:, 0].tolist()
    assert rows == [3, 4, 5, 6, 6, 7]  # the chunk, then the last one sharing row 6


def test_trajectory_writer_refuses_what_it_cannot_do():
    uniform = gf.LocalTable(gf.TableSpec(COLS, capacity=64))
    with pytest.raises(gf.SpecError, match="Prioritized"):
        gf.TrajectoryWriter(uniform, 8, 2, items="created")
    with pytest.raises(gf.SpecError, match="overlap"):
        gf.TrajectoryWriter(uniform, 4, 4)
    prio = gf.LocalTable(gf.TableSpec(COLS, capacity=64), sampler=gf.Prioritized())
    w = gf.TrajectoryWriter(prio, 8, 2, items="created")
    w.append(step(0, 0))
    with pytest.raises(gf.SpecError, match="overlap \\+ 1"):
        w.create_item(4)
    with pytest.raises(gf.SpecError, match="exceeds the 1 steps"):
        w.create_item(2)
    with pytest.raises(gf.InvalidDataError):
        w.append({"obs": np.zeros(2)})


# -- VectorWriter ------------------------------------------------------------------------------------
def test_vector_writer_episodes_end_independently():
    rng = np.random.default_rng(0)
    N, T = 4, 60
    table = gf.LocalTable.queue(gf.TableSpec(COLS, capacity=1024), 1024)
    w = gf.VectorWriter(table, N)
    ep = np.zeros(N, int)
    t = np.zeros(N, int)
    expected = []  # (env, ep, t) of every step, in insertion order
    buffered = [[] for _ in range(N)]
    for _ in range(T):
        done = rng.random(N) < 0.15
        w.append(
            {"obs": np.stack([np.array([i, t[i], ep[i]], np.float32) for i in range(N)]), "t": t.copy()},
            done=done,
        )
        for i in range(N):
            buffered[i].append((i, int(t[i]), int(ep[i])))
        for i in np.flatnonzero(done):  # one insert per step, ended envs in env order
            expected.extend(buffered[i])
            buffered[i] = []
            ep[i] += 1
            t[i] = -1
        t += 1
    assert w.pending.tolist() == [len(b) for b in buffered]
    w.close()
    expected.extend(r for b in buffered for r in b)
    b = table.sample(table.size, 1, timeout=0)["obs"].numpy()[:, 0]
    assert [tuple(int(x) for x in r) for r in b] == expected
    assert len(w.ended) == int(ep.sum()) + sum(1 for x in buffered if x)


def test_vector_writer_bad_input_appends_nothing():
    table = gf.LocalTable(gf.TableSpec(COLS, capacity=64))
    w = gf.VectorWriter(table, 2)
    good = {"obs": np.zeros((2, 3), np.float32), "t": np.zeros(2, np.int64)}
    with pytest.raises(gf.InvalidDataError, match="shape"):
        w.append({"obs": np.zeros((3, 3)), "t": np.zeros(3, np.int64)})
    with pytest.raises(gf.InvalidDataError, match="done"):
        w.append(good, done=[True])
    with pytest.raises(gf.InvalidPriorityError):
        w.append(good, priorities=[1.0, -1.0])
    assert w.pending.tolist() == [0, 0]
    w.append(good, done=[True, False], priorities=[1.0, 2.0])
    assert table.size == 1 and w.pending.tolist() == [0, 1]


@pytest.mark.parametrize("item_unit", ["step", "episode"])
def test_vector_writer_long_episodes_and_priorities_in_order(item_unit):
    """Episodes outgrow the writer's first 16 steps per environment, some steps come with priorities and
    some without: every step lands in order, with its own priority or its episode's largest, and an episode
    given none the table's default (the running largest), whichever episodes end beside it.  Such an episode
    ending beside one given priorities got 1.0, where alone it got the default."""
    rng = np.random.default_rng(3)
    N = 5
    table = gf.LocalTable.queue(gf.TableSpec(COLS, capacity=4096, item_unit=item_unit), 4096)
    w = gf.VectorWriter(table, N, max_episode_length=45)
    t = np.zeros(N, int)
    mine = [[] for _ in range(N)]  # (env, t, priority or None) of the episode in progress
    inserted = []  # per inserted episode, in insertion order: its steps
    ended = [[] for _ in range(N)]  # per environment, its ended episodes in order
    for step in range(160):
        done = rng.random(N) < 0.03
        prio = (rng.random(N) + 0.5) if step % 3 else None
        if step >= 110:  # the last steps without priorities: whole episodes given none, beside ones given some
            prio = None
        w.append({"obs": np.stack([[i, t[i], step] for i in range(N)]).astype(np.float32), "t": t.copy()},
                 done=done, priorities=prio)  # fmt: skip
        for i in range(N):
            mine[i].append((i, int(t[i]), None if prio is None else float(prio[i])))
        t += 1
        for i in range(N):
            if done[i] or len(mine[i]) == 45:
                ended[i].append(mine[i])
                mine[i], t[i] = [], 0
    inserted = [ended[e].pop(0) for e, _, _, _ in w.ended]  # in the order the writer inserted them
    assert max(len(e) for e in inserted) == 45 and w.pending.tolist() == [len(m) for m in mine]
    assert not any(ended) and [e[1] for e in w.ended] == list(range(len(inserted)))  # ids in insertion order
    b = table.sample(table.size, 1, timeout=0)
    obs, got = b["obs"].numpy()[:, 0], b.priorities.numpy()
    if item_unit == "step":
        assert [(int(r[0]), int(r[1])) for r in obs] == [(i, tt) for ep in inserted for i, tt, _ in ep]
    else:  # an episode item's window starts at a step drawn in it
        assert [int(r[0]) for r in obs] == [ep[0][0] for ep in inserted]
        assert all(0 <= int(r[1]) < len(ep) for r, ep in zip(obs, inserted))
    expect_p, running = [], 1.0  # the table's default: the largest priority given so far (1.0 at first)
    for ep in inserted:
        given = [p for _, _, p in ep if p is not None]
        top = max(given, default=running)
        expect_p += [top if p is None else p for _, _, p in ep] if item_unit == "step" else [top]
        running = max(running, top)
    assert any(not any(p is not None for _, _, p in ep) for ep in inserted)  # some episode was given none
    np.testing.assert_allclose(got, expect_p)


def test_vector_writer_discard_drops_only_the_named_environments():
    table = gf.LocalTable(gf.TableSpec(COLS, capacity=256), sampler=gf.Fifo())
    w = gf.VectorWriter(table, 3)
    for k in range(20):  # past the first 16 steps: the buffer grows
        w.append({"obs": np.full((3, 3), k, np.float32), "t": np.full(3, k)})
    with pytest.raises(gf.SpecError, match="environment 3"):
        w.discard([0, 3])
    assert w.discard([2, 2]) == 20 and w.pending.tolist() == [20, 20, 0]
    w.end_episodes([1])
    assert table.sample(20, 1)["t"].numpy().ravel().tolist() == list(range(20))  # env 1's steps, in order
    assert table.size == 20 and w.pending.tolist() == [20, 0, 0]
    # a bad environment in end_episodes ends none of them
    other = gf.LocalTable(gf.TableSpec(COLS, capacity=256), sampler=gf.Fifo())
    w2 = gf.VectorWriter(other, 2)
    w2.append({"obs": np.zeros((2, 3), np.float32), "t": np.zeros(2, np.int64)})
    with pytest.raises(gf.SpecError, match="environment 5"):
        w2.end_episodes([0, 5])
    w2.end_episodes([1])
    assert other.size == 1 and w2.pending.tolist() == [1, 0]


# -- PriorityWriter ----------------------------------------------------------------------------------
class SlowTable:
    """Records update_priorities calls (in the writer's thread), each held until released."""

    def __init__(self):
        self.calls = []
        self.release = threading.Semaphore(0)

    def update_priorities(self, keys, priorities):
        self.release.acquire()
        self.calls.append((keys.tolist(), priorities.tolist()))
        return gf.UpdateResult(len(keys), 0)


def test_priority_writer_is_ordered_and_waits_only_past_the_backlog():
    t = SlowTable()
    pw = gf.PriorityWriter(t, backlog=3)
    keys = np.array([1, 2])
    for i in range(3):
        pw.update(keys, [i, i])  # returns at once: the table has not applied anything yet
        keys[:] = 99  # the caller reuses its buffer: the writer copied the keys
        keys[:] = [1, 2]
    assert pw.pending == 3 and t.calls == []
    done = threading.Event()

    def fourth():
        pw.update([1, 2], [3, 3])  # 4 pending > backlog 3: waits for the oldest
        done.set()

    th = threading.Thread(target=fourth)
    th.start()
    assert not done.wait(0.2)
    t.release.release()  # the oldest write goes through, the learner goes on
    assert done.wait(10)
    for _ in range(3):
        t.release.release()
    pw.close()
    th.join()
    assert t.calls == [([1, 2], [float(i)] * 2) for i in range(4)]
    assert pw.applied == 8 and pw.stale == 0


def test_priority_writer_raises_a_failed_write_on_the_learner():
    table = gf.LocalTable(gf.TableSpec(COLS, capacity=64))
    table.insert([{"obs": np.zeros((4, 3), np.float32), "t": np.arange(4)}])
    pw = gf.PriorityWriter(table, backlog=4)
    with pytest.raises(gf.UnknownKeyError):  # raised by this update if already done, else by the drain
        pw.update(np.array([123456789]), [1.0])
        pw.drain()
    pw.update(np.array([0]), [2.0])  # the writer goes on after a failed write
    pw.close()


def test_priority_writer_close_counts_every_write_and_raises_the_first_failure(make_table):
    """close() stopped at the first failed write: the writes queued after it stayed pending (``pending`` 2),
    one that reached the table was never counted (``applied`` 1 of 2), a second failure (a NaN priority)
    was never raised and a second close() returned None.  close() now collects every write, counts each,
    and raises the first failure naming the other; a second close() does nothing."""
    t = make_table(gf.TableSpec(COLS, capacity=64), sampler=gf.Prioritized(1.0), seed=0)
    r = t.insert([{"obs": np.zeros((4, 3), np.float32), "t": np.arange(4)}])
    k = int(r.first_keys[0])  # one episode: its items' keys are k, k + 1, ...
    pw = gf.PriorityWriter(t, backlog=None)
    gate = threading.Event()
    pw.call(gate.wait, 10)  # holds the writes below on the thread, so no update() raises a failure
    pw.update([k], [2.0])  # applied
    pw.update([k + 1], [-1.0])  # fails
    pw.update([k + 2], [5.0])  # applied
    pw.update([k + 3], [float("nan")])  # fails as well
    assert pw.pending == 5
    gate.set()
    with pytest.raises(gf.InvalidPriorityError, match=r"= -1\.0 is invalid.*1 later write failed") as e:
        pw.close()
    assert e.value.value == -1.0 and "\n" not in str(e.value)
    assert pw.pending == 0 and pw.applied == 2 and pw.stale == 0
    pw.close()  # already closed: nothing left to raise
    with pytest.raises(gf.TableClosedError):
        pw.update([k], [1.0])


WRITERS = {
    "episode": (lambda t: t.writer(timeout=0.05), lambda w, i: w.append(step(0, i))),
    "trajectory": (lambda t: gf.TrajectoryWriter(t, chunk_length=8, timeout=0.05), lambda w, i: w.append(step(0, i))),
    "vector": (
        lambda t: gf.VectorWriter(t, num_envs=2, timeout=0.05),
        lambda w, i: w.append({"obs": np.array([[0, i, 0], [1, i, 0]], np.float32), "t": np.array([i, i])}),
    ),
}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_a_close_whose_insert_failed_can_be_retried_and_loses_nothing(make_table, kind):
    """A writer whose close() failed on its last insert (the queue full) was marked closed anyway: a retried
    close() returned at once and the buffered steps were never inserted, with no error or warning.  The
    writer now stays open until its close goes in."""
    make, append = WRITERS[kind]
    t = make_table.queue(gf.TableSpec(COLS, capacity=64), 8)
    t.insert({"obs": np.zeros((8, 3), np.float32), "t": np.arange(8)})  # full
    w = make(t)
    for i in range(3):
        append(w, i)
    with pytest.raises(gf.RateLimitTimeout):
        w.close()
    assert t.sample(8, 1, timeout=5)["t"].numpy()[:, 0].tolist() == list(range(8))  # a learner empties it
    w.close()  # retried: what it held goes in
    got = t.sample(t.info()["size"], 1, timeout=5)["obs"].numpy()[:, 0, 1].tolist()
    assert sorted(got) == ([0, 0, 1, 1, 2, 2] if kind == "vector" else [0, 1, 2])
    with pytest.raises(gf.TableClosedError):  # and is closed now
        append(w, 3)


def test_vector_episodes_that_end_together_beyond_what_one_insert_may_hold_go_in_one_by_one(make_table):
    """Every episode ending on the same step went in as one insert: on a Queue of 8, two 5-step episodes that
    each fit made a 10-item insert that can never be admitted, and the writer raised that SpecError on every
    later append, inserting nothing.  They now go in one each when together they cannot."""
    t = make_table.queue(gf.TableSpec(COLS, capacity=64), 8)
    w = gf.VectorWriter(t, num_envs=2, timeout=5)
    taken = []

    def learner():
        while len(taken) < 10:
            taken.extend(t.sample(1, 1, timeout=10)["t"].numpy()[:, 0].tolist())

    th = threading.Thread(target=learner)
    th.start()
    for i in range(5):
        w.append({"obs": np.array([[0, i, 0], [1, i, 0]], np.float32), "t": np.array([i, 10 + i])}, done=[i == 4] * 2)
    th.join(30)
    assert not th.is_alive()
    assert taken == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]  # each episode whole, in the order they ended
    assert [(e, n) for e, _, n, _ in w.ended] == [(0, 5), (1, 5)] and w.pending.tolist() == [0, 0]


def test_vector_episodes_that_end_together_are_returned_in_environment_order_and_overflow_one_by_one(make_table):
    """Two ways episodes ending on one step went wrong.  Some given priorities and others none go in as two
    inserts, and the result listed them insert by insert: env 1's episode first, where ``append`` promises one
    row per ended environment in environment order.  And episodes that each fit a shard's ring but together
    did not (two of 6 steps, capacity 10) made one insert refused with CapacityError on every later append:
    the writer inserted nothing again.  Rows come in environment order; such episodes go in one by one."""
    t = make_table(gf.TableSpec(COLS, capacity=64), sampler=gf.Prioritized(1.0), seed=0)
    w = gf.VectorWriter(t, num_envs=2)
    w.append({"obs": np.zeros((2, 3), np.float32), "t": np.array([0, 10])}, done=[True, False], priorities=[1.0, 2.0])
    r = w.append({"obs": np.zeros((2, 3), np.float32), "t": np.array([1, 11])}, done=[True, True])
    env = {eid: e for e, eid, _, _ in w.ended}
    assert [env[int(i)] for i in r.episode_ids] == [0, 1]
    assert r.shards.tolist() == [0, 0] and len(set(r.first_keys.tolist())) == 2

    t = make_table(gf.TableSpec(COLS, capacity=10), seed=0)
    w = gf.VectorWriter(t, num_envs=2)
    for i in range(6):
        r = w.append({"obs": np.zeros((2, 3), np.float32), "t": np.array([i, 10 + i])}, done=[i == 5] * 2)
    assert [(e, n) for e, _, n, _ in w.ended] == [(0, 6), (1, 6)] and w.pending.tolist() == [0, 0]
    assert len(r.episode_ids) == 2 and t.size == 6  # the second overwrote the first in the ring of 10
