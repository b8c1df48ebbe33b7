"""Numeric cores (gear_flow.ops) against plain NumPy references.

These functions are also the parity references of the CUDA kernels, so their
semantics (duplicates, ties, empties, ring wrap) are pinned here.
"""

from __future__ import annotations

import numpy as np
import pytest

from gear_flow.ops import gather, maxtree, sequences, sumtree

SIZES = [1, 2, 3, 5, 7, 8, 13, 64, 100, 257, 1000]


# ---------------------------------------------------------------------------- sum tree


def _tree_from(weights: np.ndarray) -> np.ndarray:
    tree = sumtree.new_tree(len(weights))
    sumtree.set_leaves(tree, np.arange(len(weights), dtype=np.int64), weights.astype(np.float64))
    return tree


def _find_ref(weights: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Leaf i with cum[i-1] <= u < cum[i]: zero-weight leaves are never chosen."""
    return np.searchsorted(np.cumsum(weights), targets, side="right")


@pytest.mark.parametrize("n", SIZES)
def test_leaf_count_and_layout(n):
    P = sumtree.leaf_count(n)
    assert P >= n and P & (P - 1) == 0 and (P == 1 or P // 2 < n)
    tree = sumtree.new_tree(n)
    assert tree.shape == (2 * P,) and not tree.any()


@pytest.mark.parametrize("n", SIZES)
def test_set_leaves_parents_are_sums(n):
    rng = np.random.default_rng(n)
    w = rng.random(n)
    tree = _tree_from(w)
    P = len(tree) // 2
    assert np.array_equal(tree[P : P + n], w)
    for i in range(1, P):
        assert tree[i] == tree[2 * i] + tree[2 * i + 1]
    assert tree[1] == pytest.approx(w.sum(), rel=1e-12)


@pytest.mark.parametrize("n", SIZES)
def test_find_matches_cumsum_exact(n):
    """Integer weights make every partial sum exact, so the reference is exact too."""
    rng = np.random.default_rng(100 + n)
    w = rng.integers(0, 5, n).astype(np.float64)
    if w.sum() == 0:
        w[n // 2] = 3.0
    tree = _tree_from(w)
    targets = np.concatenate([rng.random(2000) * w.sum(), np.cumsum(w)[w > 0][:-1], [0.0]])
    out = np.empty(len(targets), dtype=np.int64)
    sumtree.find(tree, targets, out)
    assert np.array_equal(out, _find_ref(w, targets))
    assert np.all(w[out] > 0)


@pytest.mark.parametrize("n", SIZES)
def test_find_matches_cumsum_float(n):
    """Real-valued weights: targets at interval midpoints (away from rounding at the edges)."""
    rng = np.random.default_rng(200 + n)
    w = rng.random(n) * (rng.random(n) < 0.7)
    if w.sum() == 0:
        w[0] = 0.5
    tree = _tree_from(w)
    c = np.cumsum(w)
    lo = np.concatenate(([0.0], c[:-1]))
    pos = np.flatnonzero(w > 0)
    targets = (lo[pos] + c[pos]) / 2
    out = np.empty(len(targets), dtype=np.int64)
    sumtree.find(tree, targets, out)
    assert np.array_equal(out, pos)


def test_find_never_returns_zero_weight_at_right_edge():
    """Rounding can put a target at (or just below) the root; the descent must still land on mass."""
    w = np.zeros(37)
    w[[3, 20, 21]] = [0.1, 0.2, 0.3]
    tree = _tree_from(w)
    root = tree[1]
    targets = np.array([0.0, np.nextafter(root, 0), root * (1 - 1e-16), root, root * (1 + 1e-15)])
    out = np.empty(len(targets), dtype=np.int64)
    sumtree.find(tree, targets, out)
    assert set(out.tolist()) <= {3, 20, 21}
    assert out[0] == 3 and out[1] == 21


def _descend(tree: np.ndarray, u: float) -> int:
    """One target's descent with the branch, as the rule reads (and as the CUDA twin takes it)."""
    P, i = len(tree) // 2, 1
    while i < P:
        left = tree[2 * i]
        if (u < left and left > 0.0) or tree[2 * i + 1] <= 0.0:
            i = 2 * i
        else:
            u -= left
            i = 2 * i + 1
    return i - P


@pytest.mark.parametrize("n", [1, 2, 5, 64, 1000, 4097])
def test_find_takes_the_leaves_of_the_rule_with_its_branch(n):
    """The compiled descent takes no branch; target by target it lands where the branching rule does, for
    float weights with zero runs and targets on interval edges, at the root and past it (rounding)."""
    rng = np.random.default_rng(300 + n)
    w = rng.random(n) * (rng.random(n) < 0.6)
    w[rng.integers(0, n, n // 8)] = 0.0
    if w.sum() == 0:
        w[-1] = 0.25
    tree = _tree_from(w)
    root = tree[1]
    edges = np.cumsum(w)[:-1]
    targets = np.concatenate(
        [rng.random(3000) * root, edges, np.nextafter(edges, 0), [0.0, root, np.nextafter(root, 0)]]
    )
    out = np.empty(len(targets), dtype=np.int64)
    sumtree.find(tree, targets, out)
    assert out.tolist() == [_descend(tree, float(u)) for u in targets]
    assert np.all(w[out] > 0)


@pytest.mark.parametrize("n", [1, 5, 1000, 4097])
def test_draw_probs_is_find_of_uniforms_times_mass_and_each_weight_over_denom(n):
    """The fused draw lands where find of ``uniforms * mass`` does, in order, and reports each drawn leaf's
    weight over ``denom``, bit for bit as numpy divides them; zero-weight runs are never drawn."""
    rng = np.random.default_rng(700 + n)
    w = rng.random(n) * (rng.random(n) < 0.6)
    w[-1] = 0.25 if w.sum() == 0 else w[-1]
    tree = _tree_from(w)
    u = np.r_[rng.random(2000), 0.0, np.nextafter(1.0, 0)]
    want = np.empty(len(u), dtype=np.int64)
    sumtree.find(tree, u * tree[1], want)
    out, probs = np.empty(len(u), dtype=np.int64), np.empty(len(u))
    sumtree.draw_probs(tree, u, tree[1], 0.7 * tree[1], out, probs)
    assert out.tolist() == want.tolist()
    assert probs.tolist() == (w[want] / (0.7 * tree[1])).tolist()
    assert np.all(w[out] > 0)


def test_find_distribution_is_proportional():
    rng = np.random.default_rng(7)
    w = np.array([0.0, 1.0, 0.0, 3.0, 6.0, 0.0, 0.0])
    tree = _tree_from(w)
    u = rng.random(60_000) * tree[1]
    out = np.empty(len(u), dtype=np.int64)
    sumtree.find(tree, u, out)
    freq = np.bincount(out, minlength=len(w)) / len(u)
    assert np.all(freq[w == 0] == 0)
    assert np.allclose(freq, w / w.sum(), atol=0.01)


def test_set_leaves_duplicates_last_wins():
    tree = sumtree.new_tree(10)
    idx = np.array([2, 5, 2, 2, 5], dtype=np.int64)
    sumtree.set_leaves(tree, idx, np.array([1.0, 2.0, 3.0, 4.0, 7.0]))
    P = len(tree) // 2
    expect = np.zeros(10)
    expect[2], expect[5] = 4.0, 7.0
    assert np.array_equal(tree[P : P + 10], expect)
    assert tree[1] == 11.0


def test_set_leaves_const_and_overwrite():
    tree = _tree_from(np.arange(1.0, 9.0))
    sumtree.set_leaves_const(tree, np.array([0, 7, 7], dtype=np.int64), 0.0)
    P = len(tree) // 2
    assert tree[P] == 0 and tree[P + 7] == 0
    assert tree[1] == sum(range(2, 8))
    sumtree.set_leaves_const(tree, np.arange(8, dtype=np.int64), 1.0)
    assert tree[1] == 8.0


@pytest.mark.parametrize("order", ["ring", "sorted", "random"])
def test_set_leaves_matches_a_tree_rebuilt_from_its_leaves(order):
    """Parents repaired level by level, the ancestors shared by sorted neighbours visited once: the same tree
    as one summed from scratch, for an insert's slots (a ring range that wraps), sorted and random ones."""
    rng = np.random.default_rng(len(order))
    for n in (1, 2, 7, 1000, 60_000):
        tree = sumtree.new_tree(n)
        P = len(tree) // 2
        for _ in range(4):
            k = int(rng.integers(1, n + 1))
            if order == "ring":
                idx = (int(rng.integers(0, n)) + np.arange(k, dtype=np.int64)) % n
            else:
                idx = rng.integers(0, n, k).astype(np.int64)
                idx = np.sort(idx) if order == "sorted" else idx
            if rng.random() < 0.5:
                sumtree.set_leaves(tree, idx, rng.random(k))
            else:
                sumtree.set_leaves_const(tree, idx, float(rng.integers(0, 3)))
            ref = np.zeros_like(tree)
            ref[P:] = tree[P:]
            for i in range(P - 1, 0, -1):
                ref[i] = ref[2 * i] + ref[2 * i + 1]
            assert np.array_equal(tree[1:], ref[1:]), (order, n, k)


@pytest.mark.parametrize(
    "first, n, cap", [(0, 0, 5), (8, 4, 10), (3, 10, 10), (123_456, 9_999, 10_000), (10, 3, 10), (7, 3, 10)]
)
def test_ring_slots_are_the_positions_modulo_the_capacity(first, n, cap):
    from gear_flow.shard import ring_slots

    got = ring_slots(first, n, cap)
    assert got.dtype == np.int64 and got.tolist() == ((first + np.arange(n)) % cap).tolist()


@pytest.mark.parametrize("n", SIZES)
def test_range_sum(n):
    rng = np.random.default_rng(300 + n)
    w = rng.integers(0, 9, n).astype(np.float64)
    tree = _tree_from(w)
    for _ in range(50):
        lo, hi = sorted(rng.integers(0, n + 1, 2))
        assert sumtree.range_sum(tree, lo, hi) == w[lo:hi].sum()
    assert sumtree.range_sum(tree, 0, n) == w.sum()
    assert sumtree.range_sum(tree, 3, 3) == 0.0


def _tail_ref(w, capacity, starts, lengths, k):
    total = 0.0
    for s, n in zip(starts, lengths):
        m = min(k, n)
        for j in range(n - m, n):
            total += w[(s + j) % capacity]
    return total


@pytest.mark.parametrize("capacity", [1, 5, 8, 13, 64, 100])
def test_ring_tail_mass(capacity):
    rng = np.random.default_rng(capacity)
    w = rng.integers(0, 7, capacity).astype(np.float64)
    tree = _tree_from(w)
    for _ in range(30):
        # back-to-back segments starting anywhere in the ring, so some wrap
        lengths = rng.integers(1, max(2, capacity // 2), rng.integers(1, 5))
        lengths = lengths[np.cumsum(lengths) <= capacity] if capacity > 1 else np.array([1])
        if not len(lengths):
            lengths = np.array([1])
        start0 = int(rng.integers(0, capacity))
        starts = (start0 + np.concatenate(([0], np.cumsum(lengths)[:-1]))) % capacity
        for k in (0, 1, 2, 5, capacity):
            got = sumtree.ring_tail_mass(tree, capacity, starts.astype(np.int64), lengths.astype(np.int64), k)
            assert got == _tail_ref(w, capacity, starts, lengths, k)


def test_ring_tail_mass_wraps():
    capacity = 10
    w = np.arange(1.0, 11.0)  # leaf i weighs i + 1
    tree = _tree_from(w)
    # one episode of 6 steps starting at slot 7: slots 7, 8, 9, 0, 1, 2
    got = sumtree.ring_tail_mass(tree, capacity, np.array([7]), np.array([6]), 4)
    assert got == w[9] + w[0] + w[1] + w[2]
    got = sumtree.ring_tail_mass(tree, capacity, np.array([7]), np.array([6]), 5)
    assert got == w[8] + w[9] + w[0] + w[1] + w[2]


# ---------------------------------------------------------------------------- max tree / top-k


def _topk_ref(values: np.ndarray, k: int):
    idx = np.flatnonzero(np.isfinite(values))
    order = np.lexsort((idx, -values[idx]))  # descending value, ties: lower index first
    sel = idx[order][:k]
    return sel, values[sel]


def _maxtree_from(values: np.ndarray) -> np.ndarray:
    tree = maxtree.new_tree(len(values))
    maxtree.set_leaves(tree, np.arange(len(values), dtype=np.int64), values.astype(np.float64))
    return tree


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", [1, 2, 7, 50, 2000])
def test_topk_matches_argsort(n, k):
    rng = np.random.default_rng(n * 31 + k)
    v = rng.integers(-3, 4, n).astype(np.float64)  # few distinct values: many ties
    v[rng.random(n) < 0.2] = -np.inf  # empty slots
    tree = _maxtree_from(v)
    out_i = np.empty(k, dtype=np.int64)
    out_v = np.empty(k, dtype=np.float64)
    found = maxtree.topk(tree, k, out_i, out_v)
    ref_i, ref_v = _topk_ref(v, k)
    assert found == len(ref_i) == min(k, int(np.isfinite(v).sum()))
    assert np.array_equal(out_i[:found], ref_i)
    assert np.array_equal(out_v[:found], ref_v)


@pytest.mark.parametrize("kind", ["real", "ties", "sparse"])
@pytest.mark.parametrize("k", [100, 1000, 5000])
def test_topk_of_a_large_tree_matches_argsort(kind, k):
    """Frontiers cut to ``k`` at every level below the top (each cut a selection over up to ``2k`` nodes):
    real values, a few tied values, and mostly empty leaves."""
    rng = np.random.default_rng(k + len(kind))
    n = 100_000
    v = {"real": rng.random(n), "ties": rng.integers(0, 5, n).astype(np.float64),
         "sparse": np.where(rng.random(n) < 0.97, -np.inf, rng.random(n))}[kind]  # fmt: skip
    tree = _maxtree_from(v)
    out_i = np.empty(k, dtype=np.int64)
    out_v = np.empty(k, dtype=np.float64)
    found = maxtree.topk(tree, k, out_i, out_v)
    ref_i, ref_v = _topk_ref(v, k)
    assert found == len(ref_i)
    assert out_i[:found].tolist() == ref_i.tolist()
    assert out_v[:found].tolist() == ref_v.tolist()


@pytest.mark.parametrize("n", [64, 1000, 4096, 100_000])
def test_topk_all_equal(n):
    """Every priority equal (the default max-priority insert): ties by index, nothing lost."""
    tree = _maxtree_from(np.ones(n))
    for k in (1, 3, 100):
        out_i = np.empty(k, dtype=np.int64)
        out_v = np.empty(k, dtype=np.float64)
        found = maxtree.topk(tree, k, out_i, out_v)
        assert found == min(k, n)
        assert np.array_equal(out_i[:found], np.arange(found))
        assert np.all(out_v[:found] == 1.0)


def test_topk_empty_and_k_zero():
    tree = maxtree.new_tree(17)
    out_i = np.empty(3, dtype=np.int64)
    out_v = np.empty(3)
    assert maxtree.topk(tree, 3, out_i, out_v) == 0
    tree = _maxtree_from(np.arange(5.0))
    assert maxtree.topk(tree, 0, out_i, out_v) == 0


def test_topk_negative_values_and_removal():
    v = np.array([-1.0, -5.0, -0.5, -np.inf, -2.0])
    tree = _maxtree_from(v)
    out_i = np.empty(10, dtype=np.int64)
    out_v = np.empty(10)
    assert maxtree.topk(tree, 10, out_i, out_v) == 4
    assert out_i[:4].tolist() == [2, 0, 4, 1]
    maxtree.set_leaves(tree, np.array([2, 0]), np.array([-np.inf, -np.inf]))
    assert maxtree.topk(tree, 10, out_i, out_v) == 2
    assert out_i[:2].tolist() == [4, 1]
    assert tree[1] == -2.0


def test_maxtree_set_leaves_duplicates_last_wins():
    tree = maxtree.new_tree(6)
    maxtree.set_leaves(tree, np.array([1, 1, 4, 1]), np.array([9.0, 3.0, 2.0, 1.0]))
    P = len(tree) // 2
    assert tree[P + 1] == 1.0 and tree[P + 4] == 2.0
    assert tree[1] == 2.0


# ---------------------------------------------------------------------------- window gather


def _gather_ref(src, src_start, dst_offset, n_valid, L):
    cap = src.shape[0]
    out = np.zeros((len(src_start), L, *src.shape[1:]), dtype=src.dtype)
    for b in range(len(src_start)):
        for j in range(n_valid[b]):
            out[b, dst_offset[b] + j] = src[(src_start[b] + j) % cap]
    return out


def _as_bytes(a):
    return a.reshape(a.shape[0], -1).view(np.uint8)


@pytest.mark.parametrize(
    "dtype, shape",
    [
        (np.float32, (3,)),
        (np.int64, ()),
        (np.bool_, ()),
        (np.uint8, (4, 5)),
        (np.float64, (2, 2)),
        (np.int16, (7,)),
        (np.complex64, ()),
    ],
)
@pytest.mark.parametrize("capacity", [1, 7, 16])
def test_gather_windows_matches_reference(dtype, shape, capacity):
    rng = np.random.default_rng(capacity)
    src = (rng.random((capacity, *shape)) * 100).astype(dtype)
    if dtype is np.bool_:
        src = rng.random((capacity, *shape)) < 0.5
    L = min(5, capacity + 2)
    B = 40
    starts, offs, nvs = [], [], []
    for _ in range(B):
        n = int(rng.integers(0, min(L, capacity) + 1))
        d = int(rng.integers(0, L - n + 1))
        starts.append(int(rng.integers(0, capacity)))
        offs.append(d)
        nvs.append(n)
    # deterministic edge cases: wrap at the ring's end, head pad, tail pad, empty, duplicate windows
    starts += [capacity - 1, capacity - 1, 0, 0, 0]
    offs += [0, L - min(L, capacity), 0, L - 1, 0]
    nvs += [min(L, capacity), min(L, capacity), 0, 1, min(L, capacity)]
    src_start, dst_offset, n_valid = (np.array(a, dtype=np.int64) for a in (starts, offs, nvs))
    out = np.full((len(starts), L, *shape), 1, dtype=dtype)  # garbage to be overwritten / zeroed
    gather.gather_windows(
        _as_bytes(src), src_start, dst_offset, n_valid, out.reshape(len(starts), L, -1).view(np.uint8)
    )
    assert np.array_equal(out, _gather_ref(src, src_start, dst_offset, n_valid, L))


@pytest.mark.parametrize("L", [1, 2, 3])
def test_gather_columns_of_whole_windows_copies_every_row_size(L):
    """Columns whose windows are all whole and at most 16 bytes are copied as fixed-size blocks; every size
    from 1 to 20 bytes, beside a batch with one padded window (each column then copied window by window),
    gives numpy's rows, in order."""
    rng = np.random.default_rng(L)
    cap, B = 50, 33
    srcs = [rng.integers(0, 256, (cap, nb), dtype=np.uint8) for nb in range(1, 21)]
    starts = rng.integers(0, cap - L + 1, B)
    whole = (starts, np.zeros(B, np.int64), np.full(B, L, np.int64))
    padded = (starts, np.r_[1, np.zeros(B - 1, np.int64)], np.r_[L - 1, np.full(B - 1, L, np.int64)])
    for src_start, dst_offset, n_valid in (whole, padded):
        outs = [np.full((B, L, s.shape[1]), 7, dtype=np.uint8) for s in srcs]
        gather.gather_columns(srcs, src_start, dst_offset, n_valid, outs)
        for s, out in zip(srcs, outs):
            assert np.array_equal(out, _gather_ref(s, src_start, dst_offset, n_valid, L))


def test_mod_near_is_the_remainder_near_its_base_and_far_from_it():
    from gear_flow.storage.windows import mod_near

    rng = np.random.default_rng(3)
    for m in (1, 7, 1000, 10_000_000):
        for ref in (0, 5, m - 1, 3 * m + 2, 10**15 + 11):
            base = ref - ref % m
            xs = np.r_[ref + rng.integers(-m + 1, m, 50), ref - 5 * m - 3, ref + 9 * m + 1, -1, -m - 2]
            assert [mod_near(int(x), m, base) for x in xs] == [int(x) % m for x in xs]


def test_gather_window_across_ring_end():
    src = np.arange(10, dtype=np.int64)
    out = np.full((1, 6), -1, dtype=np.int64)
    gather.gather_windows(
        _as_bytes(src), np.array([7]), np.array([1]), np.array([5]), out.reshape(1, 6, -1).view(np.uint8)
    )
    assert out.tolist() == [[0, 7, 8, 9, 0, 1]]


@pytest.mark.parametrize("masses", [[3.0], [0.2, 0.8], [1.0, 0.0, 2.0]])
def test_multinomial_counts_is_numpys_and_leaves_the_stream_where_numpy_would(masses):
    """One shard takes the whole batch without calling numpy, which draws nothing for one category either."""
    from gear_flow.table import two_level

    m = np.asarray(masses)
    ours, ref = np.random.default_rng(9), np.random.default_rng(9)
    for n in (1, 7, 256):
        assert two_level.multinomial_counts(m, n, ours).tolist() == ref.multinomial(n, m / m.sum()).tolist()
    assert ours.random(4).tolist() == ref.random(4).tolist()


def test_window_mask():
    m = gather.window_mask(np.array([0, 2, 0, 3]), np.array([4, 2, 0, 1]), 4)
    assert m.tolist() == [
        [True, True, True, True],
        [False, False, True, True],
        [False, False, False, False],
        [False, False, False, True],
    ]
    out = np.empty((4, 4), dtype=bool)
    assert gather.window_mask(np.array([0, 2, 0, 3]), np.array([4, 2, 0, 1]), 4, out=out) is out
    assert np.array_equal(out, m)


@pytest.mark.parametrize("pos, n", [(0, 3), (5, 5), (8, 4), (9, 10), (3, 0)])
def test_scatter_rows_wraps(pos, n):
    cap = 10
    dst = np.full((cap, 2), -1.0)
    src = np.arange(2 * n, dtype=np.float64).reshape(n, 2)
    gather.scatter_rows(dst, pos, src)
    expect = np.full((cap, 2), -1.0)
    for j in range(n):
        expect[(pos + j) % cap] = src[j]
    assert np.array_equal(dst, expect)


@pytest.mark.parametrize(
    "cap, lengths, pos, row",
    [
        (10, [3, 4], 8, 2),  # small: copied part by part
        (10, [3, 4, 2], 1, 2),  # small, no wrap: every part in one call
        (9, [3, 4, 2], 0, 1),  # ... filling the ring exactly
        (3000, [1000, 1000, 500], 2200, 256),  # 10 MB of float32 rows: one parallel region, a part wraps
        (5000, [4999], 1, 300),  # one part ending just before its own start
        (4000, [1000, 1, 1999, 1000], 0, 256),  # filling the ring exactly, a one-row part among large ones
        (4000, [700, 900], 3700, 256),  # the first part wraps, the second starts at the ring's head
        (1000, [37] * 25, 600, 64),  # many short episodes: one concatenate per side, a part cut at the end
        (100, [20, 30, 50], 50, 3),  # the ring's end falls between two parts
    ],
)
@pytest.mark.parametrize("checked", [False, True])
def test_scatter_chunks_writes_what_part_by_part_writes_would(cap, lengths, pos, row, checked):
    rng = np.random.default_rng(cap)
    parts = [rng.standard_normal((n, row)).astype(np.float32) for n in lengths]
    dst = np.full((cap, row), -1.0, dtype=np.float32)
    gather.scatter_chunks(dst, pos, parts, checked=checked)
    expect = np.full((cap, row), -1.0, dtype=np.float32)
    at = pos
    for rows in parts:
        for j in range(len(rows)):
            expect[(at + j) % cap] = rows[j]
        at = (at + len(rows)) % cap
    assert np.array_equal(dst, expect)


def test_scatter_chunks_copies_parts_that_are_not_contiguous():
    src = np.arange(2000 * 512, dtype=np.float32).reshape(2000, 512)
    parts = [src[:, ::2], src[:500, 1::2]]  # strided views: no byte copy, rows one by one
    dst = np.zeros((3000, 256), dtype=np.float32)
    gather.scatter_chunks(dst, 100, parts)
    assert np.array_equal(dst[100:2100], parts[0]) and np.array_equal(dst[2100:2600], parts[1])


@pytest.mark.parametrize(
    "parts, words",
    [
        ([np.ones((600, 256), np.float32), np.ones((2, 256), np.float64)], "float32"),  # a bad part after a good one
        ([np.ones((600, 256), np.float32), np.ones((600, 128), np.float32)], "float32"),
        ([np.ones((600, 256), np.float32)] * 2, "do not fit"),  # together more rows than the ring holds
    ],
)
def test_scatter_chunks_checks_every_part_before_writing(parts, words):
    dst = np.full((1000, 256), -1.0, dtype=np.float32)
    with pytest.raises(IndexError, match=words):
        gather.scatter_chunks(dst, 10, parts)
    assert np.all(dst == -1.0)  # nothing written, not even the good part


@pytest.mark.parametrize(
    "start, offset, n",
    [(10, 0, 1), (-1, 0, 1), (0, -1, 1), (0, 0, -1), (0, 3, 2), (0, 0, 5), (0, 0, 11)],
)
def test_gather_windows_rejects_out_of_bounds_windows(start, offset, n):
    """The byte copies are unchecked, so every window is validated before anything is written."""
    src = np.arange(10, dtype=np.int64)
    out = np.full((2, 4), -7, dtype=np.int64)
    with pytest.raises(IndexError, match="window 1"):
        gather.gather_windows(
            _as_bytes(src),
            np.array([0, start]),
            np.array([0, offset]),
            np.array([2, n]),
            out.reshape(2, 4, -1).view(np.uint8),
        )
    assert np.all(out == -7)


def test_interleave_picks_each_row_by_the_masses_left_then():
    """Shard 0 has mass 3 then 1 left, shard 1 mass 1 then 0: row 0 (u=0.7 of 4) goes to shard 0 (share 3/4),
    row 1 (u=0.9 of 2) to shard 1 (1/2), row 2 to shard 0 (1/1); then no mass is left."""
    masses = np.array([[3.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    shard_of, draw_of, share = np.empty(4, np.int64), np.empty(4, np.int64), np.empty(4)
    got = sequences.interleave(masses, np.array([2, 1]), np.array([0.7, 0.9, 0.1, 0.5]), shard_of, draw_of, share)
    assert got == 3
    assert shard_of[:3].tolist() == [0, 1, 0] and draw_of[:3].tolist() == [0, 0, 1]
    np.testing.assert_allclose(share[:3], [0.75, 0.5, 1.0])


def test_accept_rejects_the_draws_of_an_item_that_is_out():
    """Limit 1: item 0 goes once (its second draw rejected, its weight 2 leaves the mass 5), then item 1."""
    slots, probs, masses = np.empty(2, np.int64), np.empty(2), np.zeros(3)
    masses[0] = 5.0
    got, gone = sequences.accept(
        np.array([0, 0, 1]), np.array([2.0, 2.0, 3.0]), np.zeros(2, np.int64), 1, 5.0, 0.0, 2, slots, probs, masses, 0
    )
    assert (got, gone) == (2, 5.0)
    assert slots.tolist() == [0, 1]
    np.testing.assert_allclose(probs, [2 / 5, 3 / 3])
    np.testing.assert_allclose(masses, [5.0, 3.0, 0.0])


@pytest.mark.parametrize("n", [1, 2, 3, 64, 1000, 4097])
@pytest.mark.parametrize("k", [1, 7, 300, 5000])
def test_set_leaves_of_many_leaves_equals_one_at_a_time(n, k):
    """A set of many unsorted leaves (repeats too) recomputes the tree's upper levels whole where they hold
    no more nodes than its list: node for node, the tree one leaf's set at a time builds, and each node the
    sum of its children."""
    rng = np.random.default_rng(n * 31 + k)
    w = rng.random(n) * (rng.random(n) < 0.8)
    many, single = _tree_from(w), _tree_from(w)
    idx = rng.integers(0, n, k)
    vals = rng.random(k) * (rng.random(k) < 0.9)
    sumtree.set_leaves(many, idx, vals)
    for i, v in zip(idx.tolist(), vals.tolist()):
        sumtree.set_leaves(single, np.array([i], dtype=np.int64), np.array([v]))
    assert many.tolist() == single.tolist()
    P = len(many) // 2
    assert all(many[i] == many[2 * i] + many[2 * i + 1] for i in range(1, P))


@pytest.mark.parametrize("n", [1, 2, 3, 64, 1000, 4097])
@pytest.mark.parametrize("k", [1, 7, 300, 5000])
def test_max_tree_set_of_many_leaves_equals_the_tree_built_from_its_leaves(n, k):
    """The max tree's parents are repaired level by level for all the leaves at once (upper levels whole):
    node for node the tree built bottom-up from the final leaves (repeats: the last value wins), -inf
    leaves kept."""
    rng = np.random.default_rng(n * 17 + k)
    tree = maxtree.new_tree(n)
    start = np.arange(n, dtype=np.int64)[rng.random(n) < 0.7]
    maxtree.set_leaves(tree, start, rng.random(len(start)))
    idx = rng.integers(0, n, k)
    vals = np.where(rng.random(k) < 0.1, -np.inf, rng.random(k))
    maxtree.set_leaves(tree, idx, vals)
    P = len(tree) // 2
    built = np.full(2 * P, -np.inf)
    built[P:] = tree[P:]
    leaves = np.full(P, -np.inf)
    leaves[start] = tree[P + start]
    for i, v in zip(idx.tolist(), vals.tolist()):
        leaves[i] = v
    assert tree[P:].tolist() == leaves.tolist()
    for i in range(P - 1, 0, -1):
        built[i] = max(built[2 * i], built[2 * i + 1])
    assert tree.tolist() == built.tolist()


@pytest.mark.parametrize("kind", ["real", "ties", "sparse"])
@pytest.mark.parametrize("n", [1, 5, 1000, 100_000])
def test_leaves_equal_finds_what_a_scan_of_the_leaves_finds(kind, n):
    """The leaves equal to a value, found from the root through the subtrees at or above it: the scan's
    answer, ascending, for present, absent, largest and smallest values; -1 (the caller scans) once a
    level holds more such nodes than the room given, never a partial answer."""
    rng = np.random.default_rng(n + len(kind))
    v = {"real": rng.random(n), "ties": rng.integers(0, 5, n).astype(np.float64),
         "sparse": np.where(rng.random(n) < 0.9, -np.inf, rng.integers(0, 3, n).astype(np.float64))}[kind]  # fmt: skip
    tree = _maxtree_from(v)
    finite = v[np.isfinite(v)]
    values = [*finite[:3].tolist(), float(finite.max()) if len(finite) else 1.0, 0.5, 7.0]
    for value in values:
        want = np.flatnonzero(v == value)
        out = np.empty(n + 1, dtype=np.int64)  # room enough: the exact answer
        found = maxtree.leaves_equal(tree, value, n, out)
        assert out[:found].tolist() == want.tolist()
        small = np.empty(2, dtype=np.int64)
        got = maxtree.leaves_equal(tree, value, n, small)
        above = int((v >= value).sum())
        if above > 2:  # more candidates than room at the leaves' level at least
            assert got == -1
        else:
            assert small[:got].tolist() == want.tolist()
    assert maxtree.leaves_equal(tree, -np.inf, n, np.empty(4, dtype=np.int64)) == -1


def _stamped_ref(leaves: np.ndarray, touched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and stamps of every node, built bottom-up by the rule itself: the larger value, equal values
    the lesser stamp, equal again the left child (stamps past ``touched``: none, the largest int64)."""
    P = len(leaves)
    v = np.full(2 * P, -np.inf)
    st = np.full(2 * P, np.iinfo(np.int64).max, dtype=np.int64)
    v[P:] = leaves
    st[P : P + len(touched)] = touched
    for i in range(P - 1, 0, -1):
        a, b = 2 * i, 2 * i + 1
        pick = a if (v[a], -st[a]) >= (v[b], -st[b]) else b
        v[i], st[i] = v[pick], st[pick]
    return v, st


@pytest.mark.parametrize("kind", ["real", "ties", "all equal", "sparse"])
@pytest.mark.parametrize("n", [1, 2, 5, 1000, 4097])
def test_stamped_max_tree_ranks_ties_by_stamp_through_updates(kind, n):
    """A heap's tree with stamps, changed batch by batch as a shard changes it (each batch's stamps written
    to ``touched`` first, repeats in a batch: the last wins): node for node the tree built from its final
    leaves by the rule, and its top k, for every k, what a lexicographic sort of (value descending,
    stamp, slot) gives.  ``restamp`` of the same values gives the same stamps."""
    rng = np.random.default_rng(n * 7 + len(kind))
    draw = {"real": lambda m: rng.random(m), "ties": lambda m: rng.integers(0, 4, m).astype(np.float64),
            "all equal": lambda m: np.ones(m),
            "sparse": lambda m: np.where(rng.random(m) < 0.8, -np.inf, rng.integers(0, 3, m).astype(np.float64))}[kind]  # fmt: skip
    tree = maxtree.new_tree(n)
    stamps = maxtree.new_stamps(tree)
    touched = np.zeros(n, dtype=np.int64)
    clock = 0
    for _ in range(6):
        m = int(rng.integers(1, 2 * n + 2))
        idx = rng.integers(0, n, m)
        touched[idx] = clock + np.arange(m)  # (repeats: the last stamp, as the shard writes them)
        clock += m
        maxtree.set_leaves_stamped(tree, stamps, touched, idx, draw(m))
    P = len(tree) // 2
    v, st = _stamped_ref(tree[P:].copy(), touched)
    assert tree.tolist() == v.tolist()
    assert stamps[1:].tolist() == st[1:P].tolist()
    again = maxtree.new_stamps(tree)
    maxtree.restamp(tree, again, touched)
    assert again[1:].tolist() == stamps[1:].tolist()
    leaves = tree[P : P + n]
    live = np.flatnonzero(np.isfinite(leaves))
    order = live[np.lexsort((live, touched[live], -leaves[live]))]
    for k in sorted({1, 2, 3, n // 2 + 1, n, n + 5}):
        out_i, out_v = np.empty(k, dtype=np.int64), np.empty(k)
        found = maxtree.topk_stamped(tree, stamps, touched, k, out_i, out_v)
        assert out_i[:found].tolist() == order[:k].tolist()
        assert out_v[:found].tolist() == leaves[order[:k]].tolist()


def test_stamped_top_k_of_a_large_all_equal_tree_is_the_least_stamped():
    """Equal priorities everywhere, stamps in no slot order (updates reorder them): the k least stamped
    slots, in stamp order, from 100k leaves and at frontiers cut at every level."""
    rng = np.random.default_rng(5)
    n = 100_000
    touched = rng.permutation(n).astype(np.int64) * 3
    tree = maxtree.new_tree(n)
    stamps = maxtree.new_stamps(tree)
    maxtree.set_leaves_stamped(tree, stamps, touched, np.arange(n, dtype=np.int64), np.ones(n))
    for k in (1, 100, 5000):
        out_i, out_v = np.empty(k, dtype=np.int64), np.empty(k)
        assert maxtree.topk_stamped(tree, stamps, touched, k, out_i, out_v) == k
        assert out_i.tolist() == np.argsort(touched)[:k].tolist()
