"""Selection on the ``device`` tier under the CUDA emulation (cases: tests/selection_cases.py).

The kernels run as host C++ (tests/cuda_emu) behind a stand-in for CuPy, so a
``device``-tier table here selects with the same kernel code and the same
wrappers as on a GPU.  Besides the parity cases, this module checks what a
batch moves between host and device: the uniforms up, the drawn slots down,
a priority update as one upload, never a whole tree.
"""

from __future__ import annotations

import cuda_emu
import numpy as np
import pytest
from cuda_emu import fixtures
from parity_cases import Dev
from selection_cases import (  # noqa: F401  collected by pytest from this module
    _episodes,
    _spec,
    test_device_shard_removers_match_host,
    test_device_tier_checkpoint_round_trip_keeps_the_samples,
    test_device_tier_heaps_with_many_ties_match_host,
    test_device_tier_matches_host_with_max_times_sampled_and_epochs,
    test_device_tier_table_matches_host_tier,
)

pytestmark = pytest.mark.skipif(cuda_emu.compiler() is None, reason="no C++ compiler for the CUDA emulation")


emulated = fixtures.emulated  # the fixture: cupy is the emulation's in these tests


@pytest.fixture
def dev(emulated):
    return Dev(emulated, max_n=200_000, cuda_tensors=False)


def test_selection_ops_dispatch(dev):
    """One dispatch point: numba twins for the host-memory tiers, the kernels' wrappers for device."""
    from gear_flow import backend

    for tier in ("host", "shared", "pinned"):
        ops = backend.selection_ops(tier)
        assert not ops.on_device
        assert (ops.sumtree.__name__, ops.maxtree.__name__) == ("gear_flow.ops.sumtree", "gear_flow.ops.maxtree")
    ops = backend.selection_ops("device")
    assert ops.on_device
    assert (ops.sumtree.__name__, ops.maxtree.__name__) == ("gear_flow.gpu.ops.sumtree", "gear_flow.gpu.ops.maxtree")


def test_selection_ops_device_without_gpu_names_the_tier(monkeypatch):
    from gear_flow import backend

    monkeypatch.setattr(backend, "_cupy_status", lambda: "cupy sees no CUDA device")
    with pytest.raises(backend.BackendUnavailableError, match="selection on storage tier 'device'"):
        backend.selection_ops("device")
    assert backend.selection_ops("host").on_device is False


class _Traffic:
    """Counts explicit host<->device copies of the stand-in CuPy (uploads: asarray of a host array and
    ndarray.set; downloads: ndarray.get)."""

    def __init__(self, monkeypatch, fake):
        self.up: list[int] = []
        self.down: list[int] = []
        self.root: list[int] = []  # bytes of asynchronous copies (the root's, queued after a change)
        real_asarray, real_get, real_set = fake.asarray, fake.ndarray.get, fake.ndarray.set

        def asarray(a, *args, **kw):
            if not isinstance(a, fake.ndarray):
                self.up.append(int(np.asarray(a).size))
            return real_asarray(a, *args, **kw)

        def get(arr, *a, **k):
            self.down.append(int(arr.size))
            return real_get(arr, *a, **k)

        def set_(arr, host, *a, **k):
            self.up.append(int(np.asarray(host).size))
            return real_set(arr, host, *a, **k)

        real_memcpy = fake.cuda.runtime.memcpyAsync

        def memcpy(dst, src, size, kind, stream):
            self.root.append(int(size))
            return real_memcpy(dst, src, size, kind, stream)

        monkeypatch.setattr(fake.cuda.runtime, "memcpyAsync", memcpy)
        monkeypatch.setattr(fake, "asarray", asarray)
        monkeypatch.setattr(fake.ndarray, "set", set_)
        monkeypatch.setattr(fake.ndarray, "get", get)

    def clear(self):
        self.up.clear()
        self.down.clear()
        self.root.clear()


def test_device_batch_moves_uniforms_up_and_slots_down_only(dev, monkeypatch):
    """A prioritized batch of B from one device shard: B uniforms up, B slots down, the window geometry up
    once (the tier's one upload of 3 x B, with the column descriptors); an update of B priorities is one upload of 2 x B, no download,
    and queues the new root's 8-byte copy (which the next batch's mass then reads without a round trip).
    Never the tree (2 x P entries) either way."""
    from cuda_emu import fake_cupy

    from gear_flow import LocalTable, Prioritized

    spec = _spec("step", capacity=4096, num_shards=1)
    t = LocalTable(spec, sampler=Prioritized(0.6, 0.4), tier="device", seed=0, boundary="pad_tail")
    rng = np.random.default_rng(0)
    t.insert(_episodes(rng, 100, 20, 40))
    P = t.shards[0].sampler.tree.shape[0] // 2
    traffic = _Traffic(monkeypatch, fake_cupy)
    B = 64
    for _ in range(3):
        traffic.clear()
        b = t.sample(B, 1, columns=["obs"])
        assert traffic.down == [B], traffic.down  # the drawn slots; the root came with the last change
        # uniforms; window geometry with the fused gather's descriptors (6 int64 per column), one upload
        assert sorted(traffic.up) == [B, 3 * B + 6], traffic.up
        assert max(traffic.up) < P and traffic.root == []
        traffic.clear()
        t.update_priorities(b.keys.cpu().numpy(), rng.random(B) + 0.1)
        assert traffic.down == [] and traffic.up == [2 * B], (traffic.up, traffic.down)
        assert traffic.root == [8]  # the new root's copy, queued behind the update


def test_device_heap_candidates_copy_back_only_the_winners(dev, monkeypatch):
    from cuda_emu import fake_cupy

    from gear_flow import LocalTable, MaxHeap

    spec = _spec("step", capacity=2048, num_shards=1)
    t = LocalTable(spec, sampler=MaxHeap(), tier="device", seed=0)
    rng = np.random.default_rng(1)
    eps = _episodes(rng, 40, 20, 40)
    n = sum(len(e["done"]) for e in eps)
    t.insert(eps, priorities=rng.random(n))
    P = t.shards[0].sampler.tree.shape[0] // 2
    traffic = _Traffic(monkeypatch, fake_cupy)
    b = t.sample(16, 1, columns=["obs"])
    # k + 1 indices and values in one buffer (one more than the batch: whether its cut falls in a tie)
    assert max(traffic.down) <= 2 * (16 + 1) < P, traffic.down
    pr = b.priorities.cpu().numpy()
    assert np.all(np.diff(pr) <= 0)  # best first


def test_device_selectors_launch_the_kernels(dev):
    """The device tier's selection really runs the kernels: each operation appears in the launch log."""
    from gear_flow import LocalTable, MaxHeap, Prioritized, WithoutReplacement

    rng = np.random.default_rng(2)
    eps = _episodes(rng, 10)
    seen = set()
    for sampler, L, boundary in (
        (Prioritized(), 4, "strict"),
        (WithoutReplacement(), 1, "pad_tail"),
        (MaxHeap(), 1, "pad_tail"),
    ):
        t = LocalTable(_spec("step"), sampler=sampler, tier="device", seed=0, boundary=boundary)
        t.insert(eps)
        cuda_emu.EmuKernel.log.clear()
        b = t.sample(8, L)
        t.update_priorities(b.keys.cpu().numpy(), np.arange(8) + 1.0)
        seen |= {e[1].split("<")[0] for e in cuda_emu.EmuKernel.log}
    for k in ("tree_sample", "tree_update_block", "tree_ring_tail_parts", "topk_histogram", "gather_columns"):
        assert any(s.startswith(k) for s in seen), (k, sorted(seen))


def test_device_tree_orders_its_operations_across_streams(dev):
    """An update issued on one stream and a draw on another: the draw's stream waits for the event the
    update recorded (a learner samples on its torch stream and may update on another).

    The tree's own view of CuPy gets recording streams and events; the kernels and copies keep the
    emulation's."""
    from types import SimpleNamespace

    from cuda_emu import fake_cupy

    from gear_flow import backend
    from gear_flow.selectors.trees import SumTree

    log = []

    class Stream:
        ptr = 0

        def __init__(self, name):
            self.name = name

        def wait_event(self, event):
            log.append((self.name, "wait", event.n))

    class Event:
        count = 0

        def __init__(self, **kw):
            self.n = None

        def record(self, stream=None):
            Event.count += 1
            self.n = Event.count
            log.append((stream.name, "record", self.n))

    current = [Stream("a")]
    t = SumTree(backend.selection_ops("device"), 64)
    cuda = SimpleNamespace(**vars(fake_cupy.cuda))
    cuda.get_current_stream, cuda.Event = (lambda: current[0]), Event
    t._cp = SimpleNamespace(cuda=cuda, asarray=fake_cupy.asarray, empty=fake_cupy.empty)
    t._fence = None  # the allocation's, recorded with the emulation's event
    t.set(np.arange(10), np.arange(10) + 1.0)
    assert log == [("a", "record", 1), ("a", "record", 2)], log  # the root's copy, then the fence
    current[0] = Stream("b")
    log.clear()
    assert t.draw(np.array([0.0, 0.999])).tolist() == [0, 9]
    assert log == [("b", "wait", 2), ("b", "record", 3)], log
