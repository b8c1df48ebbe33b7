"""Parity cases: every CUDA kernel (through its Python wrapper) against its CPU twin.

Shared by tests/test_gpu_parity.py (a real device, CuPy) and
tests/test_kernels_emulated.py (the kernels compiled as host C++, see
tests/cuda_emu).  Each test takes a ``dev`` fixture (:class:`Dev`) from the
importing module.  Results must be *equal* to the twins', not close: the
kernels do the same floating-point operations in the same order.
"""

from __future__ import annotations

import numpy as np
import pytest

from gear_flow.errors import InvalidDataError
from gear_flow.ops import gather as gather_cpu
from gear_flow.ops import maxtree as maxtree_cpu
from gear_flow.ops import sumtree as sumtree_cpu


class Dev:
    """What a test needs from the device under test.

    Attributes
    ----------
    xp : module
        ``cupy`` or the emulation's stand-in.
    max_n : int
        Largest problem size worth running (the emulation is slow).
    cuda_tensors : bool
        Do device batches come out as CUDA torch tensors?
    """

    def __init__(self, xp, max_n: int, cuda_tensors: bool):
        self.xp = xp
        self.max_n = max_n
        self.cuda_tensors = cuda_tensors

    def to(self, a):
        return self.xp.asarray(a)

    def host(self, a) -> np.ndarray:
        return np.array(self.xp.asnumpy(a)).view(np.ndarray)

    def empty(self, shape, dtype):
        out = self.xp.empty(shape, dtype=dtype)
        out.view(np.uint8)[...] = 0xA5  # poison: every element must be written
        return out

    def need(self, n: int) -> None:
        if n > self.max_n:
            pytest.skip(f"size {n} runs on a real device only")


def _gpu_ops():
    from gear_flow.gpu.ops import gather, maxtree, sumtree

    return sumtree, maxtree, gather


def _random_tree(rng, n: int, zero_frac: float = 0.3) -> np.ndarray:
    tree = sumtree_cpu.new_tree(n)
    w = rng.random(n) * 10.0
    w[rng.random(n) < zero_frac] = 0.0
    sumtree_cpu.set_leaves(tree, np.arange(n, dtype=np.int64), w)
    return tree


# ---- sum tree ---------------------------------------------------------------------------------------

SIZES = [1, 2, 3, 7, 1000, 100_003, (1 << 20) + 3]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("m", [1, 64, 4096, 5000])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("val_dtype", [np.float64, np.float32])
def test_sumtree_set_leaves(dev, n, m, idx_dtype, val_dtype):
    """Duplicates (last wins), zeros, both index and value dtypes, block / per-level / rebuild paths."""
    dev.need(max(n, m))
    if m > 64 and (idx_dtype, val_dtype) != (np.int64, np.float64) and n != 1000:
        pytest.skip("dtype combinations are covered at the smaller sizes")
    st, _, _ = _gpu_ops()
    rng = np.random.default_rng(n * 7 + m)
    tree = _random_tree(rng, n)
    d = dev.to(tree)
    idx = rng.integers(0, n, m).astype(idx_dtype)
    if m > 1:
        idx[-1] = idx[0]  # at least one duplicate, the later value must win
    vals = (rng.random(m) * 5.0).astype(val_dtype)
    vals[rng.random(m) < 0.2] = 0.0
    sumtree_cpu.set_leaves(tree, idx.astype(np.int64), vals)
    st.set_leaves(d, dev.to(idx), dev.to(vals))
    np.testing.assert_array_equal(dev.host(d), tree)


def test_sumtree_set_leaves_host_inputs_and_scratch_reuse(dev):
    st, _, _ = _gpu_ops()
    rng = np.random.default_rng(1)
    tree = _random_tree(rng, 300)
    d = dev.to(tree)
    scratch = st.new_scratch(d)
    for _ in range(3):
        idx = rng.integers(0, 300, 50)
        vals = rng.random(50)
        sumtree_cpu.set_leaves(tree, idx, vals)
        st.set_leaves(d, idx, vals, scratch=scratch)  # NumPy inputs are uploaded
        np.testing.assert_array_equal(dev.host(d), tree)
    assert (dev.host(scratch) == -1).all()  # the scratch is left all -1 for the next call


@pytest.mark.parametrize("n", [1, 5, 1000])
@pytest.mark.parametrize("m", [3, 5000])
def test_sumtree_set_leaves_const(dev, n, m):
    st, _, _ = _gpu_ops()
    rng = np.random.default_rng(n + m)
    tree = _random_tree(rng, n)
    d = dev.to(tree)
    idx = rng.integers(0, n, m)
    for value in (0.0, 2.5):
        sumtree_cpu.set_leaves_const(tree, idx, value)
        st.set_leaves_const(d, dev.to(idx), value)
        np.testing.assert_array_equal(dev.host(d), tree)


def test_sumtree_empty_update_is_a_no_op(dev):
    st, _, _ = _gpu_ops()
    tree = _random_tree(np.random.default_rng(2), 10)
    d = dev.to(tree)
    st.set_leaves(d, np.zeros(0, np.int64), np.zeros(0))
    np.testing.assert_array_equal(dev.host(d), tree)


def test_sumtree_rebuild(dev):
    st, _, _ = _gpu_ops()
    tree = _random_tree(np.random.default_rng(3), 777)
    broken = tree.copy()
    broken[1 : len(tree) // 2] = -1.0  # internal nodes garbage, leaves intact
    d = dev.to(broken)
    st.rebuild(d)
    np.testing.assert_array_equal(dev.host(d), tree)


def _edge_targets(tree: np.ndarray, rng, k: int) -> np.ndarray:
    P = len(tree) // 2
    root = tree[1]
    cum = np.cumsum(tree[P:])
    cum = cum[cum < root]
    edges = [0.0, np.nextafter(root, 0.0)]
    return np.concatenate([rng.random(k) * root, edges, cum[: min(len(cum), 64)]])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("zero_frac", [0.0, 0.5, 0.95])
@pytest.mark.parametrize("t_dtype", [np.float64, np.float32])
def test_sumtree_find(dev, n, zero_frac, t_dtype):
    dev.need(n)
    st, _, _ = _gpu_ops()
    rng = np.random.default_rng(n + int(zero_frac * 100))
    tree = _random_tree(rng, n, zero_frac)
    if tree[1] <= 0:
        sumtree_cpu.set_leaves(tree, np.array([n - 1]), np.array([1.0]))
    targets = _edge_targets(tree, rng, 500).astype(t_dtype)
    targets = targets[targets.astype(np.float64) < tree[1]]
    ref = np.empty(len(targets), np.int64)
    sumtree_cpu.find(tree, targets.astype(np.float64), ref)
    out = dev.empty(len(targets), np.int64)
    st.find(dev.to(tree), dev.to(targets), out)
    got = dev.host(out)
    np.testing.assert_array_equal(got, ref)
    P = len(tree) // 2
    assert (tree[P + got] > 0).all(), "a zero-weight leaf was returned"


@pytest.mark.parametrize("n", [1, 3, 1000, 100_003, (1 << 20) + 3])
@pytest.mark.parametrize("B", [1, 1024])
def test_sumtree_sample_matches_twin_on_same_uniforms(dev, n, B):
    dev.need(n)
    st, _, _ = _gpu_ops()
    rng = np.random.default_rng(n + B)
    tree = _random_tree(rng, n, 0.5)
    if tree[1] <= 0:
        sumtree_cpu.set_leaves(tree, np.array([0]), np.array([1.0]))
    u = rng.random(B)
    u[0] = 0.0
    u[-1] = np.nextafter(1.0, 0.0)
    ref = np.empty(B, np.int64)
    sumtree_cpu.find(tree, u * tree[1], ref)
    out, w = dev.empty(B, np.int64), dev.empty(B, np.float64)
    d = dev.to(tree)
    st.sample(d, dev.to(u), out, w)
    np.testing.assert_array_equal(dev.host(out), ref)
    P = len(tree) // 2
    np.testing.assert_array_equal(dev.host(w), tree[P + ref])
    assert (dev.host(w) > 0).all()
    assert st.mass(d) == tree[1]


@pytest.mark.parametrize("n", [1, 13, 1000, 100_003])
def test_sumtree_range_sums_and_ring_tail_mass(dev, n):
    dev.need(n)
    st, _, _ = _gpu_ops()
    rng = np.random.default_rng(n)
    tree = _random_tree(rng, n)
    d = dev.to(tree)
    lo = rng.integers(0, n, 200)
    hi = np.minimum(n, lo + rng.integers(0, max(n, 1), 200))
    ref = np.array([sumtree_cpu.range_sum(tree, a, b) for a, b in zip(lo, hi)])
    out = dev.empty(200, np.float64)
    st.range_sums(d, lo, hi, out)
    np.testing.assert_array_equal(dev.host(out), ref)
    assert st.range_sum(d, 0, n) == sumtree_cpu.range_sum(tree, 0, n)
    # ring segments, some wrapping, some shorter than k, some empty
    cap = n
    E = 50
    starts = rng.integers(0, cap, E)
    lengths = rng.integers(0, max(cap, 1) + 1, E)
    for k in (0, 1, 5, cap + 2):
        ref_t = sumtree_cpu.ring_tail_mass(tree, cap, starts, lengths, k)
        assert st.ring_tail_mass(d, cap, starts, lengths, k) == ref_t
    assert st.ring_tail_mass(d, cap, np.zeros(0, np.int64), np.zeros(0, np.int64), 3) == 0.0


def test_sumtree_range_sums_stay_inside_the_tree_and_their_output(dev):
    """A range past the leaves read outside the tree (the device summed guard memory: 1008 for 8 ones), and an
    ``out`` shorter than the ranges was written past its end.  Ranges are clamped to the leaves on the device
    and in the twin alike; a short ``out`` is refused."""
    st, _, _ = _gpu_ops()
    tree = sumtree_cpu.new_tree(8)
    sumtree_cpu.set_leaves(tree, np.arange(8), np.ones(8))
    big = dev.to(np.full(32, 1000.0))
    d = big[:16]
    d[...] = dev.to(tree)
    for lo, hi in ((0, 9), (-3, 4), (6, 1 << 40), (9, 12)):
        want = float(min(hi, 8) - max(lo, 0)) if min(hi, 8) > max(lo, 0) else 0.0
        assert sumtree_cpu.range_sum(tree, lo, hi) == want
        assert st.range_sum(d, lo, hi) == want
    buf = dev.to(np.full(6, -7.0))
    with pytest.raises(InvalidDataError, match="out"):
        st.range_sums(d, np.zeros(5, np.int64), np.full(5, 8, np.int64), buf[:1])
    assert (dev.host(buf) == -7.0).all()


# ---- max tree and top-k ------------------------------------------------------------------------


def _max_tree(rng, n: int, kind: str) -> np.ndarray:
    tree = maxtree_cpu.new_tree(n)
    if kind == "ties":
        v = rng.integers(0, 4, n).astype(np.float64)
    elif kind == "equal":
        v = np.ones(n)
    elif kind == "signed_zero":
        v = np.where(rng.random(n) < 0.5, -0.0, 0.0) + np.where(rng.random(n) < 0.2, 1.0, 0.0)
    else:
        v = rng.normal(size=n) * 1e3
    v[rng.random(n) < 0.3] = -np.inf  # empty slots
    maxtree_cpu.set_leaves(tree, np.arange(n, dtype=np.int64), v)
    return tree


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 5000, 100_003, (1 << 20) + 3])
@pytest.mark.parametrize("kind", ["random", "ties", "equal", "signed_zero"])
@pytest.mark.parametrize("k", [0, 1, 10, 1000, 3000])
def test_topk(dev, n, kind, k):
    dev.need(n)
    if k > 1000 and n < 1000:
        pytest.skip("k > n is covered by the smaller k")
    _, mt, _ = _gpu_ops()
    rng = np.random.default_rng(n + k)
    tree = _max_tree(rng, n, kind)
    ri, rv = np.empty(max(k, 1), np.int64), np.empty(max(k, 1), np.float64)
    ref_found = maxtree_cpu.topk(tree, k, ri, rv)
    want = min(k, len(tree) // 2)
    oi, ov = dev.empty(max(want, 1), np.int64), dev.empty(max(want, 1), np.float64)
    found = mt.topk(dev.to(tree), k, oi, ov)
    assert found == ref_found
    np.testing.assert_array_equal(dev.host(oi)[:found], ri[:found])
    np.testing.assert_array_equal(dev.host(ov)[:found], rv[:found])


@pytest.mark.parametrize("n", [5, 1000, 70_000])
@pytest.mark.parametrize("k", [1, 100, 2049])
def test_topk_flat_float32(dev, n, k):
    dev.need(n)
    _, mt, _ = _gpu_ops()
    rng = np.random.default_rng(n * k)
    v = rng.integers(-5, 5, n).astype(np.float32)
    v[rng.random(n) < 0.1] = -np.inf
    ok = np.flatnonzero(v != -np.inf)
    order = ok[np.lexsort((ok, -v[ok].astype(np.float64)))][:k]  # value desc, index asc
    want = min(k, n)
    oi, ov = dev.empty(want, np.int64), dev.empty(want, np.float32)
    found = mt.topk_flat(dev.to(v), k, oi, ov)
    assert found == len(order)
    np.testing.assert_array_equal(dev.host(oi)[:found], order)
    np.testing.assert_array_equal(dev.host(ov)[:found], v[order])


@pytest.mark.parametrize("n", [1, 9, 5000])
def test_maxtree_set_leaves(dev, n):
    _, mt, _ = _gpu_ops()
    rng = np.random.default_rng(n)
    tree = _max_tree(rng, n, "ties")
    d = dev.to(tree)
    for m in (3, 4500):
        idx = rng.integers(0, n, m)
        vals = rng.normal(size=m)
        vals[rng.random(m) < 0.3] = -np.inf
        maxtree_cpu.set_leaves(tree, idx, vals)
        mt.set_leaves(d, dev.to(idx), dev.to(vals))
        np.testing.assert_array_equal(dev.host(d), tree)


# ---- window gather ---------------------------------------------------------------------------------


def _windows(rng, B: int, L: int, cap: int):
    """Valid windows: wraps, head padding, tail padding, empty windows."""
    n = rng.integers(0, min(L, cap) + 1, B)
    d = np.array([rng.integers(0, L - k + 1) for k in n], dtype=np.int64)
    s = rng.integers(0, cap, B)
    if B > 1:
        s[0], n[0], d[0] = cap - 1, min(L, cap), 0  # wraps whenever more than one step
        n[1], d[1] = 0, L // 2  # all padding
    return s.astype(np.int64), d, n.astype(np.int64)


def _misaligned(dev, shape, offset: int, host: bool = False):
    """A C-contiguous uint8 array of ``shape`` whose first byte sits ``offset`` bytes past a 256-byte boundary."""
    size = int(np.prod(shape))
    flat = np.zeros(size + 256, np.uint8) if host else dev.xp.zeros(size + 256, dtype=np.uint8)
    return flat[offset : offset + size].reshape(shape)


@pytest.mark.parametrize("nb", [1, 3, 4, 8, 13, 16, 17, 1037])
@pytest.mark.parametrize("cap", [1, 7, 64])
@pytest.mark.parametrize("B,L", [(1, 1), (5, 4), (33, 9)])
@pytest.mark.parametrize("src_off,out_off", [(0, 0), (1, 0), (0, 3), (8, 4), (5, 7)])
def test_gather_windows(dev, nb, cap, B, L, src_off, out_off):
    _, _, ga = _gpu_ops()
    rng = np.random.default_rng(nb * 1000 + cap * 10 + B + src_off)
    src_h = rng.integers(0, 256, (cap, nb), dtype=np.uint8)
    s, d, n = _windows(rng, B, L, cap)
    ref = np.full((B, L, nb), 0xA5, np.uint8)
    gather_cpu.gather_windows(src_h, s, d, n, ref)
    src = _misaligned(dev, (cap, nb), src_off)
    src[...] = dev.to(src_h)
    out = _misaligned(dev, (B, L, nb), out_off)
    out[...] = 0xA5
    ga.gather_windows(src, s, d, n, out)
    np.testing.assert_array_equal(dev.host(out), ref)


def test_gather_windows_into_batch_slices_with_device_window_arrays(dev):
    """As a shard gathers: into ``out[offset:offset + b]`` of a larger batch, windows already on the device."""
    _, _, ga = _gpu_ops()
    rng = np.random.default_rng(5)
    cap, nb, L = 50, 12, 6
    src_h = rng.integers(0, 256, (cap, nb), dtype=np.uint8)
    ref = np.full((20, L, nb), 0xA5, np.uint8)
    out = dev.to(ref.copy())
    for off, b in ((0, 7), (7, 13)):
        s, d, n = _windows(rng, b, L, cap)
        gather_cpu.gather_windows(src_h, s, d, n, ref[off : off + b])
        ga.gather_windows(dev.to(src_h), dev.to(s), dev.to(d), dev.to(n), out[off : off + b])
    np.testing.assert_array_equal(dev.host(out), ref)


def test_gather_windows_with_host_and_device_window_arrays_mixed(dev):
    """Some window arrays already on the device, others on the host: the host ones are uploaded
    (never converted implicitly to NumPy, which CuPy refuses)."""
    _, _, ga = _gpu_ops()
    rng = np.random.default_rng(6)
    cap, nb, B, L = 40, 8, 9, 5
    src_h = rng.integers(0, 256, (cap, nb), dtype=np.uint8)
    s, d, n = _windows(rng, B, L, cap)
    ref = np.full((B, L, nb), 0xA5, np.uint8)
    gather_cpu.gather_windows(src_h, s, d, n, ref)
    for on_device in ((True, False, False), (False, True, True), (True, True, False)):
        args = [dev.to(a) if here else a for a, here in zip((s, d, n), on_device)]
        out = dev.to(np.full((B, L, nb), 0xA5, np.uint8))
        ga.gather_windows(dev.to(src_h), *args, out)
        np.testing.assert_array_equal(dev.host(out), ref, err_msg=str(on_device))


def test_gather_windows_rejects_what_the_twin_rejects(dev):
    _, _, ga = _gpu_ops()
    src = dev.to(np.zeros((8, 4), np.uint8))
    out = dev.xp.zeros((2, 3, 4), dtype=np.uint8)
    good = np.array([0, 0]), np.array([0, 0]), np.array([3, 3])
    for s, d, n in (
        (np.array([0, 8]), good[1], good[2]),  # start past the ring
        (good[0], np.array([0, 1]), good[2]),  # runs past the window
        (good[0], good[1], np.array([-1, 0])),
        (good[0], np.array([0, 2**63 - 1]), np.array([3, 1])),  # offset + steps wrapped negative in int64 and passed
    ):
        with pytest.raises(IndexError, match="window 1|window 0"):
            gather_cpu.gather_windows(np.zeros((8, 4), np.uint8), s, d, n, np.zeros((2, 3, 4), np.uint8))
        with pytest.raises(IndexError, match="window 1|window 0"):
            ga.gather_windows(src, s, d, n, out)
    with pytest.raises(InvalidDataError, match="pageable"):
        ga.gather_windows(np.zeros((8, 4), np.uint8), *good, out)  # ordinary host memory
    with pytest.raises(InvalidDataError, match="bytes"):
        ga.gather_windows(src, *good, dev.xp.zeros((2, 3, 5), dtype=np.uint8))
    with pytest.raises(InvalidDataError, match=r"\[2, 3, 2\] entries"):  # ragged: NumPy's bare ValueError before
        ga.gather_windows(src, good[0], np.zeros(3, np.int64), good[2], out)


# ---- storage tiers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tier_name", ["device", "pinned"])
@pytest.mark.parametrize("shape,dtype", [((3,), np.float32), ((), np.int64), ((), np.bool_), ((5,), np.uint8)])
def test_tier_write_read_gather(dev, tier_name, shape, dtype):
    from gear_flow.storage import get_tier

    tier = get_tier(tier_name)
    assert tier.name == tier_name
    rng = np.random.default_rng(len(shape) + np.dtype(dtype).itemsize)
    cap = 37
    ring = tier.empty((cap, *shape), dtype)
    ring_h = np.zeros((cap, *shape), dtype)
    pos = 0
    for n in (20, 30, 37, 5):  # wraps, and one write of the whole ring
        rows = (rng.random((n, *shape)) * 100).astype(dtype)
        tier.write_rows(ring, pos % cap, rows)
        gather_cpu.scatter_rows(ring_h, pos % cap, rows)
        pos += n
    np.testing.assert_array_equal(tier.read_rows(ring, 30, 20), ring_h[(30 + np.arange(20)) % cap])
    nb = ring_h.reshape(cap, -1).view(np.uint8).shape[1]
    src = ring.reshape(cap, -1).view(np.uint8)  # as ColumnRing.bytes
    src_h = ring_h.reshape(cap, -1).view(np.uint8)
    B, L = 16, 8
    s, d, n = _windows(rng, B, L, cap)
    ref = np.full((B, L, nb), 0xA5, np.uint8)
    gather_cpu.gather_windows(src_h, s, d, n, ref)
    out = tier.empty_output((B, L, nb))
    tier.gather_windows(src, s, d, n, out)
    tier.synchronize()
    np.testing.assert_array_equal(dev.host(out), ref)
    if tier_name == "pinned":
        assert isinstance(ring, np.ndarray) and not hasattr(ring, "__cuda_array_interface__")


def test_pinned_tier_write_after_gather_keeps_gathered_values(dev):
    """A host write into the pinned ring waits for the gathers already issued on it."""
    from gear_flow.storage import get_tier

    tier = get_tier("pinned")
    cap, nb, B, L = 1024, 64, 64, 16
    ring = tier.empty((cap, nb), np.uint8)
    ring[...] = 7
    s = np.arange(B, dtype=np.int64) * L
    out = tier.empty_output((B, L, nb))
    tier.gather_windows(ring, s, np.zeros(B, np.int64), np.full(B, L, np.int64), out)
    tier.write_rows(ring, 0, np.full((cap, nb), 9, np.uint8))  # must not race the gather
    assert (dev.host(out) == 7).all()


# ---- tables on GPU tiers, end to end ------------------------------------------------------------------


@pytest.mark.parametrize("tier", ["device", "pinned"])
@pytest.mark.parametrize("boundary", ["strict", "pad_head"])
@pytest.mark.parametrize("selector", ["prioritized", "fifo"])
def test_local_table_on_gpu_tier_matches_host_tier(dev, tier, boundary, selector):
    """Same seed, same inserts: the GPU tiers return the host tier's batches, as CUDA tensors.

    Two shards; Fifo makes the table reorder gathered rows (``SampleBuffers.permute``).
    """
    from gear_flow import ColumnSpec, Fifo, LocalTable, Prioritized, TableSpec

    spec = TableSpec(
        (
            ColumnSpec("obs", (5,), np.float32),
            ColumnSpec("action", (), np.int64),
            ColumnSpec("reward", (), np.float32),
            ColumnSpec("done", (), np.bool_),
        ),
        capacity=300,
        num_shards=2,
    )
    rng = np.random.default_rng(0)
    eps = []
    for _ in range(12):
        T = int(rng.integers(5, 40))
        eps.append(
            {
                "obs": rng.random((T, 5), dtype=np.float32),
                "action": rng.integers(0, 9, T),
                "reward": rng.random(T, dtype=np.float32),
                "done": np.arange(T) == T - 1,
            }
        )
    make = {"prioritized": lambda: Prioritized(0.7, 0.5), "fifo": Fifo}[selector]
    tables = {t: LocalTable(spec, sampler=make(), tier=t, seed=3, boundary=boundary) for t in ("host", tier)}
    for t in tables.values():
        for e in eps:
            t.insert(e)
    for _ in range(3):
        ref = tables["host"].sample(16, 4)
        got = tables[tier].sample(16, 4)
        for name in ("obs", "action", "reward", "done"):
            g = got[name]
            assert g.is_cuda == dev.cuda_tensors, name
            assert g.dtype == ref[name].dtype and tuple(g.shape) == tuple(ref[name].shape)
            np.testing.assert_array_equal(g.cpu().numpy(), ref[name].numpy())
        np.testing.assert_array_equal(got.keys.numpy(), ref.keys.numpy())
        np.testing.assert_array_equal(got.mask.numpy(), ref.mask.numpy())
        if selector == "prioritized":
            tables["host"].update_priorities(ref.keys, np.arange(16) + 1.0)
            tables[tier].update_priorities(got.keys, np.arange(16) + 1.0)


@pytest.mark.parametrize("tier", ["device", "pinned"])
def test_local_table_on_gpu_tier_into_device_buffers(dev, tier):
    """With device SampleBuffers passed as ``out``, a GPU-tier table already works without the table change."""
    from gear_flow import ColumnSpec, LocalTable, Prioritized, SampleBuffers, TableSpec

    spec = TableSpec(
        (ColumnSpec("obs", (7,), np.float32), ColumnSpec("done", (), np.bool_)), capacity=200, num_shards=2
    )
    rng = np.random.default_rng(1)
    eps = [
        {"obs": rng.random((T, 7), dtype=np.float32), "done": np.arange(T) == T - 1} for T in rng.integers(8, 30, 10)
    ]
    tables = {
        t: LocalTable(spec, sampler=Prioritized(1.0, 0.4), tier=t, seed=5, boundary="pad_tail") for t in ("host", tier)
    }
    for t in tables.values():
        t.insert(eps)
    buf = SampleBuffers(spec, spec.names, 12, 6, tier=tier)
    assert buf.on_device and buf.matches(spec.names, 12, 6, tier=tier)
    for _ in range(2):
        ref = tables["host"].sample(12, 6)
        got = tables[tier].sample(12, 6, out=buf)
        for name in spec.names:
            assert got[name].is_cuda == dev.cuda_tensors
            np.testing.assert_array_equal(got[name].cpu().numpy(), ref[name].numpy())
        np.testing.assert_array_equal(got.probabilities.numpy(), ref.probabilities.numpy())
