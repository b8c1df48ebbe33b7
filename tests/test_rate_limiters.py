"""Rate limiters with Reverb semantics, enforced by a LocalTable (blocking, timeouts, close)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers import scalar_episode, x_spec

from gear_flow import (
    Fifo,
    GearFlowError,
    LocalTable,
    MinSize,
    Queue,
    RateLimitTimeout,
    SampleToInsertRatio,
    SpecError,
    Stack,
    TableClosedError,
    Uniform,
    WindowTooLongError,
)

SHORT = 0.05  # seconds a call that must block is given before it times out


def one(v: float) -> dict:
    return {"x": np.array([v], np.float32)}


class Caller(threading.Thread):
    """Runs ``fn`` in a thread and records its result or exception."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn = fn
        self.result = None
        self.error = None
        self.finished = threading.Event()

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - recorded for the test to inspect
            self.error = e
        finally:
            self.finished.set()


def assert_blocked(c: Caller, for_s: float = 0.15):
    assert not c.finished.wait(for_s), f"call returned while it should block: {c.result!r} {c.error!r}"


# ---------------------------------------------------------------------------- construction


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3", None])
def test_min_size_validation(n):
    with pytest.raises(SpecError, match="min_size_to_sample"):
        MinSize(n)


@pytest.mark.parametrize(
    "spi, min_size, eb",
    [
        (1.0, 10, 0.9),  # spans 1.8 < 2 * max(1, 1)
        (4.0, 10, 3.9),  # spans 7.8 < 2 * 4
        (0.5, 10, (4.0, 5.5)),  # spans 1.5 < 2 * max(1, 0.5)
        (3.0, 2, (0.0, 5.0)),  # spans 5 < 6
    ],
)
def test_error_buffer_too_small(spi, min_size, eb):
    with pytest.raises(SpecError, match="spans"):
        SampleToInsertRatio(spi, min_size, eb)


@pytest.mark.parametrize("spi, min_size, eb", [(1.0, 10, 1.0), (4.0, 10, 4.0), (0.5, 10, (4.0, 6.0))])
def test_error_buffer_minimum_accepted(spi, min_size, eb):
    lim = SampleToInsertRatio(spi, min_size, eb)
    assert lim.max_diff - lim.min_diff == pytest.approx(2 * max(1.0, spi))


def test_error_buffer_scalar_is_centred_on_offset():
    lim = SampleToInsertRatio(samples_per_insert=4, min_size_to_sample=100, error_buffer=50)
    assert (lim.min_diff, lim.max_diff) == (350.0, 450.0)


def test_min_diff_above_offset_rejected():
    # offset = spi * min_size = 10; min_diff 11 would deadlock at min size
    with pytest.raises(SpecError, match="min_diff"):
        SampleToInsertRatio(1.0, 10, (11.0, 20.0))
    assert SampleToInsertRatio(1.0, 10, (10.0, 20.0)).min_diff == 10.0


def test_max_diff_below_offset_accepted():
    """Reverb accepts it: the first min_size_to_sample inserts are free, then sampling starts (issue 15, 7)."""
    lim = SampleToInsertRatio(1.0, 10, (0.0, 9.0))
    assert (lim.min_diff, lim.max_diff) == (0.0, 9.0)


@pytest.mark.parametrize(
    "eb",
    [0, -3, float("nan"), float("inf"), "x", None, (1,), (1, 2, 3), (float("nan"), 5.0), (-5.0, float("nan")),
     (-float("inf"), float("inf")), ("1", "5"), (True, 5)],
)  # fmt: skip
def test_error_buffer_bad_values(eb):
    with pytest.raises(SpecError):
        SampleToInsertRatio(1.0, 1, eb)


@pytest.mark.parametrize("spi", [0, -1, float("inf"), float("nan"), "2"])
def test_samples_per_insert_validated(spi):
    with pytest.raises(SpecError, match="samples_per_insert"):
        SampleToInsertRatio(spi, 1, 10)


@pytest.mark.parametrize("size", [0, -1, 2.0, True])
def test_queue_size_validated(size):
    with pytest.raises(SpecError, match="queue size"):
        Queue(size)


def test_min_size_larger_than_max_size_rejected():
    with pytest.raises(SpecError, match=r"min_size_to_sample \(11\).*max_size \(10\)"):
        LocalTable(x_spec(capacity=10), rate_limiter=MinSize(11))
    with pytest.raises(SpecError, match="max_size"):
        LocalTable(x_spec(capacity=100, max_size=5), rate_limiter=SampleToInsertRatio(1.0, 6, 10))
    assert LocalTable(x_spec(capacity=10), rate_limiter=MinSize(10)).size == 0


def test_queue_needs_matching_selectors():
    with pytest.raises(SpecError, match="LocalTable.queue"):
        LocalTable(x_spec(capacity=10), rate_limiter=Queue(4))
    with pytest.raises(SpecError, match="Lifo"):
        LocalTable(
            x_spec(capacity=10, max_size=4), sampler=Fifo(), remover=Fifo(), rate_limiter=Stack(4), max_times_sampled=1
        )


def test_rate_limiter_must_be_a_limiter():
    with pytest.raises(SpecError, match="RateLimiter"):
        LocalTable(x_spec(), rate_limiter="min_size")


# ---------------------------------------------------------------------------- MinSize


@pytest.mark.parametrize("bad", ["1", [1], float("nan"), -1, True])
def test_a_calls_bad_timeout_is_refused_before_it_joins_a_line(bad):
    """A call's own timeout is checked as the table's is: refused with nothing applied, and no place left
    behind in a line (which blocked every later call of its kind), nor a wait that never ends (NaN)."""
    t = LocalTable(x_spec(capacity=64), rate_limiter=MinSize(1))
    with pytest.raises(SpecError, match="timeout"):
        t.sample(1, timeout=bad)  # empty: it would have waited
    with pytest.raises(SpecError, match="timeout"):
        t.insert([scalar_episode(2)], timeout=bad)
    assert t.info()["waiting"] == {"inserts": 0, "samples": 0} and t.size == 0
    t.insert([scalar_episode(3)])
    assert len(t.sample(2, timeout=SHORT).keys) == 2


def test_a_sample_short_of_items_times_out_when_its_call_began_plus_its_timeout():
    """A sample admitted and found short of items (max_times_sampled) waits for inserts within its one
    timeout, counted from its call, not from the first time it came up short."""
    t = LocalTable(x_spec(capacity=64), sampler=Fifo(), remover=Fifo(), max_times_sampled=1, rate_limiter=MinSize(3))
    started, errors = threading.Event(), []

    def sample():
        started.set()
        try:
            t.sample(5, timeout=1.0)
        except RateLimitTimeout:
            errors.append(time.monotonic() - t0)

    t0 = time.monotonic()
    th = threading.Thread(target=sample)
    th.start()
    started.wait()
    while t.info()["waiting"]["samples"] == 0:  # waiting for 3 items (the limiter's)
        time.sleep(0.005)
    time.sleep(0.6)  # (the scenario: items come late, most of the timeout spent)
    t.insert([scalar_episode(3)])  # admitted now, and 3 items are short of 5: it waits again, what is left
    th.join()
    assert errors and errors[0] < 1.5, errors


@pytest.mark.parametrize("seed", range(6))
def test_the_limiter_counts_every_removal_the_ring_overwrite_included(seed):
    """A LocalTable's limiter counts each item removed, however (a ring's overwrite, the remover, a delete,
    an expiry), as a DistributedTable's does: inserts - deletes is the size, and its counts are the shards'."""
    rng = np.random.default_rng(seed)
    spec = x_spec(capacity=50, num_shards=int(rng.integers(1, 4)), max_size=int(rng.integers(20, 200)))
    t = LocalTable(spec, max_times_sampled=int(rng.integers(0, 4)), seed=seed)
    keys = np.zeros(0, np.int64)
    for _ in range(200):
        op = rng.integers(0, 3)
        if op == 0 or t.size < 10:
            t.insert([scalar_episode(int(rng.integers(1, 9)))])
        elif op == 1:
            keys = t.sample(4).keys.numpy()
        else:
            t.delete(keys[:2])
        lim, c = t.info()["rate_limiter"], t.info()["totals"]
        assert lim["inserts"] - lim["deletes"] == t.size
        assert (lim["inserts"], lim["samples"]) == (c["inserted"], c["sampled"])
        assert lim["deletes"] == c["evicted"] + c["removed"] + c["deleted"] + c["expired"]


def test_min_size_blocks_sampling_until_reached():
    t = LocalTable(x_spec(capacity=20), rate_limiter=MinSize(5), seed=0)
    t.insert(scalar_episode(4))
    with pytest.raises(RateLimitTimeout):
        t.sample(1, timeout=SHORT)
    c = Caller(lambda: t.sample(2, timeout=5))
    c.start()
    assert_blocked(c)
    t.insert(scalar_episode(1, 100.0))
    assert c.finished.wait(5) and c.error is None
    assert len(c.result) == 2
    assert t.rate_limiter.info()["samples"] == 2 and t.rate_limiter.info()["inserts"] == 5


def test_min_size_never_blocks_inserts():
    t = LocalTable(x_spec(capacity=20), rate_limiter=MinSize(3), seed=0)
    for i in range(30):
        t.insert(scalar_episode(1, i), timeout=0)
    assert t.size == 20


def test_min_size_counts_items_not_episodes():
    t = LocalTable(x_spec(capacity=20, item_unit="episode"), rate_limiter=MinSize(2), seed=0)
    t.insert(scalar_episode(10))
    with pytest.raises(RateLimitTimeout):
        t.sample(1, timeout=SHORT)
    t.insert(scalar_episode(1))
    assert len(t.sample(1, timeout=SHORT)) == 1


# ---------------------------------------------------------------------------- SampleToInsertRatio


def test_sample_to_insert_ratio_scenario():
    """spi=2, min_size=3, error_buffer=4: offset 6, min_diff 2, max_diff 10 (diff = 2*inserts - samples)."""
    t = LocalTable(x_spec(capacity=100), rate_limiter=SampleToInsertRatio(2.0, 3, 4.0), seed=0)
    # below min size inserts are free and sampling blocks
    t.insert(scalar_episode(2))
    with pytest.raises(RateLimitTimeout):
        t.sample(1, timeout=SHORT)
    t.insert(scalar_episode(1))  # size 3 == min size, diff = 6
    # a sample of n needs diff - n >= 2: four single samples, then blocked
    for _ in range(4):
        t.sample(1, timeout=SHORT)
    with pytest.raises(RateLimitTimeout):
        t.sample(1, timeout=SHORT)
    # diff = 2; an insert of k needs 2 + 2k <= 10: a batch of 5 can never pass (samples stop
    # at min_diff = 2), so it is rejected at once; 4 single inserts pass, a 5th waits
    with pytest.raises(SpecError, match="can never be admitted"):
        t.insert(scalar_episode(5), timeout=SHORT)
    for _ in range(4):
        t.insert(scalar_episode(1), timeout=SHORT)
    with pytest.raises(RateLimitTimeout):
        t.insert(scalar_episode(1), timeout=SHORT)
    # diff = 10: a batch of 8 leaves exactly min_diff
    assert len(t.sample(8, timeout=SHORT)) == 8
    with pytest.raises(RateLimitTimeout):
        t.sample(1, timeout=SHORT)
    info = t.rate_limiter.info()
    assert info["inserts"] == 7 and info["samples"] == 12
    assert (info["min_diff"], info["max_diff"]) == (2.0, 10.0)


@pytest.mark.parametrize(
    "spi, min_size, error_buffer, admitted",
    # admitted: the single inserts DeepMind Reverb 0.14 took before its first refusal, no samples (its table's
    # can_insert, checked side by side); max_diff 1.8, 5.1 and 1.5, which 0.1 * (inserts + 1) meets inexactly
    [(0.1, 1, 1.7, 18), (0.1, 1, 5.0, 50), (0.1, 2, 1.3, 15)],
)
def test_an_insert_at_max_diff_is_decided_as_reverb_decides_it(make_table, spi, min_size, error_buffer, admitted):
    """The boundary insert: the limiter computed diff + k * spi where Reverb computes (inserts + k) * spi -
    samples, and the two round apart for an spi such as 0.1 (17, 51 and 14 were admitted)."""
    t = make_table(x_spec(capacity=100), rate_limiter=SampleToInsertRatio(spi, min_size, error_buffer), seed=0)
    n = 0
    while True:
        try:
            t.insert(scalar_episode(1), timeout=SHORT)
        except RateLimitTimeout:
            break
        n += 1
    assert n == admitted and t.size == admitted


def test_blocked_insert_released_by_sample():
    t = LocalTable(x_spec(capacity=100), rate_limiter=SampleToInsertRatio(1.0, 1, (0.0, 2.0)), seed=0)
    t.insert(scalar_episode(2))  # diff 2 = max_diff
    c = Caller(lambda: t.insert(scalar_episode(1), timeout=5))
    c.start()
    assert_blocked(c)
    t.sample(1)
    assert c.finished.wait(5) and c.error is None
    assert t.size == 3


def test_failed_sample_gives_its_budget_back():
    t = LocalTable(x_spec(capacity=100), rate_limiter=SampleToInsertRatio(1.0, 1, 10.0), seed=0)
    t.insert(scalar_episode(3))
    with pytest.raises(WindowTooLongError):
        t.sample(2, length=4)
    assert t.rate_limiter.state.samples == 0
    assert len(t.sample(2, length=3)) == 2


# ---------------------------------------------------------------------------- impossible sizes


def test_impossible_sample_rejected_at_once():
    t = LocalTable(x_spec(capacity=100), rate_limiter=SampleToInsertRatio(1.0, 2, 3.0), seed=0)  # span 6
    t0 = time.monotonic()
    with pytest.raises(SpecError, match="can never be admitted"):
        t.sample(7)  # no timeout: would block forever
    assert time.monotonic() - t0 < 1.0
    assert t.rate_limiter.state.samples == 0


def test_impossible_insert_rejected_at_once_and_nothing_applied():
    t = LocalTable.queue(x_spec(capacity=100), 4)
    with pytest.raises(SpecError, match="can never be admitted"):
        t.insert(scalar_episode(5))
    with pytest.raises(SpecError, match="can never be admitted"):
        t.sample(5)
    assert t.size == 0 and t.rate_limiter.state.inserts == 0
    assert t.info()["totals"]["inserted"] == 0


def test_large_first_insert_admissible_before_sampling_starts():
    """min_diff 5, max_diff 15: a fresh table (diff 0) admits 12 items; once warm (diff >= 5) it never can."""
    t = LocalTable(x_spec(capacity=100), rate_limiter=SampleToInsertRatio(1.0, 10, 5.0), seed=0)
    t.insert(scalar_episode(12), timeout=SHORT)
    assert t.size == 12
    with pytest.raises(SpecError, match="can never be admitted"):
        t.insert(scalar_episode(11), timeout=SHORT)
    t.insert(scalar_episode(3), timeout=SHORT)  # diff 12 + 3 = 15 <= max_diff
    assert t.size == 15


# ---------------------------------------------------------------------------- Queue / Stack


def test_queue_fifo_each_once_and_blocks_when_full():
    q = LocalTable.queue(x_spec(capacity=100), 4, seed=0)
    for i in range(4):
        q.insert(one(i), timeout=SHORT)
    with pytest.raises(RateLimitTimeout):
        q.insert(one(99), timeout=SHORT)
    assert [float(q.sample(1, timeout=SHORT)["x"][0, 0]) for _ in range(2)] == [0.0, 1.0]
    q.insert(one(4), timeout=SHORT)
    q.insert(one(5), timeout=SHORT)
    b = q.sample(4, timeout=SHORT)
    assert b["x"].numpy().ravel().tolist() == [2.0, 3.0, 4.0, 5.0]
    with pytest.raises(RateLimitTimeout):
        q.sample(1, timeout=SHORT)
    tot = q.info()["totals"]
    assert tot["size"] == 0 and tot["expired"] == 6 and tot["inserted"] == 6


@pytest.mark.parametrize("num_shards", [1, 2])
def test_queue_producer_consumer_threads(num_shards):
    n = 60
    q = LocalTable.queue(x_spec(capacity=128, num_shards=num_shards), 5, seed=1)

    def produce():
        for i in range(n):
            q.insert(one(i), timeout=10)

    def consume():
        got = []
        while len(got) < n:
            got += q.sample(1 + len(got) % 3 if n - len(got) >= 3 else 1, timeout=10)["x"].numpy().ravel().tolist()
        return got

    p, c = Caller(produce), Caller(consume)
    c.start()
    p.start()
    assert p.finished.wait(30) and c.finished.wait(30)
    assert p.error is None and c.error is None, (p.error, c.error)
    assert c.result == list(range(n))
    assert q.size == 0


def test_stack_lifo_each_once():
    s = LocalTable.stack(x_spec(capacity=100), 5, seed=0)
    for i in range(5):
        s.insert(one(i), timeout=SHORT)
    with pytest.raises(RateLimitTimeout):
        s.insert(one(9), timeout=SHORT)
    assert s.sample(2, timeout=SHORT)["x"].numpy().ravel().tolist() == [4.0, 3.0]
    s.insert(one(10), timeout=SHORT)
    assert s.sample(4, timeout=SHORT)["x"].numpy().ravel().tolist() == [10.0, 2.0, 1.0, 0.0]
    with pytest.raises(RateLimitTimeout):
        s.sample(1, timeout=SHORT)


def test_stack_threads_each_item_once():
    n = 40
    s = LocalTable.stack(x_spec(capacity=64, num_shards=2), 4, seed=2)
    p = Caller(lambda: [s.insert(one(i), timeout=10) for i in range(n)])
    c = Caller(lambda: [float(s.sample(1, timeout=10)["x"][0, 0]) for _ in range(n)])
    p.start()
    c.start()
    assert p.finished.wait(30) and c.finished.wait(30)
    assert p.error is None and c.error is None
    assert sorted(c.result) == list(range(n))


# ---------------------------------------------------------------------------- timeouts and close


def test_timeout_error_is_clear():
    t = LocalTable(x_spec(capacity=20), rate_limiter=MinSize(3), seed=0)
    t0 = time.monotonic()
    with pytest.raises(RateLimitTimeout) as e:
        t.sample(2, timeout=0.1)
    dt = time.monotonic() - t0
    assert 0.09 <= dt < 2.0
    msg = str(e.value)
    assert "a sample of 2" in msg and "MinSize(min_size_to_sample=3)" in msg and "0.1 s" in msg
    assert "table size 0" in msg
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, GearFlowError)


def test_table_default_timeout_applies():
    t = LocalTable(x_spec(capacity=20), rate_limiter=MinSize(3), timeout=0.05, seed=0)
    with pytest.raises(RateLimitTimeout, match="0.05 s"):
        t.sample(1)


@pytest.mark.parametrize("what", ["sample", "insert"])
def test_close_wakes_blocked_callers(what):
    q = LocalTable.queue(x_spec(capacity=100), 2, seed=0)
    if what == "insert":
        q.insert(one(0))
        q.insert(one(1))
        fn = lambda: q.insert(one(2))  # noqa: E731 - blocks forever without close
    else:
        fn = lambda: q.sample(1)  # noqa: E731
    callers = [Caller(fn) for _ in range(3)]
    for c in callers:
        c.start()
    for c in callers:
        assert_blocked(c, 0.05)
    q.close()
    for c in callers:
        assert c.finished.wait(5), "close() did not wake a blocked caller"
        assert isinstance(c.error, TableClosedError)


def test_closed_table_refuses_calls():
    t = LocalTable(x_spec(capacity=20), rate_limiter=MinSize(1), seed=0)
    r = t.insert(scalar_episode(3))
    with t:
        pass  # __exit__ closes
    for call in (
        lambda: t.insert(scalar_episode(1)),
        lambda: t.sample(1),
        lambda: t.update_priorities(r.first_keys, [1.0]),
        lambda: t.delete(r.first_keys),
    ):
        with pytest.raises(TableClosedError):
            call()
    assert t.size == 3


def test_uniform_table_with_ratio_limiter_threads_reach_the_ratio():
    """An actor and a learner in threads: the limiter keeps samples/inserts near spi."""
    spi = 3.0
    t = LocalTable(x_spec(capacity=512), sampler=Uniform(), rate_limiter=SampleToInsertRatio(spi, 10, 12.0), seed=0)
    stop = threading.Event()

    def actor():
        i = 0
        while not stop.is_set():
            try:
                t.insert(scalar_episode(2, i), timeout=0.05)
                i += 2
            except RateLimitTimeout:
                pass

    def learner():
        for _ in range(150):
            t.sample(2, timeout=10)

    a, l = Caller(actor), Caller(learner)
    a.start()
    l.start()
    assert l.finished.wait(60) and l.error is None, l.error
    stop.set()
    assert a.finished.wait(10) and a.error is None
    st = t.rate_limiter.state
    diff = st.inserts * spi - st.samples
    assert t.rate_limiter.min_diff - 2 * spi <= diff <= t.rate_limiter.max_diff


def test_a_timeout_error_quotes_the_calls_timeout(make_table):
    """A distributed sample quoted the time it had left when it asked the coordinator ("within
    0.09999862 s" for timeout=0.1); every kind of table quotes the call's own."""
    t = make_table(x_spec(capacity=20), rate_limiter=MinSize(3), seed=0)
    with pytest.raises(RateLimitTimeout) as e:
        t.sample(2, timeout=0.1)
    assert "a sample of 2" in str(e.value) and "within 0.1 s" in str(e.value), str(e.value)
