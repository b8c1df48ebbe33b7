"""Property-based fuzzing of the public entry points with malformed input.

Every call either succeeds or raises a GearFlowError subclass with a message;
a rejected call changes nothing (the whole table state is compared); the
accounting identity holds throughout.  Derandomized, so CI is reproducible.
"""

from __future__ import annotations

import numpy as np
import pytest
from dist_support import assert_same, on_both_tables, snapshot
from helpers import COLUMNS, episode, reconcile
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import gear_flow as gf

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
#: the distributed table: fewer examples (each is a table on the cluster, every call a round trip)
DIST_SETTINGS = settings(SETTINGS, max_examples=25)

junk_scalar = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.booleans(),
)
dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.int8, np.bool_, np.complex64, "U3", object])


@st.composite
def junk_array(draw):
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    dt = draw(dtypes)
    try:
        return np.zeros(shape, dtype=dt)
    except (TypeError, ValueError):
        return np.zeros(shape)


@st.composite
def junk_episode(draw):
    good = episode(draw(st.integers(1, 100)), draw(st.integers(1, 12)))
    names = list(good)
    kind = draw(st.sampled_from(["good", "drop", "extra", "replace", "scalar", "not_mapping"]))
    if kind == "good":
        return good
    if kind == "drop":
        good.pop(draw(st.sampled_from(names)))
    elif kind == "extra":
        good[draw(st.text(min_size=1, max_size=4))] = draw(junk_array())
    elif kind == "replace":
        good[draw(st.sampled_from(names))] = draw(junk_array())
    elif kind == "scalar":
        good[draw(st.sampled_from(names))] = draw(junk_scalar)
    else:
        return draw(junk_scalar)
    return good


priorities = st.one_of(
    junk_scalar,
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=40),
    st.lists(st.floats(0, 10), min_size=1, max_size=40),
)


def fresh(make_table):
    t = make_table(gf.TableSpec(COLUMNS, capacity=64, num_shards=2), sampler=gf.Prioritized(), seed=0)
    t.insert([episode(1, 10), episode(2, 7)])
    return t


def attempt(t, fn, *args, **kw):
    before = snapshot(t)
    try:
        fn(*args, **kw)
    except gf.GearFlowError as e:
        assert str(e), "an error without a message"
        assert_same(before, snapshot(t))
    reconcile(t)


def _fuzz_insert(make_table, eps, prios, shard):
    t = fresh(make_table)
    attempt(t, t.insert, eps, prios, shard=shard if isinstance(shard, int) and not isinstance(shard, bool) else None)
    if isinstance(shard, (str, float)):
        attempt(t, t.insert, episode(3, 3), shard=shard)


def _fuzz_sample(make_table, batch, length, boundary, columns):
    t = fresh(make_table)
    b = batch if not isinstance(batch, int) or isinstance(batch, bool) or abs(batch) < 10_000 else 10_000
    n = length if not isinstance(length, int) or isinstance(length, bool) or abs(length) < 100 else 100
    attempt(t, t.sample, b, n, boundary=boundary, columns=columns, timeout=0.01)


def _fuzz_update_and_delete(make_table, keys, prios, use_real):
    t = fresh(make_table)
    if use_real:
        keys = t.sample(4, 1).keys.numpy()
    attempt(t, t.update_priorities, keys, prios)
    attempt(t, t.delete, keys)


def _fuzz_writer(make_table, step, prio):
    t = fresh(make_table)
    w = t.writer()
    good = {k: v[0] for k, v in episode(5, 1).items()}
    w.append(good)
    single = (
        step if not isinstance(step, dict) else {k: (v[0] if np.ndim(v) > 0 and len(v) else v) for k, v in step.items()}
    )
    before = snapshot(t)
    try:
        w.append(single, priority=prio if not isinstance(prio, (str, type(None))) or prio is None else prio)
    except gf.GearFlowError as e:
        assert str(e)
        assert w.pending == 1  # the bad step was not appended
    assert_same(before, snapshot(t))  # nothing reaches the table before end_episode
    try:
        w.end_episode()
    except gf.GearFlowError:
        pass
    reconcile(t)


test_fuzz_insert, test_fuzz_insert_distributed = on_both_tables(
    SETTINGS,
    DIST_SETTINGS,
    eps=st.one_of(junk_episode(), st.lists(junk_episode(), max_size=4)),
    prios=priorities,
    shard=st.one_of(st.none(), junk_scalar),
)(_fuzz_insert)
test_fuzz_sample, test_fuzz_sample_distributed = on_both_tables(
    SETTINGS,
    DIST_SETTINGS,
    batch=junk_scalar,
    length=junk_scalar,
    boundary=st.one_of(st.sampled_from(["strict", "pad_tail", "pad_head"]), st.text(max_size=6), st.none()),
    columns=st.one_of(st.none(), st.lists(st.sampled_from(["obs", "ep", "t", "done", "nope", ""]), max_size=3)),
)(_fuzz_sample)
test_fuzz_update_and_delete, test_fuzz_update_and_delete_distributed = on_both_tables(
    SETTINGS,
    DIST_SETTINGS,
    keys=st.one_of(
        junk_scalar, st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6), st.lists(junk_scalar, max_size=4)
    ),
    prios=priorities,
    use_real=st.booleans(),
)(_fuzz_update_and_delete)
test_fuzz_writer, test_fuzz_writer_distributed = on_both_tables(
    SETTINGS,
    DIST_SETTINGS,
    step=st.one_of(junk_episode(), junk_scalar),
    prio=junk_scalar,
)(_fuzz_writer)


def test_fuzz_covers_rejections(make_table):
    """The strategies above do produce rejected calls (so the fuzz tests can fail)."""
    t = fresh(make_table)
    with pytest.raises(gf.GearFlowError):
        t.insert({"obs": np.zeros((2, 3), np.float32)})
    with pytest.raises(gf.GearFlowError):
        t.update_priorities(t.sample(2, 1).keys, [float("nan"), 1.0])
