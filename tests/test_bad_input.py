"""Every public entry point fed bad input: a clear GearFlowError, and nothing partially applied."""

from __future__ import annotations

import copy
import re
import time

import numpy as np
import pytest
from helpers import episode, make_spec, shard_state

import gear_flow as gf
from gear_flow import (
    CapacityError,
    ColumnSpec,
    EmptyTableError,
    Fifo,
    GearFlowError,
    InvalidDataError,
    InvalidPriorityError,
    LocalTable,
    MaxHeap,
    Prioritized,
    RateLimitTimeout,
    SampleBuffers,
    SpecError,
    TableSpec,
    UnknownKeyError,
    WindowTooLongError,
    WithoutReplacement,
)
from gear_flow.keys import encode

CAP = 16


def _table(sampler=None):
    t = LocalTable(make_spec(capacity=CAP, num_shards=2), sampler=sampler or Prioritized(0.7, 0.5), seed=0)
    r = t.insert([episode(1, 5), episode(2, 7), episode(3, 2)], priorities=np.linspace(0.5, 3.0, 14))
    return t, r


def snapshot(t: LocalTable):
    """Everything an applied call could change."""
    shards = [shard_state(s) for s in t.shards]
    return copy.deepcopy(t.info()), shards, copy.deepcopy(t.rate_limiter.state), t._stamp


def assert_same(a, b):
    assert a[0] == b[0]
    assert a[2:] == b[2:]
    for x, y in zip(a[1], b[1]):
        assert x[0] == y[0] and x[6] == y[6] and x[7] == y[7]
        for k in x[1]:  # as bytes: unwritten ring memory may hold NaN patterns
            assert np.array_equal(x[1][k].view(np.uint8), y[1][k].view(np.uint8))
        for i in (2, 3, 4, 5):
            if x[i] is None:
                assert y[i] is None
            else:
                assert np.array_equal(x[i], y[i])


@pytest.fixture
def table():
    return _table()


def _ep(**over):
    e = episode(9, 3)
    e.update(over)
    return e


# ---------------------------------------------------------------------------- insert

BAD_INSERTS = [
    (
        "per-step shape",
        lambda: _ep(obs=np.zeros((3, 4), np.float32)),
        InvalidDataError,
        r"column 'obs': shape \(3, 4\)",
    ),
    ("ndim", lambda: _ep(obs=np.zeros((3, 3, 1), np.float32)), InvalidDataError, "shape"),
    ("scalar column as 2-d", lambda: _ep(t=np.zeros((3, 1), np.int32)), InvalidDataError, "'t'"),
    ("0-d", lambda: _ep(t=np.int32(1)), InvalidDataError, r"shape \(\)"),
    (
        "float into int",
        lambda: _ep(ep=np.array([1.0, 2.0, 3.0])),
        InvalidDataError,
        "float64 cannot be stored as int64",
    ),
    ("float into bool", lambda: _ep(done=np.array([0.0, 0.0, 1.0])), InvalidDataError, "cannot be stored as bool"),
    ("complex into float", lambda: _ep(obs=np.zeros((3, 3), np.complex64)), InvalidDataError, "complex64"),
    ("strings", lambda: _ep(t=np.array(["a", "b", "c"])), InvalidDataError, "not numeric"),
    ("objects", lambda: _ep(t=np.array([1, None, 2], dtype=object)), InvalidDataError, "not numeric"),
    ("None", lambda: _ep(t=None), InvalidDataError, "not numeric"),
    ("ragged", lambda: _ep(obs=[[1, 2, 3], [1, 2]]), InvalidDataError, "'obs'"),
    (
        "missing column",
        lambda: {k: v for k, v in _ep().items() if k != "done"},
        InvalidDataError,
        r"missing \['done'\]",
    ),
    ("extra column", lambda: _ep(reward=np.zeros(3, np.float32)), InvalidDataError, r"unknown \['reward'\]"),
    ("lengths differ", lambda: _ep(t=np.arange(4, dtype=np.int32)), InvalidDataError, "different lengths"),
    ("empty episode", lambda: episode(9, 0), InvalidDataError, "no steps"),
    ("not a mapping", lambda: [np.zeros(3)], InvalidDataError, "episode 0 is a ndarray"),
    ("a string", lambda: "obs", InvalidDataError, "mapping"),
    ("an int", lambda: 3, InvalidDataError, "mapping"),
    (
        "too long",
        lambda: episode(9, CAP + 1),
        CapacityError,
        f"{CAP + 1} steps, more than a shard's capacity \\({CAP}\\)",
    ),
]


@pytest.mark.parametrize("name, make, exc, match", BAD_INSERTS, ids=[b[0] for b in BAD_INSERTS])
def test_bad_insert_rejected_whole(table, name, make, exc, match):
    t, _ = table
    before = snapshot(t)
    bad = make()
    batch = [episode(7, 2), bad, episode(8, 3)] if isinstance(bad, dict) else bad
    with pytest.raises(exc, match=match) as e:
        t.insert(batch)
    assert isinstance(e.value, GearFlowError)
    assert_same(snapshot(t), before)


def test_bad_episode_is_named_by_position(table):
    t, _ = table
    with pytest.raises(InvalidDataError, match="episode 2, column 'ep'"):
        t.insert([episode(1, 2), episode(2, 2), _ep(ep=np.zeros(3, np.float32))])


def test_batch_larger_than_a_shard(table):
    t, _ = table
    before = snapshot(t)
    with pytest.raises(CapacityError, match="more than its capacity"):
        t.insert([episode(7, 10), episode(8, 10)], shard=0)
    with pytest.raises(CapacityError):
        t.insert([episode(i, 9) for i in range(5)])  # 45 steps over 2 shards of 16
    assert_same(snapshot(t), before)


@pytest.mark.parametrize(
    "priorities, exc, match",
    [
        ([1.0, 2.0], InvalidDataError, "got 2 priorities for 5 items"),
        (np.ones(6), InvalidDataError, "got 6 priorities"),
        ([1.0, 1.0, float("nan"), 1.0, 1.0], InvalidPriorityError, r"priority\[2\] = nan"),
        ([1.0, 1.0, 1.0, -2.0, 1.0], InvalidPriorityError, r"priority\[3\] = -2.0"),
        (float("inf"), InvalidPriorityError, r"priority\[0\] = inf"),
        ("high", InvalidDataError, "priorities must be numbers"),
        ({"a": 1}, InvalidDataError, "priorities must be numbers"),
        ([[1.0, 2.0], [1.0]], InvalidDataError, "got 1 priorities for episode 1's 3 items"),
        # as many as the items, each array not its episode's: the concatenation would shift them
        ([[1.0, 2.0, 3.0], [4.0, 5.0]], InvalidDataError, "got 3 priorities for episode 0's 2 items"),
        ([[1.0, 2.0], [3.0, 4.0, 5.0], [6.0]], InvalidDataError, "got 3 priority arrays for 2 episodes"),
        ([[1.0, 2.0], ["a", 1.0, 1.0]], InvalidDataError, "priorities of episode 1 must be numbers"),
        ([[1.0, 2.0], [1.0, float("nan"), 1.0]], InvalidPriorityError, r"priority\[3\] = nan"),
        (np.array([1 + 5j, 2, 3, 4, 5]), InvalidDataError, "priorities must be real numbers"),
        ([np.ones(2), np.array([1, 1 + 1j, 1])], InvalidDataError, "priorities of episode 1 must be real numbers"),
    ],
)
def test_bad_insert_priorities(table, priorities, exc, match):
    t, _ = table
    before = snapshot(t)
    with pytest.raises(exc, match=match):
        t.insert([episode(7, 2), episode(8, 3)], priorities)
    assert_same(snapshot(t), before)


@pytest.mark.parametrize("item_unit", ["step", "episode"])
def test_one_priority_array_per_episode_must_be_that_episodes(make_table, item_unit):
    """Per-episode priorities, as many as the items but not each its episode's, are refused by every table
    kind, nothing stored: concatenated, they would have shifted to the next episode's items."""
    t = make_table(make_spec(capacity=CAP, num_shards=2, item_unit=item_unit), sampler=Prioritized(), seed=0)
    eps = [episode(7, 2), episode(8, 3)]
    bad = [[1.0, 2.0, 3.0], [4.0, 5.0]] if item_unit == "step" else [[1.0, 2.0], []]
    with pytest.raises(InvalidDataError, match="priorities for episode 0's"):
        t.insert(eps, bad)
    assert t.info()["size"] == 0 and t.info()["totals"]["inserted"] == 0
    good = [[1.0, 2.0], [3.0, 4.0, 5.0]] if item_unit == "step" else [[1.0], [2.0]]
    t.insert(eps, good)
    b = t.sample(64, 1)  # every row's priority is its own item's
    for tag, step, pr in zip(b["ep"].numpy()[:, 0], b["t"].numpy()[:, 0], b.priorities.numpy()):
        assert pr == good[int(tag) - 7][int(step) if item_unit == "step" else 0]


@pytest.mark.parametrize("shard", [2, -1, "0", 1.0, True])
def test_bad_insert_shard(table, shard):
    t, _ = table
    before = snapshot(t)
    with pytest.raises(SpecError, match="shard"):
        t.insert(episode(7, 2), shard=shard)
    assert_same(snapshot(t), before)


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.insert(episode(7, 3), shard=True),
        lambda t: t.insert(episode(7, 3), shard=1.0),
        lambda t: t.insert_batch({k: v[None] for k, v in episode(7, 2).items()}, shard=np.float64(0.0)),
        lambda t: t.insert(episode(7, 3), timeout=-1),
        lambda t: t.insert(episode(7, 3), timeout="1"),
        lambda t: t.sample(2, timeout=-1),
        lambda t: t.sample(2, timeout=float("nan")),
        lambda t: t.sample(2, timeout="1"),
        lambda t: t.sample(2, timeout=1e10),
        lambda t: t.insert(episode(7, 3), timeout=1e10),
        lambda t: t.sample(2, rng="x"),
        lambda t: t.sample(2, rng=3),
        lambda t: t.sample(2, length=10**10, boundary="pad_tail"),
        lambda t: t.sample(2, length=CAP + 1, boundary="pad_head"),
        lambda t: t.writer(shard=True),
        lambda t: t.writer(shard=5),
        lambda t: t.writer(timeout=-1),
        lambda t: gf.TrajectoryWriter(t, 4, shard=5),
        lambda t: gf.VectorWriter(t, 2, timeout="soon"),
    ],
    ids=[
        "shard-True",
        "shard-1.0",
        "batch-shard-0.0",
        "insert-timeout--1",
        "insert-timeout-str",
        "sample-timeout--1",
        "sample-timeout-nan",
        "sample-timeout-str",
        "sample-timeout-1e10",
        "insert-timeout-1e10",
        "rng-str",
        "rng-int",
        "length-1e10",
        "length-over-capacity",
        "writer-shard-True",
        "writer-shard-5",
        "writer-timeout",
        "trajectory-writer-shard",
        "vector-writer-timeout",
    ],  # fmt: skip
)
def test_an_argument_no_call_could_use_is_refused_at_once_by_every_table(make_table, call):
    """A distributed table took ``shard=True`` and ``shard=1.0`` for shard 1 (a membership test: True == 1),
    sampled with a negative, NaN or string timeout, and sent a negative one to its coordinator, which refused
    it with a message about its wire field; a LocalTable refuses them all at the call.  Every table sampled with
    a generator that is not one into an AttributeError from deep in the draw, tried to allocate 224 GiB for a
    padded window of 10**10 steps (MemoryError), and made a writer with a shard or a timeout that only the
    insert at the end of its first episode refused.  Every table now refuses each at the call with a
    SpecError, nothing inserted or sampled."""
    t = make_table(make_spec(capacity=CAP, num_shards=2), seed=0)
    t.insert([episode(1, 3), episode(2, 3)])
    before = t.info()
    match = r"shard .* must be in \[0, 2\)|timeout .* must be (None or a number|at most 1e\+07 s)|rng|is longer than a"
    with pytest.raises(SpecError, match=match):
        call(t)
    after = t.info()
    assert (after["size"], after["totals"]) == (before["size"], before["totals"])
    assert len(t.sample(2, length=CAP, boundary="pad_tail", rng=np.random.default_rng(1))) == 2  # the longest one


def test_a_timeout_of_inf_waits_on_every_table(make_table):
    """timeout=inf passed the check ("None or a number of seconds >= 0") and then failed: a LocalTable's call
    that had to wait raised OverflowError at once, a distributed one a ProtocolError about its wire field (even
    one admitted at once).  inf now waits as long as the longest timeout (MAX_TIMEOUT_S, about 116 days), as a
    call's timeout, a writer's and a table's default; a finite one past that is refused (above)."""
    import threading

    from gear_flow.table.config import MAX_TIMEOUT_S

    t = make_table(make_spec(capacity=CAP, num_shards=2), rate_limiter=gf.MinSize(1), timeout=float("inf"), seed=0)
    assert t.timeout == MAX_TIMEOUT_S
    got = []
    th = threading.Thread(target=lambda: got.append(len(t.sample(2, timeout=float("inf")))))
    th.start()
    deadline = time.monotonic() + 60
    while not t.info()["waiting"]["samples"] and th.is_alive() and time.monotonic() < deadline:
        th.join(0.01)  # (until the sample is seen waiting: the insert must be what it waits for)
    assert t.info()["waiting"]["samples"] == 1, got
    t.insert(episode(1, 3), timeout=float("inf"))
    th.join(60)
    assert got == [2]
    w = t.writer(timeout=float("inf"))
    for step in range(2):
        w.append({k: v[step] for k, v in episode(2, 2).items()})
    w.end_episode()
    assert t.info()["size"] == 5


def test_values_that_a_cast_would_change_are_refused_by_every_table(make_table):
    """Complex priorities given as an array kept their real part only (a list of them was refused), an unsigned
    2**63 + 5 stored into an int64 column wrapped round to a negative number, as 300 into an int8 one, and a
    writer's priorities that were not numbers raised a bare ValueError.  Each is now an InvalidDataError of the
    call, nothing applied; integers that fit still cast."""
    spec = TableSpec((ColumnSpec("x", (), np.int64), ColumnSpec("small", (), np.int8)), capacity=CAP, num_shards=2)
    t = make_table(spec, sampler=Prioritized(1.0, 0.0), seed=0)
    r = t.insert({"x": np.arange(4), "small": np.arange(4, dtype=np.int8)}, priorities=1.0)
    before = t.info()
    with pytest.raises(InvalidDataError, match="priorities must be real numbers"):
        t.insert({"x": np.arange(2), "small": np.zeros(2, np.int8)}, np.array([1 + 5j, 2 + 0j]))
    with pytest.raises(InvalidDataError, match="priorities must be real numbers"):
        t.update_priorities(r.first_keys[:1], np.array([3 + 5j]))
    with pytest.raises(InvalidDataError, match="value 9223372036854775813 does not fit int64"):
        t.insert({"x": np.array([2**63 + 5], np.uint64), "small": np.zeros(1, np.int8)})
    with pytest.raises(InvalidDataError, match="value 300 does not fit int8"):
        t.insert({"x": np.arange(2), "small": np.array([1, 300])})
    with pytest.raises(InvalidDataError, match="priorities must be numbers"):
        gf.PriorityWriter(t).update(r.first_keys[:1], ["a"])
    w = gf.VectorWriter(t, 2)
    for bad in (["a", "b"], [1 + 1j, 1.0]):
        with pytest.raises(InvalidDataError, match="priorities must be"):
            w.append({"x": np.array([1, 2]), "small": np.array([1, 2], np.int8)}, priorities=bad)
    after = t.info()
    assert (after["size"], after["totals"]) == (before["size"], before["totals"])
    got = t.sample(4, 1)
    assert got.priorities.numpy().tolist() == [1.0] * 4  # no update was applied
    t.insert({"x": np.array([7], np.uint64), "small": np.array([-128])})  # in range: cast as before
    assert t.info()["size"] == 5


def test_keys_cast_to_a_narrower_integer_are_refused_by_every_table(make_table):
    """Keys cast to int32 (or any integer narrower than 64 bits) were taken as they came: a key of shard 1
    lost its shard's bits and named an item of shard 0, whose priority was set (or which was deleted) in its
    place, and the call reported every key applied.  Such keys are now refused with one line, nothing applied,
    by update_priorities, delete and a PriorityWriter; int64 and uint64 keys still apply."""
    import torch

    t = make_table(make_spec(capacity=CAP, num_shards=2), sampler=Prioritized(1.0, 0.0), seed=0)
    r = t.insert([episode(1, 6), episode(2, 6)], priorities=1.0)
    assert r.shards.tolist() == [0, 1]
    keys = int(r.first_keys[1]) + np.arange(4)  # items 0-3 of shard 1: as int32, items 0-3 of shard 0
    before = t.info()
    for bad in (keys.astype(np.int32), keys.astype(np.uint32), keys.astype(np.int16), torch.tensor(keys).int()):
        with pytest.raises(InvalidDataError, match="keys must be 64-bit integers .* got dtype u?int(32|16)"):
            t.update_priorities(bad, 9.0)
        with pytest.raises(InvalidDataError, match="keys must be 64-bit integers"):
            t.delete(bad)
        with pytest.raises(InvalidDataError, match="keys must be 64-bit integers"):
            gf.PriorityWriter(t).update(bad, np.full(4, 9.0))
    after = t.info()
    assert (after["size"], after["totals"]) == (before["size"], before["totals"])
    assert t.sample(12, 1).priorities.numpy().tolist() == [1.0] * 12  # no item's priority was set
    assert t.update_priorities(keys.astype(np.uint64), 2.0).applied == 4
    assert t.delete(keys[:2]).applied == 2 and t.info()["size"] == 10


def test_every_way_in_applies_the_inserts_rule_of_what_a_cast_may_change(make_table):
    """The writers checked only that a dtype casts within its kind: 300 appended to an int8 column was stored
    as 44, 2**40 to an int32 one as 0.  Unsigned columns refused signed integers that fit (an int64 [0, 255]
    into uint8, Python ints), so a table with uint8 actions could not ingest its own export; a float that
    overflows a narrower float was stored as inf; a tensor that requires grad raised torch's bare
    RuntimeError.  Every way in (insert, insert_batch, both writers) now refuses the same values with one
    line, nothing applied, and takes the others."""
    import torch

    spec = TableSpec(
        (ColumnSpec("u", (2,), np.uint8), ColumnSpec("small", (), np.int8), ColumnSpec("h", (), np.float16)),
        capacity=CAP,
        num_shards=2,
    )
    t = make_table(spec, sampler=Fifo(), seed=0)
    ok = {"u": np.array([0, 255]), "small": -128, "h": 1.5}

    def lead(step, n):
        """``step``'s values with ``n`` leading dimensions of 1 (tensors stay tensors)."""
        return {k: v[(None,) * n] if torch.is_tensor(v) else np.asarray(v)[(None,) * n] for k, v in step.items()}

    def ways(step):
        """Each way in, with one step of ``step``'s values."""
        yield "insert", lambda: t.insert(lead(step, 1))
        yield "insert_batch", lambda: t.insert_batch(lead(step, 2))

        def episode_writer():
            with t.writer() as w:
                w.append(step)

        yield "writer", episode_writer
        yield "vector writer", lambda: gf.VectorWriter(t, 1).append(lead(step, 1), done=[True])

    bad = {
        "value 300 does not fit int8": {**ok, "small": 300},
        "value -1 does not fit uint8": {**ok, "u": np.array([-1, 3])},
        "value 256 does not fit uint8": {**ok, "u": [0, 256]},
        "value 70000.0 does not fit float16 \\(it would become inf\\)": {**ok, "h": 70000.0},
        "value -1000000.0 does not fit float16 \\(it would become -inf\\)": {**ok, "h": np.float64(-1e6)},
    }
    for message, step in bad.items():
        for way, call in ways(step):
            with pytest.raises(InvalidDataError, match=message) as e:
                call()
            assert "\n" not in str(e.value), way
    assert t.size == 0
    for _way, call in ways(ok):
        call()
    steps = [
        ok,
        {**ok, "h": np.inf, "u": [7, 8]},
        {"u": torch.tensor([1, 2]), "small": 5, "h": torch.ones((), requires_grad=True)},
    ]
    for step in steps[1:]:
        for _way, call in ways(step):
            call()
    assert t.size == 12
    b = t.sample(12, 1)
    assert b["u"].numpy()[:, 0].tolist() == [[0, 255]] * 4 + [[7, 8]] * 4 + [[1, 2]] * 4
    assert b["small"].numpy().ravel().tolist() == [-128] * 8 + [5] * 4
    assert b["h"].numpy().ravel().tolist() == [1.5] * 4 + [np.inf] * 4 + [1.0] * 4


def test_allowed_casts():
    """int64/float64 into float32, bool into anything numeric, small ints into wider ints."""
    spec = TableSpec((ColumnSpec("f", (2,), np.float32), ColumnSpec("i", (), np.int64)), capacity=8)
    t = LocalTable(spec, sampler=Fifo(), seed=0)
    t.insert({"f": np.array([[1, 2], [3, 4]], np.int64), "i": np.array([1, 2], np.int8)})
    t.insert({"f": np.array([[0.5, 1.5]], np.float64), "i": np.array([True])})
    t.insert({"f": [[True, False]], "i": [7]})
    b = t.sample(4)
    assert b["f"].numpy()[:, 0].tolist() == [[1, 2], [3, 4], [0.5, 1.5], [1, 0]]
    assert b["i"].numpy().ravel().tolist() == [1, 2, 1, 7]


# ---------------------------------------------------------------------------- sample


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"batch_size": 0}, r"batch_size \(0\)"),
        ({"batch_size": -3}, "batch_size"),
        ({"batch_size": 2.0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_size": "4"}, "batch_size"),
        ({"batch_size": None}, "batch_size"),
        ({"batch_size": 4, "length": 0}, r"length \(0\)"),
        ({"batch_size": 4, "length": 1.5}, "length"),
        ({"batch_size": 4, "boundary": "pad"}, "boundary 'pad' must be one of"),
        ({"batch_size": 4, "columns": ["obs", "nope"]}, "no column 'nope'"),
    ],
)
def test_bad_sample_args(table, kw, match):
    t, _ = table
    before = snapshot(t)
    with pytest.raises(SpecError, match=match):
        t.sample(**kw)
    assert_same(snapshot(t), before)


@pytest.mark.parametrize("sampler", [Prioritized(0.6), Fifo(), MaxHeap(), WithoutReplacement()], ids=repr)
def test_window_too_long_names_the_longest(sampler):
    t, _ = _table(sampler)
    before = snapshot(t)
    with pytest.raises(WindowTooLongError) as e:
        t.sample(4, length=8)
    assert e.value.longest == 7 and e.value.length == 8
    assert "longest: 7 steps" in str(e.value) and "window length 8" in str(e.value)
    assert isinstance(e.value, EmptyTableError)
    assert_same(snapshot(t), before)
    assert len(t.sample(4, length=7)) == 4  # the longest fits
    assert len(t.sample(4, length=8, boundary="pad_tail")) == 4


def test_zero_mass_samples_uniformly_and_too_long_windows_still_raise():
    """No item has weight: Reverb samples uniformly (1/n); a window that fits no episode still raises."""
    t = LocalTable(make_spec(capacity=CAP), sampler=Prioritized(1.0), seed=0)
    t.insert(episode(1, 4), priorities=0.0)
    assert t.sample(2).probabilities.numpy().tolist() == [0.25, 0.25]
    with pytest.raises(WindowTooLongError):
        t.sample(2, length=5)


def test_bad_out_buffers(table):
    t, _ = table
    spec = t.spec
    with pytest.raises(SpecError, match="out buffers"):
        t.sample(4, length=2, out=SampleBuffers(spec, spec.names, 4, 3))
    with pytest.raises(SpecError, match="out buffers"):
        t.sample(4, length=2, out=SampleBuffers(spec, ["obs"], 4, 2))


def test_out_buffers_made_for_other_columns_are_refused_by_every_table(make_table):
    """Buffers of the same names, B and L made for another table were taken: a column of another dtype and
    the same row size came back as that dtype holding the table's bits (an int32 obs of float32 bits,
    1099956224), one of another row size failed inside the gather (IndexError).  Both are refused, naming
    what the buffers and the table hold, and nothing is consumed (a Fifo queue hands out its first item)."""
    t = make_table(
        make_spec(capacity=CAP), sampler=gf.Fifo(), remover=gf.Fifo(), rate_limiter=gf.Queue(8), max_times_sampled=1
    )
    t.insert([episode(1, 1), episode(2, 1)])
    other = {
        "same row size": (gf.ColumnSpec("obs", (3,), np.int32), gf.ColumnSpec("ep", (), np.int64)),
        "other row size": (gf.ColumnSpec("obs", (6,), np.float32), gf.ColumnSpec("ep", (), np.int64)),
    }
    for cols in other.values():
        buf = SampleBuffers(gf.TableSpec(cols, capacity=CAP), ["obs", "ep"], 1, 1)
        with pytest.raises(SpecError, match=r"out buffers are for columns \(obs (int32\(3,\)|float32\(6,\))"):
            t.sample(1, 1, columns=["obs", "ep"], out=buf)
    assert t.sample(1, 1)["ep"].numpy().tolist() == [[1]]
    assert t.sample(1, 1, out=SampleBuffers(t.spec, t.spec.names, 1, 1))["ep"].numpy().tolist() == [[2]]


# ---------------------------------------------------------------------------- keys and priorities


def _keys(r):
    return (r.first_keys[0] + np.arange(5)).tolist()


@pytest.mark.parametrize(
    "keys, exc, match",
    [
        (np.array([1.0, 2.0]), InvalidDataError, "keys must be integers, got dtype float64"),
        ("abc", InvalidDataError, "keys must be integers"),
        (None, InvalidDataError, "keys must be integers"),
        ([object()], InvalidDataError, "keys must be integers"),
        ("shard", UnknownKeyError, "names shard 5; this table has 2"),
        ("future", UnknownKeyError, "has issued item seqs below"),
        ("negative", UnknownKeyError, "names shard -1"),
        (
            np.array([2**64 - 1, 0], np.uint64),
            UnknownKeyError,
            r"key 0xffffffffffffffff is unknown.*keys are below 2\*\*63",
        ),
    ],
)
def test_bad_keys(table, keys, exc, match):
    t, r = table
    special = {
        "shard": [int(r.first_keys[0]), int(encode(5, np.array([0]))[0])],
        "future": [int(r.first_keys[0]), int(encode(0, np.array([999]))[0])],
        "negative": [int(r.first_keys[0]), -5],
    }
    keys = special.get(keys, keys) if isinstance(keys, str) else keys
    n = 2 if keys is None or isinstance(keys, str) else len(keys)
    before = snapshot(t)
    with pytest.raises(exc, match=match):
        t.update_priorities(keys, np.full(n, 9.0))
    with pytest.raises(exc, match=match):
        t.delete(keys)
    assert_same(snapshot(t), before)


@pytest.mark.parametrize(
    "priorities, exc, match",
    [
        ([1.0, 2.0, float("nan"), 1.0, 1.0], InvalidPriorityError, r"priority\[2\] = nan"),
        ([1.0, 2.0, 3.0, 4.0, -0.5], InvalidPriorityError, r"priority\[4\] = -0.5"),
        ([float("-inf")] * 5, InvalidPriorityError, r"priority\[0\] = -inf"),
        ([1.0] * 4, InvalidDataError, "got 4 priorities for 5 keys"),
        (None, SpecError, "must not be None"),
        ("x", InvalidDataError, "priorities must be numbers"),
    ],
)
def test_bad_update_priorities(table, priorities, exc, match):
    t, r = table
    before = snapshot(t)
    with pytest.raises(exc, match=match):
        t.update_priorities(_keys(r), priorities)
    assert_same(snapshot(t), before)


def test_stale_key_in_a_batch_does_not_block_the_rest(table):
    """Stale keys are not errors: counted, the rest applied."""
    t, r = table
    k = _keys(r)
    t.delete(k[:1])
    res = t.update_priorities(k, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert (res.applied, res.stale) == (4, 1)
    res = t.delete(k[:2])
    assert (res.applied, res.stale) == (1, 1)


# ---------------------------------------------------------------------------- construction / writer


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"spec": "spec"}, "TableSpec"),
        ({"sampler": "uniform"}, "sampler must be a Selector"),
        ({"remover": Fifo}, "remover must be a Selector"),
        ({"remover": WithoutReplacement()}, "cannot be used as a remover"),
        ({"max_times_sampled": -1}, "max_times_sampled"),
        ({"max_times_sampled": True}, "max_times_sampled"),
        ({"max_times_sampled": 1.0}, "max_times_sampled"),
        # each item's count is an int32: a larger limit let the counts wrap round to negative numbers
        ({"max_times_sampled": 2**31}, r"max_times_sampled \(2147483648\) must be at most 2147483647 \(0: no limit\)$"),
        ({"boundary": "both"}, "boundary"),
        ({"routing": "random"}, "routing 'random'"),
        ({"tier": "gpu"}, "storage tier 'gpu' is unknown"),
    ],
)
def test_bad_construction(kw, match):
    args = {"spec": make_spec(), **kw}
    spec = args.pop("spec")
    with pytest.raises(SpecError, match=match):
        LocalTable(spec, **args)
    if kw.get("max_times_sampled") == 2**31:  # the largest is taken
        LocalTable(spec, max_times_sampled=2**31 - 1).close()


@pytest.mark.parametrize(
    "step, priority, exc",
    [
        ({"obs": [[1, 2], [3]]}, None, InvalidDataError),
        ({"obs": np.zeros(4, np.float32)}, None, InvalidDataError),
        ({"t": 1.5}, None, InvalidDataError),
        ({"t": "a"}, None, InvalidDataError),
        ({"extra": 1}, None, InvalidDataError),
        ({}, float("nan"), InvalidPriorityError),
        ({}, -1.0, InvalidPriorityError),
        ({}, "high", InvalidDataError),
    ],
)
def test_bad_writer_steps(table, step, priority, exc):
    t, _ = table
    before = snapshot(t)
    w = t.writer()
    good = {k: v[0] for k, v in episode(1, 1).items()}
    w.append(good)
    with pytest.raises(exc):
        w.append({**good, **step}, priority=priority)
    assert w.pending == 1
    assert_same(snapshot(t), before)


def test_missing_writer_column(table):
    t, _ = table
    w = t.writer()
    with pytest.raises(InvalidDataError, match="do not match"):
        w.append({"obs": np.zeros(3, np.float32)})
    assert w.pending == 0


def test_rate_limit_timeout_applies_nothing():
    t = LocalTable.queue(make_spec(capacity=CAP), 3, seed=0)
    t.insert(episode(1, 3))
    before = snapshot(t)
    with pytest.raises(RateLimitTimeout):
        t.insert(episode(2, 1), timeout=0.01)
    assert_same(snapshot(t), before)
    t.sample(3)
    assert t.insert(episode(3, 1), timeout=0.01).episode_ids.tolist() == [1]


def test_column_name_string_and_bool_exponents():
    t, _ = _table()
    b = t.sample(2, 1, columns="obs")  # one name, not its characters
    assert list(b.data) == ["obs"]
    with pytest.raises(SpecError):
        t.sample(2, 1, columns="nope")
    for kw in ({"beta": True}, {"alpha": False}):
        with pytest.raises(SpecError):
            Prioritized(**kw)


def test_configured_values_of_the_wrong_kind_are_refused_naming_the_key(dist_client):
    """A string or a negative number for a configured seed, timeout or count was refused by NumPy deep inside
    the table's construction (seed: TypeError, ValueError), by a TypeError inside the event loop
    (rpc-timeout 'abc'), after a request waited -15 s (rpc-timeout -5), at the first sample (sample-lease
    -1), or never (scale-down 'bogus').  Each is refused when a table is set up, naming the key, and the
    cluster builds nothing."""
    import dask

    from gear_flow import config
    from gear_flow.distributed import DistributedTable

    spec = make_spec(capacity=CAP)
    for bad in ("abc", -1, 1.5):
        with dask.config.set({"gear-flow.table.seed": bad}):
            with pytest.raises(SpecError, match=r"gear-flow.table.seed \(configuration\) = "):
                LocalTable(spec)
    with pytest.raises(SpecError, match="seed = 'x' must be an integer >= 0"):
        LocalTable(spec, seed="x")
    with pytest.raises(SpecError, match="seed = -2 must be an integer >= 0"):
        DistributedTable.create(dist_client, make_spec(capacity=CAP, num_shards=2), seed=-2)

    def names(dask_scheduler):
        p = dask_scheduler.plugins.get("gear-flow-coordinator")
        return sorted(p.tables) if p is not None else []

    tables = dist_client.run_on_scheduler(names)
    cases = [("rpc-timeout", "abc"), ("rpc-timeout", -5), ("rpc-retries", 1.5), ("sample-lease", -1),
             ("admission-timeout", -5), ("mass-max-age", -1.0), ("reader-flush", "x"), ("scale-down", "bogus"),
             ("shared-memory", "yes"), ("move-timeout", float("inf"))]  # fmt: skip
    for key, bad in cases:
        with dask.config.set({f"gear-flow.distributed.{key}": bad}):
            with pytest.raises(
                SpecError, match=rf"gear-flow.distributed.{key} = {re.escape(repr(bad))} \(configuration\)"
            ):
                DistributedTable.create(dist_client, make_spec(capacity=CAP, num_shards=2), name=f"bad-{key}")
    assert dist_client.run_on_scheduler(names) == tables
    with dask.config.set({"gear-flow.distributed.omp-spin-count": None, "gear-flow.distributed.rpc-timeout": 30.5}):
        assert config.get("distributed.omp-spin-count") is None and config.get("distributed.rpc-timeout") == 30.5


def test_priorities_given_as_text_or_none_are_refused_as_not_numbers(make_table):
    """NumPy's cast read the text of a number as one: insert(priorities="7.5"), update_priorities(k, "4"),
    insert_batch with ["2", "3"] and a writer's priority="9" were stored as numbers, while "abc" was refused;
    [None] * n was reported as a NaN priority.  Text and None are refused as not numbers, nothing applied."""
    t = make_table(make_spec(capacity=CAP, num_shards=2), sampler=Prioritized(1.0), seed=0)
    keys = t.insert([episode(1, 2)], priorities=[1.0, 2.0]).first_keys[0] + np.arange(2)
    before = t.info()["totals"]
    for bad in ("7.5", ["1", "2"], [None, None], np.array(["1", "2"]), b"3"):
        with pytest.raises(InvalidDataError, match="priorities must be numbers"):
            t.insert([episode(2, 2)], priorities=bad)
        with pytest.raises(InvalidDataError, match="priorities must be numbers"):
            t.update_priorities(keys, bad)
    with pytest.raises(InvalidDataError, match="priorities must be numbers"):
        t.insert_batch({"obs": np.zeros((2, 1, 3), np.float32), "ep": np.zeros((2, 1), np.int64),
                        "t": np.zeros((2, 1), np.int32), "done": np.ones((2, 1), bool)}, priorities=["2", "3"])  # fmt: skip
    with t.writer() as w, pytest.raises(InvalidDataError, match="priority must be a number"):
        w.append({k: v[0] for k, v in episode(3, 1).items()}, priority="9")
    assert t.info()["totals"] == before and t.size == 2
