"""Large gather outputs reused (:mod:`gear_flow.storage.reuse`): never while anything still holds them."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from gear_flow.storage.reuse import MIN_BYTES, PER_SHAPE, Reuse

SHAPE = (4, MIN_BYTES // 4)


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_buffer_is_handed_out_again_only_once_nothing_holds_it():
    pool = Reuse()
    a = pool.empty(SHAPE, np.uint8)
    addr = _addr(a)
    holders = [
        lambda a: a[1:],  # a view
        lambda a: memoryview(a),  # a memoryview (what the comm and the lane send from)
        lambda a: pickle.dumps(a, protocol=5, buffer_callback=[].append) and pickle.PickleBuffer(a),
        lambda a: torch.from_numpy(a),  # a batch tensor
        lambda a: np.frombuffer(a, np.uint8),
        lambda a: {"data": {"x": a}},  # a reply not sent yet
    ]
    for hold in holders:
        h = hold(a)
        del a
        b = pool.empty(SHAPE, np.uint8)
        assert _addr(b) != addr, hold  # still held: a new buffer
        del b, h
        a = pool.empty(SHAPE, np.uint8)
        assert _addr(a) == addr, hold  # nothing holds it any more: the same memory again


def test_small_buffers_are_not_kept_and_the_pool_is_bounded():
    pool = Reuse()
    small = pool.empty((16,), np.uint8)
    assert not pool._kept and small.shape == (16,)
    held = [pool.empty(SHAPE, np.uint8) for _ in range(PER_SHAPE + 3)]
    assert len({_addr(a) for a in held}) == PER_SHAPE + 3  # all in use: all distinct
    assert sum(map(len, pool._kept.values())) == PER_SHAPE
    del held
    again = {_addr(pool.empty(SHAPE, np.uint8)) for _ in range(3)}
    assert len(again) == 1  # the first kept one, free again after each call returned and was dropped


def test_shapes_of_one_size_class_share_buffers_viewed_as_asked():
    pool = Reuse()
    a = pool.empty((100, 3, MIN_BYTES // 300), np.float32)
    addr = _addr(a)
    a[...] = 1.5
    del a
    b = pool.empty((97, 3 * MIN_BYTES // 97), np.uint8)  # another part's rows: the same class (4 MB), memory
    assert _addr(b) == addr and b.shape == (97, 3 * MIN_BYTES // 97) and b.dtype == np.uint8 and b.flags.c_contiguous
