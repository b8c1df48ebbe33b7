"""A shard's selection state as a reader on its host maps it: the reader's draw is the owner's (same items
possible, same probabilities, same windows), a change by the owner during a draw is seen, and the index's
growth is told. Owner and reader here are one process (the segments are mapped by name as another process
maps them); the processes of a cluster are tested in test_dist_reader_draw."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import COLUMNS, chi2_critical, episode

from gear_flow.ops.gather import gather_windows
from gear_flow.selectors import Fifo, Prioritized, Uniform, WithoutReplacement
from gear_flow.shard import EpisodeBatch, Shard
from gear_flow.spec import TableSpec
from gear_flow.storage.shared import Attached
from gear_flow.storage.shared_selection import shareable


def shard(sampler=None, capacity=64, item_unit="step", **kw):
    spec = TableSpec(COLUMNS, capacity=capacity, item_unit=item_unit)
    return Shard(spec, 3, sampler or Prioritized(alpha=1.0), Fifo(), tier="shared", **kw)


def insert(s, tags_lengths, prio=None, stamp=0):
    eps = [episode(tag, n) for tag, n in tags_lengths]
    lengths = np.array([n for _, n in tags_lengths])
    ids = np.array([tag for tag, _ in tags_lengths])
    p = None if prio is None else np.asarray(prio, dtype=np.float64)
    return s.insert(EpisodeBatch(eps, lengths, ids, stamp + np.concatenate(([0], np.cumsum(lengths)[:-1])), p))


def mapped(s):
    sh = Attached(s.shared_layout(), s.shard_id)
    assert sh.selection is not None
    return sh


def test_only_draws_that_change_nothing_are_shared():
    assert shareable(shard(Uniform())) and shareable(shard(Prioritized()))
    assert not shareable(shard(WithoutReplacement()))
    assert not shareable(shard(max_times_sampled=2))
    assert Shard(TableSpec(COLUMNS, capacity=8), 0, Uniform(), Fifo()).published is None  # host tier: not shared


@pytest.mark.parametrize("item_unit", ["step", "episode"])
@pytest.mark.parametrize("boundary", ["strict", "pad_tail", "pad_head"])
def test_the_readers_draw_is_the_owners(item_unit, boundary):
    s = shard(item_unit=item_unit)
    n_items = 29 if item_unit == "step" else 4
    insert(s, [(1, 5), (2, 9), (3, 3), (4, 12)], prio=np.arange(1, n_items + 1, dtype=float))
    insert(s, [(5, 30), (6, 20)], stamp=29)  # the 64-step ring wraps: the oldest episodes are evicted
    L = 4
    s.valid_mass(L, boundary)  # the owner's first sample of this length publishes its tail mass
    sel = mapped(s).selection
    rng = np.random.default_rng(0)
    d = sel.draw(4000, L, boundary, rng, s.capacity, item_unit == "step")
    assert d is not None and sel.unchanged(d.version)
    assert d.mass == pytest.approx(s.valid_mass(L, boundary), rel=1e-12)
    w = d.windows
    slots = w.slots
    assert np.array_equal(d.probs, s.sampler.leaf_weights(slots) / d.mass)
    assert np.array_equal(d.priorities, s.priority[slots])
    valid = s.valid_fn(L, boundary)
    assert valid is None or valid(slots).all()  # only windows that fit
    own = s.windows(slots, L, boundary, np.random.default_rng(1))
    for f in ("src_start", "dst_offset", "n_valid", "episode_ids", "seqs") + (
        ("timesteps", "src_abs") if item_unit == "step" else ()
    ):  # an episode item's window position is drawn: the owner's draws its own
        if item_unit == "step" or f in ("episode_ids", "seqs"):
            assert np.array_equal(getattr(w, f), getattr(own, f)), f
    check_gathered(mapped(s), d, L)
    # the draw follows w_i / m: chi-square over the items drawn
    uniq, counts = np.unique(slots, return_counts=True)
    p = s.sampler.leaf_weights(uniq) / d.mass
    assert p.sum() == pytest.approx(1.0)
    chi2 = float((((counts - len(slots) * p) ** 2) / (len(slots) * p)).sum())
    assert chi2 < chi2_critical(len(uniq) - 1), chi2


def test_an_owners_change_during_a_draw_is_seen_and_nothing_is_left_odd():
    s = shard(Uniform())
    insert(s, [(1, 10), (2, 10)])
    sel = mapped(s).selection
    d = sel.draw(8, 1, "pad_tail", np.random.default_rng(0), s.capacity, True)
    assert d is not None and sel.unchanged(d.version)
    s.update_priorities(np.array([0]), np.array([2.0]))  # the owner writes after the reader read
    assert not sel.unchanged(d.version) and sel.version() % 2 == 0
    with s.lock, s.writing():  # while the owner writes, the reader leaves the draw to the owner
        assert sel.version() % 2 == 1
        assert sel.draw(8, 1, "pad_tail", np.random.default_rng(0), s.capacity, True) is None
    with pytest.raises(RuntimeError), s.lock, s.writing():  # a change that fails still ends the write
        raise RuntimeError
    assert sel.version() % 2 == 0
    assert sel.draw(8, 1, "pad_tail", np.random.default_rng(0), s.capacity, True) is not None


def test_an_unpublished_tail_length_and_no_weight_leave_the_draw_to_the_owner():
    s = shard()
    insert(s, [(1, 6)], prio=np.ones(6))
    sel = mapped(s).selection
    assert sel.draw(4, 3, "strict", np.random.default_rng(0), s.capacity, True) is None  # not published
    s.valid_mass(3, "strict")  # the owner's first sample of that length publishes it
    assert sel.tail(3) == pytest.approx(2.0)  # the last two steps' windows do not fit
    assert sel.draw(4, 3, "strict", np.random.default_rng(0), s.capacity, True) is not None
    s.update_priorities(np.arange(6), np.zeros(6))
    assert sel.draw(4, 3, "strict", np.random.default_rng(0), s.capacity, True) is None  # no weight: the owner's


def test_a_grown_index_is_told_and_mapped_again():
    s = shard(Uniform(), capacity=4096)
    insert(s, [(1, 2)])
    sh = mapped(s)
    first = sh.selection.generation
    insert(s, [(k, 2) for k in range(2, 200)], stamp=2)  # past the index's 64 records: it doubles
    assert sh.selection.regrown()
    assert sh.selection.draw(4, 1, "pad_tail", np.random.default_rng(0), s.capacity, True) is None
    sh = mapped(s)
    again = sh.selection
    assert again.generation > first and not again.regrown()
    s.valid_mass(2, "strict")
    d = again.draw(256, 2, "strict", np.random.default_rng(0), s.capacity, True)
    assert d is not None and set(d.windows.episode_ids.tolist()) <= set(range(1, 200))
    check_gathered(sh, d, 2)


def test_a_layout_asked_while_the_index_grows_names_live_segments():
    """A reader asked for the layout (a worker's ``shared_layout``, on its own thread) while a write was
    publishing a grown index: the old block was freed, its name dropped, before the new block took its place,
    and the layout named the freed block: ``KeyError`` (a stress hunt saw it as a sample failing right after
    a retirement).  The layout is now read under the shard's lock, which the write holds as it publishes."""
    import threading

    s = shard(Uniform(), capacity=4096)
    insert(s, [(1, 2)])
    free, got = s.tier.free, []

    def ask():
        try:
            got.append(s.shared_layout())
        except Exception as e:  # noqa: BLE001 - what the reader's request would have raised
            got.append(e)

    def freeing(a):  # the old index block freed, inside the write's publication: a reader asks right then
        free(a)
        asker = threading.Thread(target=ask)
        asker.start()
        asker.join(0.5)  # (it waits for the shard's lock now: the write goes on once this returns)
        threads.append(asker)

    threads: list = []
    s.tier.free = freeing
    insert(s, [(k, 2) for k in range(2, 200)], stamp=2)  # past the index's 64 records: it grows, the old goes
    s.tier.free = free
    assert threads
    for t in threads:
        t.join(10)
    assert got and not any(isinstance(g, BaseException) for g in got), got
    sh = Attached(got[-1], s.shard_id)  # the layout the reader got maps the grown index
    assert not sh.selection.regrown()
    assert sh.selection.draw(4, 1, "pad_tail", np.random.default_rng(0), s.capacity, True) is not None


def check_gathered(sh, d, L):
    """The windows a reader placed, gathered from the mapped rings, hold their episodes' steps."""
    w = d.windows
    out = np.zeros((len(w.slots), L, 8), np.uint8)
    gather_windows(sh.bytes["ep"], w.src_start, w.dst_offset, w.n_valid, out)
    got = out.view(np.int64)[..., 0]
    t = np.zeros((len(w.slots), L, 4), np.uint8)
    gather_windows(sh.bytes["t"], w.src_start, w.dst_offset, w.n_valid, t)
    for b in range(len(w.slots)):
        o, n = int(w.dst_offset[b]), int(w.n_valid[b])
        assert (got[b, o : o + n] == w.episode_ids[b]).all()
        assert t.view(np.int32)[b, o : o + n, 0].tolist() == list(range(w.timesteps[b], w.timesteps[b] + n))
