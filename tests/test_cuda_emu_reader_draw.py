"""A learner on a ``pinned`` table draws with its own GPU from the page-locked published selection state,
under the CUDA emulation (and, marked ``gpu``, on a real device).

The reader registers its mapping of a shard's selection state block read-only,
once per mapping, and unregisters it when the mapping is dropped, before its
pages are unmapped; the ``tree_find`` kernel then descends the mapped tree
over UVA (:func:`gear_flow.gpu.shared.state_find`).  The same seed gives the
host draw bit for bit: slots, probabilities, windows and priorities in order.
The owner here is a shard on the shared pinned tier in this process (its
segments mapped by name as another process maps them, as in
test_shared_selection); the last test runs a pinned DistributedTable on
emulated workers against a host-tier one.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import weakref

import dask
import numpy as np
import pytest
from cuda_emu import EmuKernel, fixtures
from helpers import COLUMNS
from test_shared_selection import check_gathered, insert

import gear_flow as gf
from gear_flow.errors import InvalidDataError
from gear_flow.ops.sumtree import find as host_find
from gear_flow.selectors import Fifo, Prioritized
from gear_flow.shard import Shard
from gear_flow.spec import TableSpec
from gear_flow.storage.shared import Attached

emulated = fixtures.emulated
emu_cluster = fixtures.emu_cluster

FIND = ("sumtree", "tree_find<double>")
#: window length of the draws
L = 4


@pytest.fixture
def emu(emulated):
    """The emulation (:func:`cuda_emu.fixtures.emulated`); the mappings a test registered are collected, and
    so unregistered, before it is uninstalled (a finalizer run later would find no ``cupy`` to call)."""
    yield emulated
    gc.collect()


def finds() -> int:
    """``tree_find`` launches in this process so far."""
    return sum(1 for m, e, *_ in EmuKernel.log if (m, e) == FIND)


def pinned_shard(item_unit: str = "step") -> Shard:
    """A shard on the shared pinned tier (page-locked named segments), its selection state published."""
    from gear_flow.gpu.shared import SharedPinnedTier

    spec = TableSpec(COLUMNS, capacity=64, item_unit=item_unit)
    return Shard(spec, 3, Prioritized(alpha=1.0), Fifo(), tier=SharedPinnedTier())


@pytest.fixture
def owner(emu):
    """``make(item_unit)``: a pinned shard; its segments are unregistered and unlinked after the test."""
    made = []

    def make(item_unit: str = "step") -> Shard:
        made.append(pinned_shard(item_unit))
        return made[-1]

    yield make
    for s in made:
        s.tier.release()


def pinned_tree(cp, values) -> np.ndarray:
    """A sum tree over ``values`` in page-locked host memory (as a reader's registered mapping is)."""
    from gear_flow.ops.sumtree import new_tree, set_leaves

    m = new_tree(len(values)).shape[0]
    tree = np.frombuffer(cp.cuda.alloc_pinned_memory(m * 8), dtype=np.float64, count=m)
    tree[...] = 0
    set_leaves(tree, np.arange(len(values), dtype=np.int64), np.asarray(values, dtype=np.float64))
    return tree


@pytest.mark.parametrize("n_leaves", [1, 2, 5, 64, 1000])
def test_the_pinned_find_gives_the_twins_leaves(emu, n_leaves):
    """Targets anywhere in [0, total), at the edges, on zero-weight leaves' boundaries: the host's leaves."""
    from gear_flow.gpu.ops.sumtree import find_pinned

    rng = np.random.default_rng(n_leaves)
    w = rng.random(n_leaves) * (rng.random(n_leaves) < 0.7)  # a third of the leaves weigh nothing
    w[-1] = 0.0 if n_leaves > 1 else 1.0  # a zero last leaf: the right edge's rounding must not land on it
    w[max(0, n_leaves // 2 - 1)] += 0.5  # some weight somewhere
    tree = pinned_tree(emu, w)
    total = tree[1]
    cum = np.cumsum(w)
    targets = np.concatenate([rng.random(500) * total, [0.0, np.nextafter(total, 0.0)], cum[:-1][cum[:-1] < total]])
    want = np.full(len(targets), -1, np.int64)
    host_find(tree, targets, want)
    got = np.full(len(targets) + 3, -7, np.int64)
    before = finds()
    find_pinned(tree, targets, got)
    assert finds() == before + 1
    assert np.array_equal(got[: len(targets)], want)
    assert (got[len(targets) :] == -7).all()  # nothing past the targets' leaves is written
    assert (w[want] > 0).all()


def test_the_pinned_find_refuses_pageable_trees_and_short_outputs(emu):
    from gear_flow.gpu.ops.sumtree import find_pinned
    from gear_flow.ops.sumtree import new_tree, set_leaves

    pageable = new_tree(4)
    set_leaves(pageable, np.arange(4, dtype=np.int64), np.ones(4))
    with pytest.raises(InvalidDataError, match="pageable"):
        find_pinned(pageable, np.array([0.5]), np.empty(1, np.int64))
    tree = pinned_tree(emu, np.ones(4))
    with pytest.raises(InvalidDataError, match="entries for 2 targets"):
        find_pinned(tree, np.array([0.5, 1.5]), np.empty(1, np.int64))
    with pytest.raises(InvalidDataError, match="2 \\* P"):
        find_pinned(tree[:6], np.array([0.5]), np.empty(1, np.int64))


def host_and_device_draws(s: Shard, item_unit: str, boundary: str, count=lambda: 0):
    """A reader's host draw and device draw of the same seed from a wrapped ring of shard ``s``; with the
    reader's mapping and ``count()``'s growth over the device draw."""
    from gear_flow.gpu.shared import state_find

    n_items = 29 if item_unit == "step" else 4
    insert(s, [(1, 5), (2, 9), (3, 3), (4, 12)], prio=np.arange(1, n_items + 1, dtype=float))
    insert(s, [(5, 30), (6, 20)], stamp=29)  # the 64-step ring wraps: the oldest episodes are evicted
    s.valid_mass(L, boundary)  # the owner's first sample of this length publishes its tail mass
    sh = Attached(s.shared_layout(), s.shard_id)
    sel = sh.selection
    step = item_unit == "step"
    host = sel.draw(2000, L, boundary, np.random.default_rng(5), s.capacity, step)
    before = count()
    dev = sel.draw(2000, L, boundary, np.random.default_rng(5), s.capacity, step, state_find(sel))
    assert host is not None and dev is not None and sel.unchanged(dev.version)
    return sh, host, dev, count() - before


def assert_same_draw(host, dev) -> None:
    """Slots, windows, probabilities and priorities equal, in the draw's order (which is not sorted)."""
    for f in dataclasses.fields(host.windows):
        a, b = getattr(host.windows, f.name), getattr(dev.windows, f.name)
        assert (a is None and b is None) or np.array_equal(a, b), f.name
    assert np.array_equal(dev.probs, host.probs) and np.array_equal(dev.priorities, host.priorities)
    assert dev.mass == host.mass and dev.version == host.version
    slots = dev.windows.slots
    assert len(np.unique(slots)) > 1 and (np.diff(slots) < 0).any()  # an in-order comparison that means something


@pytest.mark.parametrize("item_unit", ["step", "episode"])
@pytest.mark.parametrize("boundary", ["strict", "pad_tail", "pad_head"])
def test_the_device_draw_is_the_host_draw(owner, item_unit, boundary):
    """Same seed, same state: the GPU's descent gives the host draw's slots, probabilities, windows and
    priorities, in order; strict windows reject and draw again, through the kernel each round."""
    sh, host, dev, launches = host_and_device_draws(owner(item_unit), item_unit, boundary, finds)
    # a strict window of a step item can fall off its episode's end: some rounds redraw the rejected ones
    assert launches >= (2 if boundary == "strict" and item_unit == "step" else 1), launches
    assert_same_draw(host, dev)
    check_gathered(sh, dev, L)


@pytest.mark.gpu
@pytest.mark.parametrize("item_unit", ["step", "episode"])
@pytest.mark.parametrize("boundary", ["strict", "pad_tail", "pad_head"])
def test_on_a_gpu_the_device_draw_is_the_host_draw(item_unit, boundary):
    """The same, with CUDA's own page-locking and a real kernel reading the mapped tree over UVA."""
    pytest.importorskip("cupy")
    s = pinned_shard(item_unit)
    try:
        sh, host, dev, _ = host_and_device_draws(s, item_unit, boundary)
        assert_same_draw(host, dev)
        check_gathered(sh, dev, L)
        del sh
    finally:
        s.tier.release()


def test_the_state_block_is_registered_once_and_unregistered_before_it_is_unmapped(owner, emu, monkeypatch):
    from gear_flow.gpu.shared import state_find

    rt = emu.cuda.runtime
    calls = []
    register, unregister = rt.hostRegister, rt.hostUnregister

    def counting_register(ptr, size, flags):
        calls.append(("register", ptr, size, flags))
        register(ptr, size, flags)

    def checking_unregister(ptr):
        # the mapping's pages must still be mapped when the driver lets go of them
        calls.append(("unregister", ptr, ptr in live and live[ptr]() is not None))
        unregister(ptr)

    monkeypatch.setattr(rt, "hostRegister", counting_register)
    monkeypatch.setattr(rt, "hostUnregister", checking_unregister)
    s = owner()
    insert(s, [(1, 10), (2, 10)], prio=np.arange(1.0, 21.0))
    calls.clear()  # the owner's own registrations
    sh = Attached(s.shared_layout(), s.shard_id)
    sel = sh.selection
    addr, nbytes = int(sel.block.ctypes.data), sel.block.nbytes
    live = {}
    for m in sh._maps:  # the mmap under the block, watched to the end
        view = np.frombuffer(m, np.uint8)
        if int(view.ctypes.data) == addr:
            live[addr] = weakref.ref(m)
        del view
    assert addr in live
    assert not rt.pointerGetAttributes(addr).type  # not page-locked before the first draw
    for _ in range(3):
        d = sel.draw(16, 1, "pad_tail", np.random.default_rng(0), s.capacity, True, state_find(sel))
        assert d is not None
    regs = [c for c in calls if c[0] == "register"]
    assert regs == [("register", addr, nbytes, 0x01 | 0x02 | 0x08)]  # once, portable, mapped, read-only
    assert rt.pointerGetAttributes(addr).type == rt.memoryTypeHost
    del sel, sh, d
    gc.collect()
    assert ("unregister", addr, True) in calls, calls
    assert not rt.pointerGetAttributes(addr).type
    assert live[addr]() is None  # and the mapping is gone now


def test_a_pinned_tables_reader_draws_on_its_gpu_the_host_tables_batches(emu, emu_cluster):
    """A pinned DistributedTable whose shards publish their state on this host: this process draws its
    batches itself, descending the trees with its (emulated) GPU, and gets what a host-tier table drew
    from the same inserts and seed."""
    spec = gf.TableSpec((gf.ColumnSpec("obs", (3,), np.float32), gf.ColumnSpec("a", (), np.int64)), capacity=120,
                        num_shards=2)  # fmt: skip
    rng = np.random.default_rng(2)
    cfg = {"gear-flow.distributed.shared-memory": True, "gear-flow.distributed.reader-draw": True}
    with dask.config.set(cfg):
        host = gf.DistributedTable.create(emu_cluster, spec, sampler=gf.Prioritized(0.8, 0.5), seed=7)
        gpu = gf.DistributedTable.create(emu_cluster, spec, sampler=gf.Prioritized(0.8, 0.5), tier="pinned", seed=7)
    try:
        before = finds()
        for i, lengths in enumerate(([9, 14, 5], [30, 7], [11, 16, 8, 21])):  # both rings wrap (120 steps)
            eps = [{"obs": rng.random((n, 3), dtype=np.float32), "a": 1000 * (10 * i + k) + np.arange(n)}
                   for k, n in enumerate(lengths)]  # fmt: skip
            pr = [np.full(n, 0.5 + k) for k, n in enumerate(lengths)]
            host.insert(eps, priorities=pr)
            gpu.insert(eps, priorities=pr)
            for boundary in ("strict", "pad_tail", "pad_head"):
                a, b = host.sample(12, 5, boundary=boundary), gpu.sample(12, 5, boundary=boundary)
                for f in ("keys", "probabilities", "weights", "mask", "episode_ids", "timesteps"):
                    assert np.array_equal(getattr(a, f).numpy(), getattr(b, f).cpu().numpy()), (i, boundary, f)
                for c in spec.names:
                    assert np.array_equal(a[c].numpy(), b[c].cpu().numpy()), (i, boundary, c)
                p = np.linspace(0.5, 2.0, 12)
                host.update_priorities(a.keys.numpy(), p)
                gpu.update_priorities(b.keys.numpy(), p)
        assert gpu.stats["reader_draws"] > 0 and host.stats["reader_draws"] > 0, (gpu.stats, host.stats)
        assert finds() > before  # the pinned table's reader descended its trees on the GPU
    finally:  # close() drops the mappings now, while this process is emulated (their finalizers unregister)
        host.close()
        gpu.close()


def test_an_owner_whose_index_grew_unlocks_and_unlinks_the_old_index(owner, emu):
    """The episode index of a pinned shard grows into a new segment: the old one is unregistered (its pages
    are not left locked under a mapping that goes with the array) and unlinked; the new one is registered."""
    from gear_flow.storage.shared import SHM_DIR

    s = owner()
    insert(s, [(1, 2)])
    old = s.index.block
    old_ptr, old_name = int(old.ctypes.data), s.shared_layout()["selection"]["index"]["segment"]
    assert emu.cuda.runtime.pointerGetAttributes(old_ptr).type == emu.cuda.runtime.memoryTypeHost
    insert(s, [(k, 1) for k in range(2, 100)], stamp=2)  # past the index's records: it grows
    new = s.index.block
    assert new is not old
    assert emu.cuda.runtime.pointerGetAttributes(old_ptr).type == emu.cuda.runtime.memoryTypeUnregistered
    assert not os.path.exists(os.path.join(SHM_DIR, old_name))
    assert emu.cuda.runtime.pointerGetAttributes(int(new.ctypes.data)).type == emu.cuda.runtime.memoryTypeHost
    sh = Attached(s.shared_layout(), s.shard_id)  # a reader maps the grown state and draws from it
    d = sh.selection.draw(8, 1, "pad_tail", np.random.default_rng(0), s.capacity, True)
    assert d is not None and set(d.windows.episode_ids.tolist()) <= set(range(1, 100))
