"""The steady-state paths of a sample and an insert give what the general paths give.

A sample's fused take (placement, gather and rows in one compiled call) against a shard's
``take`` and ``fill_rows`` for the same slots, on every boundary, with and without the
fused gather and on the disk tier; the sample arguments checked once still refuse what is
wrong; the batched episode check against the per-episode one; one tree repair for an
insert's evicted and inserted leaves against a repair per call; the weighted plan's draw
taken straight against the plan's generator; a one-shard table's sample drawn straight
against the plan's; an update that reads no item's flag in a shard without holes against
one that reads each.
"""

from __future__ import annotations

import numpy as np
import pytest

from gear_flow import ColumnSpec, LocalTable, Prioritized, SampleBuffers, TableSpec, Uniform
from gear_flow.errors import InvalidDataError, RateLimitTimeout, SpecError
from gear_flow.ops import gather, sumtree
from gear_flow.sample import NO_COUNTS
from gear_flow.table import planner
from gear_flow.table.validate import check_episode, check_episodes

ROWS = ("keys", "probabilities", "episode_ids", "timesteps", "priorities", "times_sampled", "mask")


def _spec(obs: int = 3, capacity: int = 500) -> TableSpec:
    return TableSpec(
        (ColumnSpec("obs", (obs,), np.float32), ColumnSpec("reward", (), np.float32), ColumnSpec("done", (), np.bool_)),
        capacity=capacity,
    )


def _episodes(n: int, seed: int, obs: int = 3, lo: int = 3, hi: int = 40) -> list[dict]:
    rng = np.random.default_rng(seed)
    eps = []
    for _ in range(n):
        T = int(rng.integers(lo, hi))
        eps.append(
            {
                "obs": rng.standard_normal((T, obs), dtype=np.float32),
                "reward": rng.standard_normal(T, dtype=np.float32),
                "done": np.arange(T) == T - 1,
            }
        )
    return eps


def _general(shard, slots, probs, scale, L, boundary, out, columns):
    """What a take into a batch was before the fused path: place and gather, then the rows."""
    prio = shard.priority[slots]
    win = shard.take(slots, L, boundary, np.random.default_rng(0), out.bytes, 0, columns, record=False)
    out.fill_rows(0, shard.shard_id, win.seqs, probs * scale, win.episode_ids, win.timesteps, win.dst_offset,
                  win.n_valid, prio, None)  # fmt: skip


@pytest.mark.parametrize("tier", ["host", "disk"])
@pytest.mark.parametrize("boundary", ["pad_tail", "pad_head", "strict"])
@pytest.mark.parametrize("L", [1, 4])
@pytest.mark.parametrize("obs", [3, 4096])  # 4096 floats x 4 steps x 80 rows: above the fused gather's size
def test_take_rows_is_take_and_fill_rows(tier, boundary, L, obs, tmp_path):
    spec = _spec(obs)
    kw = {"path": tmp_path / "t"} if tier == "disk" else {}
    table = LocalTable(spec, sampler=Prioritized(0.6, 0.4), tier=tier, seed=0, **kw)
    for i in range(4):  # the ring wraps: windows cross its end
        table.insert(_episodes(8, i, obs), priorities=None)
    shard = table.shards[0]
    rng = np.random.default_rng(1)
    B = 80
    fits = shard.valid_fn(L, boundary)
    live = np.flatnonzero(shard.active == 1)
    if fits is not None:
        live = live[fits(live)]
    slots = rng.choice(live, B)
    probs = rng.random(B)
    cols = spec.names
    got, ref = (SampleBuffers(spec, cols, B, L) for _ in range(2))
    with shard.lock:
        _general(shard, slots, probs, 0.5, L, boundary, ref, cols)
        before = shard.counters.sampled
        shard.take_rows(slots, probs, 0.5, L, boundary, np.random.default_rng(0), got, 0, cols)
        assert shard.counters.sampled == before + B  # recorded
    for name in cols:
        np.testing.assert_array_equal(got.bytes[name], ref.bytes[name])
    for f in ROWS:
        np.testing.assert_array_equal(getattr(got, f), getattr(ref, f), err_msg=f)
    table.close()


def test_take_rows_at_an_offset_writes_only_its_rows():
    spec = _spec()
    table = LocalTable(spec, sampler=Uniform(), seed=0)
    table.insert(_episodes(10, 0))
    shard = table.shards[0]
    out = SampleBuffers(spec, spec.names, 12, 2)
    for f in ("keys", "episode_ids", "timesteps"):
        getattr(out, f)[:] = -7
    slots = np.flatnonzero(shard.active == 1)[:5]
    with shard.lock:
        shard.take_rows(slots, np.ones(5), 1.0, 2, "pad_tail", np.random.default_rng(0), out, 4, spec.names)
    assert (out.keys[:4] == -7).all() and (out.keys[9:] == -7).all()
    np.testing.assert_array_equal(out.keys[4:9] & ((1 << 56) - 1), slots)  # one shard: seq = slot before a wrap
    with pytest.raises(IndexError), shard.lock:  # rows past the batch: nothing written, a clear error
        shard.take_rows(slots, np.ones(5), 1.0, 2, "pad_tail", np.random.default_rng(0), out, 10, spec.names)
    assert (out.keys[9:] == -7).all()


def test_fill_rows_refuses_rows_that_do_not_fit():
    out = SampleBuffers(_spec(), ("reward",), 4, 2)
    out.keys[:] = -1
    z = np.zeros(3, np.int64)
    with pytest.raises(IndexError, match="do not fit"):
        out.fill_rows(2, 0, z, np.ones(3), z, z, z, z + 1)
    with pytest.raises(IndexError, match="do not fit"):
        out.fill_rows(0, 0, z, np.ones(2), z, z, z, z + 1)  # probabilities of another length
    assert (out.keys == -1).all()
    out.fill_rows(1, 2, z + 5, np.ones(3), z, z, z, z + 1, None, NO_COUNTS)
    assert list(out.keys) == [-1, (2 << 56) | 5, (2 << 56) | 5, (2 << 56) | 5]
    assert np.isnan(out.priorities[1:]).all() and (out.times_sampled[1:] == -1).all()
    assert out.mask[1:].tolist() == [[True, False]] * 3


def test_sample_arguments_checked_once_still_refuse_what_is_wrong():
    spec = _spec()
    table = LocalTable(spec, sampler=Uniform(), seed=0)
    table.insert(_episodes(5, 0))
    buf = SampleBuffers(spec, ("obs",), 8, 3)
    for _ in range(2):  # the second call takes the checked arguments
        assert table.sample(8, 3, columns=["obs"], out=buf)["obs"].shape == (8, 3, 3)
    with pytest.raises(SpecError, match="boundary"):
        table.sample(8, 3, columns=["obs"], out=buf, boundary="edge")
    with pytest.raises(SpecError, match="out buffers"):
        table.sample(8, 2, columns=["obs"], out=buf)
    with pytest.raises(SpecError, match="out buffers"):
        table.sample(8, 3, columns=["obs", "reward"], out=buf)
    one = SampleBuffers(spec, spec.names, 1, 1)
    table.sample(1, 1, out=one)
    with pytest.raises(SpecError, match="batch_size"):
        table.sample(True, 1, out=one)  # equal to 1 and hashed as 1, yet not an integer batch size
    with pytest.raises(SpecError, match="batch_size"):
        table.sample(1.0, 1, out=one)
    with pytest.raises(SpecError):
        table.sample(8, 3, columns=[["obs"]])  # unhashable columns: checked every time


def test_check_episodes_is_check_episode_of_each():
    spec = _spec()
    eps = _episodes(20, 3)
    cols, lengths = check_episodes(spec, eps)  # every episode ready: kept as it is
    assert [c is e for c, e in zip(cols, eps)] == [True] * 20
    assert lengths.tolist() == [len(e["reward"]) for e in eps]
    mixed = [dict(e) for e in eps]
    mixed[7]["reward"] = mixed[7]["reward"].astype(np.float64)  # cast, as check_episode casts
    mixed[9]["obs"] = np.asfortranarray(mixed[9]["obs"])  # made contiguous
    mixed[11]["done"] = mixed[11]["done"].tolist()  # read as an array
    cols, lengths = check_episodes(spec, mixed)
    for i, (c, e) in enumerate(zip(cols, mixed)):
        ref, T = check_episode(spec, e, i)
        assert lengths[i] == T
        for name in spec.names:
            assert c[name].dtype == ref[name].dtype and c[name].flags.c_contiguous
            np.testing.assert_array_equal(c[name], ref[name])
    bad = [dict(e) for e in eps]
    bad[4]["reward"] = bad[4]["reward"][:-1]
    with pytest.raises(InvalidDataError, match="episode 4: columns have different lengths"):
        check_episodes(spec, bad)
    bad = [dict(e) for e in eps]
    bad[6]["obs"] = bad[6]["obs"][:, :2]
    with pytest.raises(InvalidDataError, match="episode 6, column 'obs'"):
        check_episodes(spec, bad)
    bad = [dict(e) for e in eps]
    del bad[2]["done"]
    with pytest.raises(InvalidDataError, match="missing"):
        check_episodes(spec, bad)
    bad = [dict(e) for e in eps]
    bad[5]["extra"] = bad[5]["reward"]  # one key too many
    with pytest.raises(InvalidDataError, match="unknown"):
        check_episodes(spec, bad)
    bad = [dict(e) for e in eps]
    bad[8]["dones"] = bad[8].pop("done")  # as many keys, one of them not a column
    with pytest.raises(InvalidDataError, match="missing"):
        check_episodes(spec, bad)


@pytest.mark.parametrize("n", [1, 7, 1000])
def test_one_repair_gives_the_tree_a_repair_per_call_gives(n):
    from gear_flow.backend import selection_ops
    from gear_flow.selectors.trees import SumTree

    rng = np.random.default_rng(n)
    ref, got = SumTree(selection_ops("host"), n), SumTree(selection_ops("host"), n)
    w = rng.random(n)
    for t in (ref, got):
        t.set(np.arange(n), w)
    gone, new = rng.integers(0, n, n // 2 + 1), rng.integers(0, n, n // 3 + 1)
    vals = rng.random(len(new))
    ref.set_const(gone, 0.0)
    ref.set(new, vals)
    with got.one_repair():
        got.set_const(gone, 0.0)
        got.set(new, vals)
        assert got.mass == ref.mass  # read inside: repaired first
        got.set_const(new[:1], 2.0)
    ref.set_const(new[:1], 2.0)
    np.testing.assert_array_equal(got.tree, ref.tree)
    tree = sumtree.new_tree(n)
    sumtree.set_leaves(tree, np.arange(n), ref.tree[len(tree) // 2 : len(tree) // 2 + n])
    np.testing.assert_array_equal(got.tree, tree)  # parents exactly the sums of their children


@pytest.mark.parametrize("n", [1, 2, 64, 1000, 4096])
@pytest.mark.parametrize("runs", [1, 2, 5, 16, 17, 40])
def test_a_repair_of_runs_of_leaves_is_the_tree_built_whole(n, runs):
    """Leaves written as runs of consecutive slots (an insert's), overlapping, across the ring's end,
    repeated, as many runs as the range repair takes and more (the general repair then): every node
    is exactly the sum of its children, as a tree built from all leaves at once."""
    rng = np.random.default_rng(n * 100 + runs)
    tree = sumtree.new_tree(n)
    sumtree.set_leaves(tree, np.arange(n), rng.random(n))
    for _ in range(3):
        parts = []
        for _ in range(runs):
            start, k = int(rng.integers(0, n)), int(rng.integers(1, max(2, n // 2)))
            parts.append((start + np.arange(k)) % n)
        idx = np.concatenate(parts)
        if runs == 40:
            idx = np.concatenate([idx, idx[::-1]])  # repeats, and descending slots
        sumtree.write_leaves(tree, idx, rng.random(len(idx)))
        sumtree.repair(tree, idx, np.empty(len(idx), np.int64))
        P = len(tree) // 2
        whole = sumtree.new_tree(n)
        sumtree.set_leaves(whole, np.arange(n), tree[P : P + n])
        np.testing.assert_array_equal(tree, whole)


@pytest.mark.parametrize("masses", [{0: 3.0}, {0: 1.0, 2: 0.0, 5: 2.5}, {1: 0.0, 3: 0.0}])
def test_weighted_draw_is_the_plans_draw(masses):
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    plan = planner.sample("weighted", 64, a)
    next(plan)  # its summary of the masses
    try:
        got = planner.weighted_draw(dict(masses), 64, b)
        if got is None:  # no mass anywhere: by the valid items' count
            got = planner.weighted_draw({s: 2.0 for s in masses}, 64, b, by_count=True)
    except planner.NothingToSample:
        got = "nothing"
    try:
        want = plan.send({"sampler": dict(masses)})
        if isinstance(want, planner.Summaries):
            want = plan.send({"valid": {s: 2.0 for s in masses}})
    except planner.NothingToSample:
        want = "nothing"
    assert got == want
    assert a.random() == b.random()  # the same draws of the generator


def test_gather_columns_still_refuses_outputs_of_other_rows():
    src = np.zeros((10, 4), np.uint8)
    out = np.zeros((3, 2, 4), np.uint8)
    w = np.zeros(2, np.int64)
    with pytest.raises(IndexError):
        gather.gather_columns([src], w, w, w + 1, [out])  # 3 output rows for 2 windows


def test_an_insert_places_each_steps_episode_and_stamp_run_by_run():
    """Across the ring's end: every slot written holds its episode's seq and its stamp (the episode's first
    item's stamp plus its index in the episode), and the shard's clock is past the last one."""
    spec = TableSpec((ColumnSpec("x", (), np.float32),), capacity=50)
    table = LocalTable(spec, sampler=Uniform(), seed=0)
    lengths = [7, 13, 9, 11, 16, 4, 20]
    for T in lengths:  # the last inserts wrap the ring
        table.insert({"x": np.zeros(T, np.float32)})
    shard = table.shards[0]
    seq, want_ep, want_stamp = 0, {}, {}
    stamp = 0
    for e, T in enumerate(lengths):
        for t in range(T):
            want_ep[seq % 50], want_stamp[seq % 50] = e, stamp + t
            seq += 1
        stamp += T
    live = np.flatnonzero(shard.active == 1)
    assert len(live) > 0 and shard.ring.write_pos == sum(lengths) > 50
    for slot in live:  # in slot order
        assert shard.step_episode[slot] == want_ep[slot], slot
        assert shard.touched[slot] == want_stamp[slot], slot
    assert shard._clock == sum(lengths)


def test_checked_sample_arguments_keep_no_buffers_alive():
    import gc
    import weakref

    spec = _spec()
    table = LocalTable(spec, sampler=Uniform(), seed=0)
    table.insert(_episodes(5, 0))
    a, b = SampleBuffers(spec, spec.names, 4, 2), SampleBuffers(spec, spec.names, 4, 2)
    for buf in (a, b, a, b):  # two buffers of the same arguments, in turn: each checked, each filled
        assert table.sample(4, 2, out=buf)["obs"].data_ptr() == buf.arrays["obs"].ctypes.data
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is None
    with pytest.raises(SpecError, match="out buffers"):  # other buffers of the same arguments are still checked
        table.sample(4, 2, out=SampleBuffers(spec, ("obs",), 4, 2))


def test_a_read_in_another_thread_leaves_held_changes_to_their_owner():
    """Another thread reading the mass (an eviction plan's summary takes no shard lock) sees the tree as
    it was and applies nothing; the owner's read applies them, and so does its leaving."""
    import threading

    from gear_flow.backend import selection_ops
    from gear_flow.selectors.trees import SumTree

    t = SumTree(selection_ops("host"), 8)
    t.set(np.arange(8), np.ones(8))
    seen = []
    with t.one_repair():
        t.set_const(np.arange(4), 3.0)
        other = threading.Thread(target=lambda: seen.append(t.mass))
        other.start()
        other.join()
        assert seen == [8.0] and t._pending  # the other thread applied nothing
        assert t.mass == 16.0  # the owner's read applies them
        t.set_const(np.arange(4, 8), 0.0)
    assert t.mass == 12.0 and not t._pending


def test_a_large_join_split_between_threads_writes_what_one_join_writes():
    """Many small parts of more than SPLIT_MIN_BYTES, across the ring's end: each thread's slice lands
    where a single join puts it."""
    from numba import get_num_threads

    rng = np.random.default_rng(7)
    parts = [rng.standard_normal((int(T), 512)).astype(np.float32) for T in rng.integers(1, 40, 400)]
    n = sum(len(p) for p in parts)
    assert n * 512 * 4 >= gather.SPLIT_MIN_BYTES and get_num_threads() >= 2
    cap = n + 1000
    for pos in (0, 500, cap - 3000):
        ring = np.zeros((cap, 512), np.float32)
        gather.scatter_chunks(ring, pos, parts, checked=True)
        want = np.zeros_like(ring)
        both = np.concatenate(parts)
        idx = (pos + np.arange(n)) % cap
        want[idx] = both
        np.testing.assert_array_equal(ring, want)


@pytest.mark.parametrize("row", [12, 20, 1024])
def test_a_compiled_join_writes_every_byte_at_every_alignment(row):
    """A large join of many small parts is copied by compiled loops from the parts' addresses: rows of 12
    and 20 bytes put every part's first byte at another offset from a word boundary, and parts of one row
    are a few bytes; the ring's bytes are those of one ``np.concatenate``, byte for byte, and nothing
    outside the rows written changes."""
    rng = np.random.default_rng(3)
    lengths = [1, *rng.integers(1, 7000 // row + 2, 3000)]  # ~10 MB of parts of ~3.5 KB
    parts = [rng.integers(0, 255, (int(T), row), dtype=np.uint8) for T in lengths]
    n = sum(len(p) for p in parts)
    assert n * row >= gather.SPLIT_MIN_BYTES
    cap = n + 777
    for pos in (0, 1, cap - n // 3):
        ring = np.full((cap, row), 0xEE, np.uint8)
        gather.scatter_chunks(ring, pos, parts, checked=True)
        want = np.full_like(ring, 0xEE)
        want[(pos + np.arange(n)) % cap] = np.concatenate(parts)
        np.testing.assert_array_equal(ring, want)


def test_a_join_of_parts_that_cannot_be_copied_from_their_addresses_is_the_same_join():
    """Parts that are not C-contiguous, or not exactly NumPy arrays, are joined by ``np.concatenate``
    (the compiled copy reads each part as one run of bytes from its own address)."""

    class Tagged(np.ndarray):
        pass

    rng = np.random.default_rng(4)
    base = [rng.standard_normal((int(T), 1024), dtype=np.float32) for T in rng.integers(2, 40, 600)]
    strided = [b[::2, :512] for b in base]
    tagged = [b[:, :512].copy().view(Tagged) for b in base]
    for parts in (strided, tagged, [*tagged[:-1], np.ascontiguousarray(tagged[-1])]):
        n = sum(len(p) for p in parts)
        assert n * 512 * 4 >= gather.SPLIT_MIN_BYTES
        out = np.zeros((n, 512), np.float32)
        gather.join_parts(parts, out)
        np.testing.assert_array_equal(out, np.concatenate([np.asarray(p) for p in parts]))


def _odd_arrays():
    """Arrays whose headers say different things: views at an offset, strided, Fortran order, empty,
    read-only, 3-d, another byte order, another dtype object equal to float32."""
    a = np.arange(120, dtype=np.float32)
    ro = a.reshape(40, 3)[2:]
    ro.flags.writeable = False
    meta = np.dtype(np.float32, metadata={"unit": "m"})
    return [a, a[7:], a.reshape(10, 12)[3], a.reshape(40, 3)[::2], np.asfortranarray(a.reshape(12, 10)), np.zeros(0),
            np.zeros((0, 3), np.float32), ro, np.ones((2, 3, 4), np.int8), a.reshape(40, 3).astype(">f4"),
            a.reshape(40, 3).astype(meta), a.reshape(40, 3, 1), a.reshape(30, 4)]  # fmt: skip


def test_array_headers_are_what_the_arrays_say():
    """Each array's address, rank, shape, dtype object and flags read off its object are its own attributes;
    a list holding anything but exactly NumPy arrays has none."""
    from gear_flow.ops import _mem

    arrays = _odd_arrays()
    head = _mem.array_headers(arrays)
    assert head[:, _mem.DATA].tolist() == [x.ctypes.data for x in arrays]
    assert head[:, _mem.NDIM].tolist() == [x.ndim for x in arrays]
    assert head[:, _mem.DESCR].tolist() == [id(x.dtype) for x in arrays]
    assert head[:, _mem.FLAGS].tolist() == [x.flags.num for x in arrays]
    shapes = [[_mem.word_at_py(int(h[_mem.DIMS]) + 8 * d) for d in range(x.ndim)] for h, x in zip(head, arrays)]
    assert shapes == [list(x.shape) for x in arrays]
    a = arrays[0]
    for other in (np.ma.masked_array(a), a.view(np.matrix), 3.0, [1.0], None):
        assert _mem.array_headers([a, other]) is None


@pytest.mark.parametrize("shape", [(), (3,)])
def test_ready_lengths_read_off_the_headers_are_what_asking_the_arrays_gives(shape, monkeypatch):
    """An insert's check of one column over many episodes, from the arrays' headers, accepts and measures
    exactly what asking each array does: ready parts with one odd part among them, at each place."""
    from gear_flow.table import validate

    c = ColumnSpec("x", shape, np.float32)
    rng = np.random.default_rng(3)
    ready = [rng.standard_normal((int(t), *shape), dtype=np.float32) for t in rng.integers(1, 6, 9)]
    cases = [list(ready)]
    for odd in [*_odd_arrays(), ready[0].tolist(), np.ma.masked_array(ready[0])]:
        for at in (0, 4, 9):
            cases.append([*ready[:at], odd, *ready[at:]])
    got = [validate._ready_lengths(parts, c) for parts in cases]
    monkeypatch.setattr(validate, "array_headers", lambda parts: None)  # the arrays asked instead
    want = [validate._ready_lengths(parts, c) for parts in cases]
    assert [None if g is None else g.tolist() for g in got] == [None if w is None else w.tolist() for w in want]
    assert got[0] is not None and sum(g is not None for g in got) > 1


@pytest.mark.parametrize("strided", [False, True])
def test_a_join_that_does_not_fill_its_output_writes_nothing(strided):
    """A large join checks the parts' bytes against the output's before it copies anything, by compiled
    copies or (parts not C-contiguous) by threads of np.concatenate."""
    parts = [np.ones((64, 2048 if strided else 1024), np.float32) for _ in range(40)]
    parts = [p[:, ::2] for p in parts] if strided else parts
    out = np.zeros((64 * 40 + 1, 1024), np.float32)
    with pytest.raises(ValueError, match="bytes of parts"):
        gather.join_parts(parts, out)
    assert not out.any()


def test_a_join_of_parts_of_another_row_shape_is_refused_not_copied_as_bytes():
    """Parts of the output's dtype and bytes but another row shape are not copied byte for byte: the join
    goes to ``np.concatenate``, which refuses them."""
    parts = [np.ones((64, 1024), np.float32) for _ in range(39)] + [np.ones((128, 512), np.float32)]
    out = np.zeros((64 * 40, 1024), np.float32)
    assert out.nbytes >= gather.SPLIT_MIN_BYTES and sum(p.nbytes for p in parts) == out.nbytes
    with pytest.raises(ValueError):
        gather.join_parts(parts, out)


def _insert_in_child(table, eps, q):
    table.insert(eps)
    q.put(table.size)


def test_a_child_forked_after_an_insert_can_insert():
    """The helper threads of a large insert belong to the process that made them: a child forked after
    one (a DataLoader worker) makes its own rather than waiting on threads it does not have."""
    import multiprocessing as mp

    spec = _spec(obs=2048, capacity=20_000)
    eps = _episodes(200, 1, obs=2048, lo=20, hi=40)  # ~24 MB of obs: a split join
    table = LocalTable(spec, sampler=Uniform(), seed=0)
    table.insert(eps)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_insert_in_child, args=(table, eps, q))
    child.start()
    child.join(120)
    assert child.exitcode == 0, child.exitcode
    table.insert(eps)  # the same second insert here: the child's table ends as this one
    assert q.get(timeout=10) == table.size > 0


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_list_insert_of_many_short_episodes_joins_its_large_column_compiled(tier, monkeypatch, tmp_path):
    """An insert of many short episodes joins each column by the compiled copy: a column larger than
    SPLIT_MIN_BYTES once per thread, a small one on this thread; across the ring's end, each side of it
    holding as many parts, into memory or a disk shard's mapped files; and the ring then holds every step
    as inserted, in order."""
    calls = []  # per call: the parts it copied, and the ring column it copied them into
    copy = gather._copy_parts
    monkeypatch.setattr(gather, "_copy_parts", lambda *a: (calls.append((len(a[2]), _base(a[0]))), copy(*a)))
    spec = _spec(obs=1024, capacity=12_000)
    kw = {"path": tmp_path / "t"} if tier == "disk" else {}
    table = LocalTable(spec, sampler=Uniform(), tier=tier, seed=0, **kw)
    for seed in (1, 2, 3):  # the third wraps the ring
        eps = _episodes(300, seed, obs=1024, lo=10, hi=20)
        calls.clear()
        table.insert(eps)
        n = sum(len(e["obs"]) for e in eps)
        assert n * 1024 * 4 >= gather.SPLIT_MIN_BYTES
        ring = table.shards[0].ring
        into = {name: [k for k, base in calls if base == _base(ring.columns[name])] for name in ring.columns}
        assert sum(map(len, into.values())) == len(calls)
        if (ring.write_pos - n) // 12_000 == (ring.write_pos - 1) // 12_000:
            assert sum(into["obs"]) == 300 and 1 <= len(into["obs"]) <= 2  # every part, in one call per thread
            assert into["reward"] == into["done"] == [300]  # small columns: one call
        else:  # each side of the ring's end as many parts as it holds (the one across it cut in two)
            assert sum(into["obs"]) == 301 and all(sum(into[c]) in (0, 301) for c in ("reward", "done"))
        for name in ("obs", "reward", "done"):
            got = ring.read(name, ring.write_pos - n, n)
            np.testing.assert_array_equal(got, np.concatenate([e[name] for e in eps]))


def _base(a: np.ndarray) -> int:
    """The address of the memory ``a`` is a view of (its outermost base's first byte)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return np.asarray(a).__array_interface__["data"][0]


def test_the_episodes_and_priorities_a_shard_receives():
    """``pick`` and ``item_rows`` give what one episode at a time gives, for all episodes (the list itself,
    no copy), a run and scattered ones."""
    from gear_flow.table.routing import item_rows, pick

    items = [f"e{i}" for i in range(6)]
    lengths = np.array([2, 1, 3, 1, 2, 4])
    off = np.concatenate(([0], np.cumsum(lengths)))
    pr = np.arange(off[-1], dtype=np.float64) / 10
    for sel in ([0, 1, 2, 3, 4, 5], [1, 2, 3], [0, 2, 5], [4], []):
        sel = np.array(sel, dtype=np.int64)
        assert pick(items, sel) == [items[i] for i in sel]
        want = [pr[off[i] : off[i + 1]] for i in sel]
        np.testing.assert_array_equal(item_rows(pr, off, sel), np.concatenate(want) if want else [])
        assert item_rows(None, off, sel) is None
    assert pick(items, np.arange(6)) is items
    assert pick(tuple(items), np.arange(6)) == items


def test_large_list_inserts_with_writers_and_a_sampler_running_store_every_step(make_table):
    """Two writers insert lists of many short episodes whose large column exceeds SPLIT_MIN_BYTES per shard
    (the compiled join, on each kind of table: in process, on disk, in the workers), while a sampler draws;
    every window sampled meanwhile and after is its episode's steps, byte for byte, and every step is
    counted."""
    import threading

    W = 1024  # floats a step: ~300 episodes of ~15 steps per shard are ~18 MB of obs
    spec = TableSpec(
        (ColumnSpec("obs", (W,), np.float32), ColumnSpec("ep", (), np.int64), ColumnSpec("t", (), np.int64)),
        capacity=12_000,
        num_shards=2,
    )
    t = make_table(spec, seed=0, sampler=Uniform())

    def episodes(first_tag: int, seed: int) -> list[dict]:
        rng = np.random.default_rng(seed)
        eps = []
        for tag in range(first_tag, first_tag + 600):
            n = int(rng.integers(10, 20))
            steps = np.arange(n)
            eps.append({"obs": np.repeat((tag * 64 + steps).astype(np.float32)[:, None], W, axis=1),
                        "ep": np.full(n, tag, np.int64), "t": steps.astype(np.int64)})  # fmt: skip
        return eps

    def check(b) -> None:
        obs, ep, ts, mask = b["obs"].numpy(), b["ep"].numpy(), b["t"].numpy(), b.mask.numpy()
        for r in range(len(b)):
            v = mask[r]
            assert v.any() and np.all(ep[r, v] == ep[r, v][0])
            want = (ep[r, v][:, None] * 64 + ts[r, v][:, None]).astype(np.float32)
            assert np.array_equal(obs[r, v], np.broadcast_to(want, (int(v.sum()), W)))

    batches = [episodes(1_000, 1), episodes(2_000, 2)]
    stop, errors = threading.Event(), []

    def sampler():
        try:
            while not stop.is_set():
                if t.size:
                    check(t.sample(16, 4, timeout=5))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    def writer(eps):
        try:
            t.insert(eps, timeout=60)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    th = [threading.Thread(target=sampler)] + [threading.Thread(target=writer, args=(e,)) for e in batches]
    for x in th:
        x.start()
    for x in th[1:]:
        x.join(120)
    stop.set()
    th[0].join(60)
    assert not errors, errors
    steps = sum(len(e["t"]) for eps in batches for e in eps)
    assert steps * W * 4 / 2 >= 2 * gather.SPLIT_MIN_BYTES and t.size == steps  # every step stored (no eviction)
    for _ in range(5):
        check(t.sample(64, 8))


def test_one_shards_merge_of_candidates_is_the_general_merge():
    """A single shard's candidates, best first (as ordered selectors give them) or not, one or two key
    columns with ties, fewer or more than asked: the merge's shortcut for one shard chooses and places
    what the general merge (the same shard beside an empty one) does."""
    from gear_flow.table import two_level

    rng = np.random.default_rng(0)
    shortcuts = 0
    for _ in range(2000):
        c, n, cols = int(rng.integers(0, 12)), int(rng.integers(1, 20)), int(rng.integers(1, 3))
        keys = rng.integers(0, 3, (c, cols) if cols == 2 else c).astype(np.float64)
        if rng.random() < 0.6:  # best first
            keys = keys[np.lexsort((-keys[:, 1], -keys[:, 0]))] if cols == 2 else np.sort(keys)[::-1].copy()
        slots = rng.permutation(100)[:c].astype(np.int64)
        one = two_level.merge_candidates_with_positions([(slots, keys)], n)
        empty = (np.zeros(0, np.int64), np.zeros((0, cols)) if cols == 2 else np.zeros(0))
        both = two_level.merge_candidates_with_positions([(slots, keys), empty], n)
        assert one[0][0].tolist() == both[0][0].tolist() and one[1][0].tolist() == both[1][0].tolist()
        shortcuts += two_level._best_first(keys)
    assert 1000 < shortcuts < 2000


def test_the_shards_unique_is_numpys():
    """The sort-based unique of a shard's slots (a without-replacement draw's, a delete's, an expiry's) gives
    ``np.unique``'s answer and dtype, empty, single and repeated slots included."""
    from gear_flow.shard import _unique

    rng = np.random.default_rng(8)
    for n in (0, 1, 2, 3, 17, 256, 5000):
        for hi in (1, 4, 10_000_000):
            a = rng.integers(0, hi, n)
            got, want = _unique(a), np.unique(a)
            assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_the_shards_a_call_touches_are_numpys_unique():
    """The shards a multi-shard insert, update or delete visits (local or distributed), ascending, are
    ``np.unique`` of its keys' shards, for none, one and many shards."""
    from gear_flow.keys import shards_present

    rng = np.random.default_rng(9)
    for n in (0, 1, 5, 1024):
        for k in (1, 2, 7, 64):
            s = rng.integers(0, k, n)
            assert shards_present(s).tolist() == np.unique(s).tolist()


def test_keys_split_by_shard_as_a_mask_per_shard_splits_them():
    """``shard_parts`` gives the shards present ascending and each one's indices in their order, as a mask
    and ``flatnonzero`` per shard did, for none, one and many shards (a shard past the others included)."""
    from gear_flow.keys import shard_parts

    rng = np.random.default_rng(12)
    for n in (0, 1, 5, 32, 1024):
        for k in (1, 2, 8, 127):
            s = rng.integers(0, k, n)
            got = shard_parts(s)
            assert [c for c, _ in got] == np.unique(s).tolist()
            for c, idx in got:
                assert idx.tolist() == np.flatnonzero(s == c).tolist()
    assert [(c, i.tolist()) for c, i in shard_parts(np.array([[126], [0], [126]]))] == [(0, [1]), (126, [0, 2])]


def test_the_highest_seq_of_each_shard_and_what_a_handle_has_seen_issued():
    """``highest_seqs`` is each shard's largest seq among the keys (-1 for a shard none names), and a handle's
    issued keys cover exactly the keys at or below the highest seq its samples showed of their shard, for
    none, one and many shards and keys of any shape."""
    from gear_flow.distributed.masses import IssuedKeys
    from gear_flow.keys import decode, encode, highest_seqs

    rng = np.random.default_rng(11)
    for n in (0, 1, 7, 1024):
        for k in (1, 3, 40):
            keys = (
                encode(rng.integers(0, k, n), rng.integers(0, 10**9, n)).reshape(-1, 1)
                if n
                else np.zeros((0, 1), np.int64)
            )
            shard, seq = decode(keys.ravel())
            want = [
                int(seq[shard == s].max()) if (shard == s).any() else -1
                for s in range(int(shard.max()) + 1 if n else 0)
            ]
            assert highest_seqs(keys).tolist() == want
            seen = IssuedKeys()
            seen.note(keys)
            assert seen.hi == {s: m for s, m in enumerate(want) if m >= 0}
            assert seen.covers(keys)
            for s, m in seen.hi.items():
                assert seen.covers(encode(s, [0, m]))
                assert not seen.covers(encode(s, [m + 1]))
            assert not seen.covers(encode(k + 1, [0])) and seen.covers(np.zeros(0, np.int64))


def test_a_shards_sample_counts_and_records_are_numpys():
    """The counts a sample reports (each occurrence of a repeated item one more) and records (``np.add.at``),
    and the unique draws with their inverse, as NumPy's formulas give them, for none, one and many
    repeats."""
    from gear_flow.shard import _count_sampled, _counts_after, _unique_inverse

    rng = np.random.default_rng(10)
    for n in (0, 1, 2, 9, 300):
        for hi in (1, 3, 50, 10_000):
            slots = rng.integers(0, hi, n)
            times = rng.integers(0, 5, hi).astype(np.int32)
            order = np.argsort(slots, kind="stable")
            ranked = slots[order]
            starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]]) if n else np.zeros(0, np.int64)
            occurrence = np.empty(n, dtype=np.int64)
            occurrence[order] = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
            got = np.empty(n, dtype=np.int64)
            _counts_after(slots, times, got)
            assert got.tolist() == (times[slots].astype(np.int64) + occurrence + 1).tolist()
            want = times.copy()
            np.add.at(want, slots, 1)
            _count_sampled(times, slots)
            assert times.tolist() == want.tolist()
            u, inv = _unique_inverse(slots)
            wu, winv = np.unique(slots, return_inverse=True)
            assert u.tolist() == wu.tolist() and inv.tolist() == winv.tolist() and inv.dtype == np.int64


def test_a_listed_valid_mass_is_kept_until_a_slot_changes():
    """``TailMass.valid_listed`` sums the fitting items once and keeps the sum until a slot's weight changes,
    the cache is cleared, or the entry is computed again or dropped: a shard asks it on every plan while its
    cached remainder is within drift of zero, and each sum is O(capacity)."""
    from gear_flow.tails import TailMass

    calls = []

    def listed(value):
        def compute():
            calls.append(value)
            return value

        return compute

    tm = TailMass(lambda L: 1.0, lambda slots: np.zeros(len(slots), np.int64), max_entries=1, refresh_every=10)
    tm.get(2)
    assert tm.valid_listed(2, listed(4e-6)) == 4e-6 and tm.valid_listed(2, listed(9.0)) == 4e-6
    tm.change(np.array([3]), np.array([1.0]), np.array([2.0]))  # a weight changed: summed again
    assert tm.valid_listed(2, listed(5e-6)) == 5e-6
    tm.change(np.zeros(0, np.int64), np.zeros(0), np.zeros(0))  # no slot: kept
    assert tm.valid_listed(2, listed(9.0)) == 5e-6
    tm.clear()
    tm.get(2)
    assert tm.valid_listed(2, listed(6e-6)) == 6e-6
    tm.get(3)  # the one entry of 2 dropped for 3: its sum with it
    tm.get(2)
    assert tm.valid_listed(2, listed(7e-6)) == 7e-6
    for _ in range(10):  # the entry's changes reach refresh_every: computed again, summed again
        tm.change(np.array([1]), np.array([1.0]), np.array([1.0]))
    tm.valid_listed(2, listed(0.5))
    tm.get(2)
    assert tm.valid_listed(2, listed(8e-6)) == 8e-6
    assert calls == [4e-6, 5e-6, 6e-6, 7e-6, 0.5, 8e-6]


def _through_the_plan(shards, B, L, boundary, columns, rng, beta, out):
    """A weighted sample run through the planner and the executor, as before a one-shard table drew straight."""
    from gear_flow.table import executor, two_level

    ex = executor.InProcess(shards, rng, out, L, boundary, columns)
    planner.run(planner.sample("weighted", B, rng), ex)
    two_level.importance_weights(out.probabilities, beta, out.weights)
    return ex.expired


@pytest.mark.parametrize("sampler", ["uniform", "prioritized", "zero"])
@pytest.mark.parametrize("boundary", ["pad_tail", "strict"])
@pytest.mark.parametrize("L", [1, 3])
@pytest.mark.parametrize("limit", [0, 2])
def test_a_one_shard_sample_drawn_straight_is_the_plans(sampler, boundary, L, limit):
    """A one-shard table's weighted sample skips the plan and its executor (the planner's one-shard draw: every
    row the shard's, all of its mass); batch after batch it is the plan's sample, row for row, with the same
    expiries (``max_times_sampled``), the same generator draws and the same shard left behind; every priority 0
    (no mass) goes the plan's way."""
    from gear_flow.table import executor

    eps = _episodes(12, 5)
    n = sum(len(e["done"]) for e in eps)
    priorities = {"uniform": None, "zero": np.zeros(n), "prioritized": np.random.default_rng(1).random(n) + 0.1}
    tables = []
    for _ in range(2):
        sel = Uniform() if sampler == "uniform" else Prioritized(0.7, 0.5)
        t = LocalTable(_spec(), sampler=sel, max_times_sampled=limit, seed=3)
        t.insert(eps, priorities=priorities[sampler])
        tables.append(t)
    a, b = tables
    ra, rb = np.random.default_rng(8), np.random.default_rng(8)
    columns = a.spec.names
    beta = a.cfg.beta
    for _ in range(5):
        oa, ob = (SampleBuffers(t.spec, columns, 16, L) for t in tables)
        got = executor.sample_shards(a._by_id, "weighted", oa, 16, L, boundary, columns, ra, beta, "a")
        want = _through_the_plan(b._by_id, 16, L, boundary, columns, rb, beta, ob)
        assert got == want
        for name in (*ROWS, "weights"):
            np.testing.assert_array_equal(getattr(oa, name), getattr(ob, name), err_msg=name)
        for name in columns:
            np.testing.assert_array_equal(oa.arrays[name], ob.arrays[name], err_msg=name)
        sa, sb = a.shards[0], b.shards[0]
        assert (sa.size, sa.counters.sampled, sa.counters.expired) == (
            sb.size,
            sb.counters.sampled,
            sb.counters.expired,
        )
        if limit:
            np.testing.assert_array_equal(sa.times_sampled, sb.times_sampled)
    assert ra.random() == rb.random()
    if limit:
        assert a.shards[0].counters.expired > 0  # the batches expired items: the counts compared above moved


@pytest.mark.parametrize("unit", ["step", "episode"])
def test_an_update_of_a_shard_without_holes_applies_what_reading_each_items_flag_applies(unit):
    """A shard holding ``hi - lo`` items has every seq of its live range live, so its update reads no item's
    ``active`` flag: through inserts that wrap the ring, deletes, expiries (``max_times_sampled``) and evictions
    (``max_size``), whenever a shard is dense every item of its range is active, and an update of live, stale
    and repeated seqs writes and returns what the pass reading each flag does (both states are reached)."""
    from gear_flow.shard import _NO_STAMPS, _apply_updates

    seen = {True: 0, False: 0}
    for seed in range(6):
        rng = np.random.default_rng(seed)
        spec = TableSpec(_spec(capacity=150).columns, capacity=150, item_unit=unit, max_size=140 if seed % 2 else None)
        t = LocalTable(spec, sampler=Prioritized(0.6, 0.4), max_times_sampled=3 if seed % 3 == 0 else 0, seed=seed)
        for step in range(40):
            what = rng.integers(0, 4)
            try:
                keys = t.sample(8, timeout=0).keys.numpy() if what >= 2 else None
            except RateLimitTimeout:  # (every item left expired: the next insert)
                keys, what = None, 0
            if what <= 1:
                t.insert(_episodes(int(rng.integers(1, 4)), seed * 100 + step, lo=2, hi=12))
            elif what == 2:
                t.delete(keys[: int(rng.integers(0, 3))])
            sh = t.shards[0]
            lo, hi = sh.live_seq_range()
            dense = sh.size == hi - lo
            seen[dense] += 1
            if dense:
                assert np.all(sh.active[np.arange(lo, hi) % sh.capacity] == 1)
            seqs = rng.integers(max(0, lo - 30), hi, 40)
            pr = rng.random(40)
            got, want = [], []
            for d, into in ((dense, got), (False, want)):
                touched, priority = sh.touched.copy(), sh.priority.copy()
                res = _apply_updates(seqs, pr, _NO_STAMPS, 5, sh._clock, lo, hi, sh.capacity, sh.active, touched,
                                     priority, d)  # fmt: skip
                into.extend([*(np.asarray(x).tolist() for x in res), touched.tolist(), priority.tolist()])
            assert got == want
    assert seen[True] and seen[False]
