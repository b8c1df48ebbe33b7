"""Message bodies: one pickle for the small parts, large and device arrays as Dask frames."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from distributed.protocol import Serialized, serialize

from gear_flow.distributed import wire


class DeviceLike:
    """Anything exposing ``__cuda_array_interface__`` travels as a frame (Dask's cuda serializer moves it)."""

    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}

    def __reduce__(self):
        raise AssertionError("a device array must never be pickled into the message")


def frames_of(msg):
    return [] if msg["frames"] is None else msg["frames"].data


def test_small_parts_inline_large_arrays_as_frames_without_copies():
    big = np.arange(wire.INLINE_MAX // 8, dtype=np.int64)  # exactly INLINE_MAX bytes: a frame
    small = np.arange(wire.INLINE_MAX // 8 - 1, dtype=np.int64)
    body = {0: {"seqs": small, "p": np.float64(0.5), "data": {"obs": big}}, "txn": "abc", "n": 3, "cols": ("a", "b")}
    msg = wire.encode(body)
    fr = frames_of(msg)
    assert len(fr) == 1 and fr[0] is big
    out = wire.decode(msg["packed"], fr)
    assert out[0]["data"]["obs"] is big  # the received frame is the array
    assert np.array_equal(out[0]["seqs"], small) and out[0]["seqs"] is not small
    assert out["txn"] == "abc" and out["n"] == 3 and out["cols"] == ("a", "b") and out[0]["p"] == 0.5
    assert wire.encode({"a": 1})["frames"] is None  # nothing large: no frames at all


def test_device_arrays_are_frames_and_order_is_kept():
    d1, d2 = DeviceLike(), DeviceLike()
    msg = wire.encode({"x": [d1, np.zeros(wire.INLINE_MAX, np.uint8), d2]})
    fr = frames_of(msg)
    assert fr[0] is d1 and fr[2] is d2 and len(fr) == 3
    out = wire.decode(msg["packed"], fr)
    assert out["x"][0] is d1 and out["x"][2] is d2


def test_frames_still_serialized_as_the_scheduler_receives_them():
    a = np.arange(wire.INLINE_MAX, dtype=np.uint8)
    msg = wire.encode({"a": a})
    header, frames = serialize(frames_of(msg), serializers=("dask", "pickle"))
    out = wire.decode(msg["packed"], Serialized(header, frames))
    assert np.array_equal(out["a"], a)


def test_bad_packed_messages_raise_and_leave_no_state():
    msg = wire.encode({"a": np.zeros(wire.INLINE_MAX, np.uint8)})
    with pytest.raises(pickle.UnpicklingError, match="frame reference 0 out of range"):
        wire.decode(msg["packed"], [])
    with pytest.raises(TypeError, match="needs bytes and a list of frames"):
        wire.decode("text", [])
    with pytest.raises(TypeError, match="needs bytes and a list of frames"):
        wire.decode(msg["packed"], 5)
    assert wire.decode(wire.encode({"b": 1})["packed"]) == {"b": 1}  # no frames left over from the failures
    with pytest.raises(pickle.UnpicklingError, match="out of range"):
        wire._frame(0)  # outside a decode


def test_replies_packed_or_plain():
    assert wire.result(wire.ok({"k": [1, 2]})) == {"k": [1, 2]}
    assert wire.result({"status": "OK", "result": 7}) == 7
    header, frames = serialize({"k": 1}, serializers=("pickle",))
    assert wire.result({"status": "OK", "result": Serialized(header, frames)}) == {"k": 1}


def test_an_error_reply_still_serialized_as_the_scheduler_receives_it_raises_with_its_own_type():
    """A worker's error reply reaches the coordinator with its exception still serialized (the scheduler's comm
    keeps it as it came): raised with its own type and message, not as a GearFlowError naming the wrapper."""
    from gear_flow.errors import GearFlowError, SpecError

    header, frames = serialize(SpecError("table 't' is being moved already"), serializers=("pickle",))
    with pytest.raises(SpecError, match="is being moved already"):
        wire.unwrap({"status": "error", "error": Serialized(header, frames)})
    with pytest.raises(GearFlowError, match="^no such table$"):
        wire.unwrap({"status": "error", "error": "no such table"})
