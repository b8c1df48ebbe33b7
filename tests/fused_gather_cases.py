"""Parity cases of the fused gather (kernel ``gather_columns``) against its twin.

The twin is the per-column twin applied to each column
(:func:`gear_flow.ops.gather.gather_columns`, a loop over
:func:`gear_flow.ops.gather.gather_windows`).  Shared by
tests/test_fused_gather_emulated.py (kernels compiled as host C++, see
tests/cuda_emu) and tests/test_gpu_fused_gather.py (a real device); each test
takes a ``dev`` fixture (:class:`parity_cases.Dev`) from the importing module.
Results must be equal byte for byte; outputs start poisoned (0xA5), so an
unwritten byte shows.
"""

from __future__ import annotations

import numpy as np
import pytest
from parity_cases import _misaligned, _windows

from gear_flow.errors import InvalidDataError
from gear_flow.ops import gather as gather_cpu

#: step widths in bytes: 1/4/8 (done/reward/action), odd ones (no congruence), a multiple of 16
#: (obs-like), and rows of several pieces (L * nb > 2048 bytes, GATHER_PIECE)
WIDTHS = (1, 2, 3, 4, 8, 13, 16, 17, 64, 1037)


def _pinned(xp, shape, offset: int) -> np.ndarray:
    """A C-contiguous uint8 NumPy array in page-locked memory, ``offset`` bytes past a 256-byte boundary."""
    size = int(np.prod(shape))
    mem = xp.cuda.alloc_pinned_memory(size + 512)
    flat = np.frombuffer(mem, np.uint8, count=size + 512)
    base = (-int(flat.ctypes.data)) % 256
    return flat[base + offset : base + offset + size].reshape(shape)


def _case(dev, seed: int, pinned_share: float = 0.0):
    """A random take: columns of random widths and misaligned placements, rings that wrap, windows
    with head and tail padding; returns (host srcs, device-side srcs, windows, B, L)."""
    rng = np.random.default_rng(seed)
    C = int(rng.integers(1, 7))
    B = int(rng.choice([1, 2, 5, 17, 33]))
    L = int(rng.choice([1, 3, 8, 13]))
    same_cap = rng.random() < 0.7  # as in a shard; different capacities are allowed too
    cap0 = int(rng.choice([1, 2, 7, 40]))
    src_h, srcs = [], []
    for _ in range(C):
        nb = int(rng.choice(WIDTHS))
        cap = cap0 if same_cap else int(rng.integers(cap0, cap0 + 9))
        h = rng.integers(0, 256, (cap, nb), dtype=np.uint8)
        off = int(rng.integers(0, 17))
        if rng.random() < pinned_share:
            d = _pinned(dev.xp, (cap, nb), off)
            d[...] = h
        else:
            d = _misaligned(dev, (cap, nb), off)
            d[...] = dev.to(h)
        src_h.append(h)
        srcs.append(d)
    s, d, n = _windows(rng, B, L, min(x.shape[0] for x in src_h))
    return rng, src_h, srcs, (s, d, n), B, L


def _outs(dev, rng, src_h, B: int, L: int):
    outs = []
    for h in src_h:
        o = _misaligned(dev, (B, L, h.shape[1]), int(rng.integers(0, 17)))
        o[...] = 0xA5
        outs.append(o)
    return outs


def _reference(src_h, win, B: int, L: int):
    refs = [np.full((B, L, h.shape[1]), 0xA5, np.uint8) for h in src_h]
    gather_cpu.gather_columns(src_h, *win, refs)
    return refs


def _ops():
    from gear_flow.gpu.ops import gather

    return gather


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("windows_on", ["host", "device"])
def test_gather_columns_matches_twin(dev, seed, windows_on):
    """Random column counts, widths, capacities, misaligned sources and outputs, wraps and paddings."""
    ga = _ops()
    rng, src_h, srcs, win, B, L = _case(dev, seed)
    refs = _reference(src_h, win, B, L)
    outs = _outs(dev, rng, src_h, B, L)
    w = win if windows_on == "host" else tuple(dev.to(a) for a in win)
    ga.gather_columns(srcs, *w, outs)
    for i, (o, r) in enumerate(zip(outs, refs)):
        np.testing.assert_array_equal(dev.host(o), r, err_msg=f"column {i} of {len(outs)}")


@pytest.mark.parametrize("seed", range(12))
def test_gather_columns_from_pinned_and_device_sources_in_one_launch(dev, seed):
    """A descriptor may point at device memory or at pinned host memory (UVA), mixed in one launch."""
    ga = _ops()
    rng, src_h, srcs, win, B, L = _case(dev, 1000 + seed, pinned_share=0.5)
    refs = _reference(src_h, win, B, L)
    outs = _outs(dev, rng, src_h, B, L)
    ga.gather_columns(srcs, *win, outs)
    for o, r in zip(outs, refs):
        np.testing.assert_array_equal(dev.host(o), r)


def test_gather_columns_into_batch_slices(dev):
    """As a shard gathers: into ``out[offset:offset + b]`` of larger batches, other rows untouched."""
    ga = _ops()
    rng = np.random.default_rng(7)
    cap, L, widths = 50, 6, (1024, 8, 4, 1)
    src_h = [rng.integers(0, 256, (cap, nb), dtype=np.uint8) for nb in widths]
    srcs = [dev.to(h) for h in src_h]
    refs = [np.full((20, L, nb), 0xA5, np.uint8) for nb in widths]
    outs = [dev.to(r.copy()) for r in refs]
    for off, b in ((0, 7), (7, 13)):
        s, d, n = _windows(rng, b, L, cap)
        gather_cpu.gather_columns(src_h, s, d, n, [r[off : off + b] for r in refs])
        ga.gather_columns(srcs, s, d, n, [o[off : off + b] for o in outs])
    for o, r in zip(outs, refs):
        np.testing.assert_array_equal(dev.host(o), r)


def test_gather_columns_duplicate_windows_and_a_shared_source(dev):
    """Repeated windows fill their own rows; two columns may read the same ring."""
    ga = _ops()
    rng = np.random.default_rng(13)
    cap, B, L = 19, 12, 7
    h = rng.integers(0, 256, (cap, 24), dtype=np.uint8)
    s, d, n = _windows(rng, B, L, cap)
    s[B // 2 :], d[B // 2 :], n[B // 2 :] = s[: B // 2], d[: B // 2], n[: B // 2]
    refs = _reference([h, h], (s, d, n), B, L)
    src = dev.to(h)
    outs = _outs(dev, rng, [h, h], B, L)
    ga.gather_columns([src, src], s, d, n, outs)
    for o, r in zip(outs, refs):
        np.testing.assert_array_equal(dev.host(o), r)


def test_gather_columns_more_columns_than_one_launch_takes(dev):
    """Over 32 columns: split into several launches, every column still gathered."""
    ga = _ops()
    rng = np.random.default_rng(8)
    cap, B, L = 23, 9, 5
    widths = [int(x) for x in rng.choice(WIDTHS, 37)]
    src_h = [rng.integers(0, 256, (cap, nb), dtype=np.uint8) for nb in widths]
    win = _windows(rng, B, L, cap)
    refs = _reference(src_h, win, B, L)
    outs = _outs(dev, rng, src_h, B, L)
    # the sources stay referenced until the launches have run: the kernel reaches them through
    # the descriptor table, which holds addresses, not references
    srcs = [dev.to(h) for h in src_h]
    table = ga.column_table(srcs, outs)
    assert len(table.launches) == 2 and table.launches[0][:2] == (0, 32)
    ga.gather_columns(srcs, *win, outs)
    for o, r in zip(outs, refs):
        np.testing.assert_array_equal(dev.host(o), r)


def test_gather_columns_empty_cases(dev):
    """No columns, no windows, zero-byte steps: nothing launched for them, the rest gathered."""
    ga = _ops()
    rng = np.random.default_rng(9)
    ga.gather_columns([], np.zeros(3, np.int64), np.zeros(3, np.int64), np.zeros(3, np.int64), [])
    src = dev.to(rng.integers(0, 256, (10, 4), dtype=np.uint8))
    empty = np.zeros(0, np.int64)
    ga.gather_columns([src], empty, empty, empty, [dev.xp.zeros((0, 3, 4), dtype=np.uint8)])
    zero_h = np.zeros((10, 0), np.uint8)
    src_h = rng.integers(0, 256, (10, 4), dtype=np.uint8)
    win = _windows(rng, 4, 3, 10)
    refs = _reference([zero_h, src_h], win, 4, 3)
    outs = [dev.xp.zeros((4, 3, 0), dtype=np.uint8), _outs(dev, rng, [src_h], 4, 3)[0]]
    srcs = [dev.to(zero_h), dev.to(src_h)]
    table = ga.column_table(srcs, outs)
    assert table.desc.shape == (1, 6)  # the zero-byte column is left out
    ga.gather_columns(srcs, *win, outs)
    np.testing.assert_array_equal(dev.host(outs[1]), refs[1])


def test_gather_columns_rejects_what_the_twin_rejects_before_launching(dev):
    """Bad windows raise the twin's IndexError, and no column is written (the check comes first)."""
    ga = _ops()
    srcs = [dev.to(np.full((8, 4), 1, np.uint8)), dev.to(np.full((5, 2), 2, np.uint8))]
    good = np.array([0, 0]), np.array([0, 0]), np.array([3, 3])
    for s, d, n in (
        (np.array([0, 5]), good[1], good[2]),  # past the smaller ring (column 1), inside column 0's
        (good[0], np.array([0, 1]), good[2]),  # runs past the window
        (good[0], good[1], np.array([-1, 0])),
    ):
        host = [np.zeros((8, 4), np.uint8), np.zeros((5, 2), np.uint8)]
        with pytest.raises(IndexError, match="window 1|window 0"):
            gather_cpu.gather_columns(host, s, d, n, [np.zeros((2, 3, 4), np.uint8), np.zeros((2, 3, 2), np.uint8)])
        outs = [dev.xp.zeros((2, 3, 4), dtype=np.uint8), dev.xp.zeros((2, 3, 2), dtype=np.uint8)]
        with pytest.raises(IndexError, match="window 1|window 0"):
            ga.gather_columns(srcs, s, d, n, outs)
        assert not dev.host(outs[0]).any() and not dev.host(outs[1]).any()
    outs = [dev.xp.zeros((2, 3, 4), dtype=np.uint8), dev.xp.zeros((2, 3, 2), dtype=np.uint8)]
    with pytest.raises(InvalidDataError, match="pageable"):
        ga.gather_columns([np.zeros((8, 4), np.uint8), srcs[1]], *good, outs)
    with pytest.raises(InvalidDataError, match="bytes"):
        ga.gather_columns(srcs, *good, [outs[0], dev.xp.zeros((2, 3, 3), dtype=np.uint8)])
    with pytest.raises(InvalidDataError, match="column 1"):
        ga.gather_columns(srcs, *good, [outs[0], dev.xp.zeros((2, 4, 2), dtype=np.uint8)])
    with pytest.raises(InvalidDataError, match="windows"):
        ga.gather_columns(srcs, np.zeros(3, np.int64), np.zeros(3, np.int64), np.zeros(3, np.int64), outs)


@pytest.mark.parametrize("tier_name", ["device", "pinned"])
def test_tier_gather_columns_matches_twin(dev, tier_name):
    """The GPU tiers' gather_columns, as Shard.take calls it: the same windows again (reused upload),
    new windows, device windows, and gather_windows in between (one shared upload cache)."""
    from gear_flow.storage import get_tier

    tier = get_tier(tier_name)
    rng = np.random.default_rng(11)
    cap, L = 37, 8
    cols = {"obs": ((6,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "done": ((), np.bool_)}
    rings, rings_h = {}, {}
    for name, (shape, dtype) in cols.items():
        rings[name] = tier.empty((cap, *shape), dtype)
        rows = (rng.random((cap, *shape)) * 100).astype(dtype)
        tier.write_rows(rings[name], 0, rows)
        rings_h[name] = rows
    srcs = {n: r.reshape(cap, -1).view(np.uint8) for n, r in rings.items()}
    srcs_h = {n: r.reshape(cap, -1).view(np.uint8) for n, r in rings_h.items()}
    for step, B in enumerate((16, 16, 5, 16, 9)):
        if step != 1:
            win = _windows(rng, B, L, cap)
        names = list(cols) if step != 3 else ["done", "obs"]  # a subset, in another order
        refs = {n: np.full((B, L, srcs_h[n].shape[1]), 0xA5, np.uint8) for n in names}
        gather_cpu.gather_columns([srcs_h[n] for n in names], *win, [refs[n] for n in names])
        if step != 1:  # step 1: the same outputs and windows again, so the same upload (reused)
            outs = {n: tier.empty_output((B, L, srcs_h[n].shape[1])) for n in names}
        for o in outs.values():
            o[...] = 0xA5
        w = win if step != 4 else tuple(dev.to(a) for a in win)
        tier.gather_columns(srcs, *w, outs)
        if step == 2:  # the single-column path shares the upload cache
            solo = tier.empty_output((B, L, srcs_h["obs"].shape[1]))
            tier.gather_windows(srcs["obs"], *win, solo)
            np.testing.assert_array_equal(dev.host(solo), refs["obs"])
        tier.synchronize()
        for n in names:
            np.testing.assert_array_equal(dev.host(outs[n]), refs[n], err_msg=f"step {step}, column {n}")


def test_pinned_tier_write_after_gather_columns_keeps_gathered_values(dev):
    """A host write into a pinned ring waits for the fused gather already issued on it."""
    from gear_flow.storage import get_tier

    tier = get_tier("pinned")
    cap, B, L = 1024, 64, 16
    rings = {"a": tier.empty((cap, 64), np.uint8), "b": tier.empty((cap, 3), np.uint8)}
    for r in rings.values():
        r[...] = 7
    s = np.arange(B, dtype=np.int64) * L
    outs = {n: tier.empty_output((B, L, r.shape[1])) for n, r in rings.items()}
    tier.gather_columns(rings, s, np.zeros(B, np.int64), np.full(B, L, np.int64), outs)
    for r in rings.values():
        tier.write_rows(r, 0, np.full((cap, r.shape[1]), 9, np.uint8))  # must not race the gather
    for o in outs.values():
        assert (dev.host(o) == 7).all()


def test_host_tier_gather_columns_is_the_twin():
    """StorageTier's default gather_columns: gather_windows per column (the host tier's twin)."""
    from gear_flow.storage import get_tier

    tier = get_tier("host")
    rng = np.random.default_rng(12)
    srcs = {"x": rng.integers(0, 256, (9, 5), dtype=np.uint8), "y": rng.integers(0, 256, (9, 1), dtype=np.uint8)}
    win = _windows(rng, 6, 4, 9)
    outs = {n: np.full((6, 4, s.shape[1]), 0xA5, np.uint8) for n, s in srcs.items()}
    refs = {n: np.full((6, 4, s.shape[1]), 0xA5, np.uint8) for n, s in srcs.items()}
    tier.gather_columns(srcs, *win, outs)
    for n in srcs:
        gather_cpu.gather_windows(srcs[n], *win, refs[n])
        np.testing.assert_array_equal(outs[n], refs[n])
