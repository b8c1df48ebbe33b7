"""A Stream over a ``disk`` table: batches that do not depend on the prefetch depth, readahead or the page cache,
the learner's wait per batch, and device staging (one page-locked buffer, one host-to-device copy).

Real tables on real files under ``tmp_path``; every stream of a comparison gets its own table holding the same
episodes, so that counts kept by the table (``times_sampled``) are compared too.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from helpers import episode, make_spec

import gear_flow as gf
from gear_flow.backend import BackendUnavailableError
from gear_flow.errors import EmptyTableError, SpecError
from gear_flow.storage.disk import resident_bytes
from gear_flow.stream import _Staged

FIELDS = ("keys", "probabilities", "weights", "mask", "episode_ids", "timesteps", "priorities", "times_sampled")


def _episodes() -> tuple[list, np.ndarray]:
    """More steps than the rings hold (evictions, windows that wrap), with distinct priorities."""
    rng = np.random.default_rng(0)
    eps = [episode(tag, int(n)) for tag, n in enumerate(rng.integers(9, 21, 40), start=1)]
    return eps, rng.random(sum(len(e["t"]) for e in eps)) + 0.1


def _table(tmp_path, kind: str, name: str, sampler=None) -> gf.LocalTable:
    spec = make_spec(capacity=256, num_shards=2)
    kw = dict(sampler=gf.Prioritized(0.8, 0.5) if sampler is None else sampler, seed=3)
    t = gf.LocalTable(spec, **kw) if kind == "host" else gf.LocalTable(spec, tier="disk", path=tmp_path / name, **kw)
    eps, pr = _episodes()
    at = 0
    for k in range(0, len(eps), 10):  # an insert may not put more than a ring's capacity on a shard
        n = sum(len(e["t"]) for e in eps[k : k + 10])
        t.insert(eps[k : k + 10], priorities=pr[at : at + n])
        at += n
    if kind == "disk":
        t.flush()
    return t


def _collect(stream: gf.Stream) -> list[dict]:
    """Every batch, in order, as plain lists (a stream's batches alias buffers it reuses)."""
    out = []
    with stream:
        for b in stream:
            row = {f: np.asarray(getattr(b, f)).tolist() for f in FIELDS}
            row.update({name: np.asarray(t).tolist() for name, t in b.data.items()})
            out.append(row)
    return out


def _stream(table, **kw) -> gf.Stream:
    return gf.Stream(table, 16, 5, boundary="pad_tail", num_batches=10, seed=11, **kw)


def test_prefetch_depth_readahead_and_the_tier_change_no_batch(tmp_path):
    """Prefetch 4 over a disk table yields prefetch 1's batches in order, as the host table does, readahead on or off."""
    ref = _collect(_stream(_table(tmp_path, "disk", "a"), prefetch=1))
    assert len(ref) == 10 and len({tuple(b["keys"]) for b in ref}) == 10
    assert any(not all(m) for b in ref for m in b["mask"])  # padded windows: the mask is compared too
    assert len({w for b in ref for w in b["weights"]}) > 1  # prioritized: weights are not all one
    assert _collect(_stream(_table(tmp_path, "disk", "b"), prefetch=4)) == ref
    assert _collect(_stream(_table(tmp_path, "disk", "c"), prefetch=4, readahead=False)) == ref
    assert _collect(_stream(_table(tmp_path, "host", ""), prefetch=4)) == ref


def test_requests_enter_the_table_in_order_whatever_the_depth(tmp_path):
    """Without replacement each sample takes items out of the epoch: the batches depend on the order the
    requests reach the table, which is the order they were made."""

    def batches(name: str, depth: int) -> list[dict]:
        t = _table(tmp_path, "disk", name, gf.WithoutReplacement())
        return _collect(gf.Stream(t, 8, 2, prefetch=depth, num_batches=40, seed=11))

    ref = batches("a", 1)
    for k, depth in enumerate((3, 8)):
        assert batches(f"b{k}", depth) == ref


def test_cold_pages_are_advised_and_yield_the_same_batches(tmp_path):
    warm = _collect(_stream(_table(tmp_path, "disk", "a"), prefetch=4))
    t = _table(tmp_path, "disk", "b")
    rings = [a for s in t.shards for name, a in s.tier.arrays.items() if name.startswith("ring-")]
    for s in t.shards:
        s.tier.drop_cache()
    if sum(resident_bytes(a) or 0 for a in rings) > 0:
        pytest.skip("this filesystem keeps its pages in memory (tmpfs): nothing to read ahead")
    assert _collect(_stream(t, prefetch=4)) == warm  # drawn from pages read from the files
    assert sum(s.tier.advised for s in t.shards) > 0

    # the pages are cached now: a stream's probe finds them and advises nothing; a plain sample never advises
    for a in rings:
        a.sum()
    before = [s.tier.advised for s in t.shards]
    list(gf.Stream(t, 16, 5, prefetch=2, num_batches=4))
    t.sample(16, 5)
    assert [s.tier.advised for s in t.shards] == before
    for s in t.shards:
        s.tier.drop_cache()
    list(gf.Stream(t, 16, 5, prefetch=2, num_batches=2, readahead=False))
    t.sample(16, 5)  # cold, outside a stream: no advice either
    assert [s.tier.advised for s in t.shards] == before


def test_stats_report_one_wait_per_batch(tmp_path):
    t = _table(tmp_path, "disk", "a")
    stream = gf.Stream(t, 8, 3, prefetch=3, num_batches=7, seed=1)
    st = stream.stats()
    assert st["batches"] == 0 and st["wait_s"] == 0.0 and np.isnan(st["wait_p99_s"]) and np.isnan(st["wait_last_s"])
    assert sum(1 for _ in stream) == 7
    w = stream.wait_times()
    st = stream.stats()
    assert st["batches"] == len(w) == 7 and (w >= 0).all()
    assert st["wait_s"] == pytest.approx(w.sum()) and st["wait_mean_s"] == pytest.approx(w.mean())
    assert st["wait_last_s"] == w[-1] and st["wait_max_s"] == w.max()
    assert st["wait_p50_s"] <= st["wait_p99_s"] <= st["wait_max_s"]
    assert sum(1 for _ in stream) == 7  # a second pass adds its batches
    assert stream.stats()["batches"] == len(stream.wait_times()) == 14


def test_a_wait_is_the_time_the_learner_blocked(tmp_path):
    """The first batch can only be drawn once an insert arrives, 0.3 s after the learner asked: its wait says so,
    and a batch already prefetched while the learner worked costs it (almost) nothing."""
    spec = make_spec(capacity=64)
    t = gf.LocalTable(spec, tier="disk", path=tmp_path / "t", rate_limiter=gf.MinSize(20), seed=0)
    t.insert(episode(1, 10))
    threading.Timer(0.3, lambda: t.insert(episode(2, 10))).start()
    with gf.Stream(t, 4, 2, prefetch=2, num_batches=2, seed=0) as stream:
        it = iter(stream)
        next(it)
        time.sleep(0.3)  # the learner's step: the second request completes meanwhile
        next(it)
    first, second = stream.wait_times()
    assert first >= 0.25
    assert second < 0.1


def test_leaving_early_or_a_failing_request_stops_every_request(tmp_path):
    """Requests wait for their turn: closing the stream, or a request that raised, releases the ones behind it."""
    t = _table(tmp_path, "disk", "a")
    with gf.Stream(t, 8, 2, prefetch=4) as stream:  # endless
        for i, _ in enumerate(stream):
            if i == 2:
                break
    with pytest.raises(EmptyTableError):  # no episode holds a strict window of a whole shard's 256 steps
        next(iter(gf.Stream(t, 8, 256, boundary="strict", prefetch=4, num_batches=6)))
    time.sleep(0.05)
    assert [th.name for th in threading.enumerate() if th.name.startswith("gear-flow-stream")] == []


def test_bad_arguments_get_one_line_errors(tmp_path):
    t = _table(tmp_path, "disk", "a")
    for kw, what in [
        (dict(readahead="yes"), "readahead ('yes')"),
        (dict(device="mps"), "must be a CUDA device"),
        (dict(device="no-such-device"), "is not a torch device"),
        (dict(prefetch=0), "prefetch (0)"),
    ]:
        with pytest.raises(SpecError, match=r"^[^\n]*$") as e:
            gf.Stream(t, 4, **kw)
        assert what in str(e.value)
    assert gf.Stream(t, 4, device="cpu").device is None  # host batches, as without device
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError, match=r"^[^\n]*CUDA[^\n]*$"):
            gf.Stream(t, 4, device="cuda:0")


def test_one_staging_buffer_holds_the_columns_mask_and_weights(tmp_path):
    """The staging slot's host buffer is what the table gathers into; its copy, viewed as the device batch,
    is the batch (here the "device" is the CPU: the layout and the views, without a GPU)."""
    t = _table(tmp_path, "disk", "a")
    slot = _Staged(t.spec, ("obs", "t", "done"), 16, 5, torch.device("cpu"))
    got = t.sample(
        16, 5, columns=("obs", "t", "done"), boundary="pad_tail", out=slot.buffers, rng=np.random.default_rng(4)
    )
    raw = slot.host.numpy()
    for a in (*slot.buffers.bytes.values(), slot.buffers.mask, slot.buffers.weights):
        assert np.shares_memory(a, raw)
    slot.dev.copy_(slot.host)  # the one copy (host to device on a GPU)
    dev = slot.device_batch(got)
    ref = _table(tmp_path, "disk", "b").sample(
        16, 5, columns=("obs", "t", "done"), boundary="pad_tail", rng=np.random.default_rng(4)
    )
    for name in ("obs", "t", "done"):
        assert dev[name].dtype == ref[name].dtype and torch.equal(dev[name], ref[name])
        assert dev[name].untyped_storage().data_ptr() == slot.dev.untyped_storage().data_ptr()
    assert torch.equal(dev.mask, ref.mask) and not bool(ref.mask.all())
    assert torch.equal(dev.weights, ref.weights) and torch.equal(dev.keys, ref.keys)


@pytest.mark.gpu
def test_device_batches_are_the_host_batches(tmp_path):
    """``device="cuda"``: columns, mask and weights on the GPU, one copy each, the batches those of a host stream;
    the learner's work on a batch (on its own stream) sees the batch's bytes."""
    torch_ = pytest.importorskip("torch")
    if not torch_.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    ref = _collect(_stream(_table(tmp_path, "disk", "a"), prefetch=3))
    stream = _stream(_table(tmp_path, "disk", "b"), prefetch=3, device="cuda:0")
    sums, got = [], []
    with stream:
        for b in stream:
            assert b["obs"].is_cuda and b.mask.is_cuda and b.weights.is_cuda and not b.keys.is_cuda
            sums.append(b["obs"].double().sum())  # queued on the learner's stream, after the batch's copy
            got.append({f: torch_.as_tensor(getattr(b, f)).cpu().tolist() for f in FIELDS})
            got[-1].update({name: t.cpu().tolist() for name, t in b.data.items()})
    assert got == ref
    assert [float(s) for s in sums] == pytest.approx([float(np.sum(r["obs"], dtype=np.float64)) for r in ref])
    assert stream.stats()["batches"] == 10
