"""How a request or reply body travels: one pickle for the small parts, large and device arrays as Dask frames.

``distributed.protocol.to_serialize`` of a dict serializes every element on
its own (a header, a pickle or a serializer dispatch per int, string and small
array); a ``sample_part`` reply (a dozen small arrays per shard) cost ~0.7 ms
of serialization that way on a 2-core host, more than the round trip itself.
Here the body is pickled once (protocol 5, small arrays in-band), and only
NumPy arrays of at least :data:`INLINE_MAX` bytes and device arrays (anything
with ``__cuda_array_interface__``) leave the pickle: they travel as Dask
frames (zero-copy for NumPy; CuPy through Dask's ``cuda`` serializer, so UCX
moves them device to device), referenced from the pickle by position.

A message is ``{"packed": bytes, "frames": [array, ...] or None}``.  Handlers
still accept a plain ``args`` dict (older tools and tests send those).  The
pickle is trusted exactly as far as Dask trusts its peers (it unpickles what
clients send too); its content is then checked against the operation's schema
like any other message.
"""

from __future__ import annotations

import io
import pickle
import threading
from typing import Any

import numpy as np

from ..errors import CoordinatorLostError, GearFlowError

#: arrays smaller than this travel inside the pickle (a frame costs more than copying them)
INLINE_MAX = 1 << 16


_loading = threading.local()  # the frames of the message being decoded in this thread


def _frame(i: int) -> Any:
    """Unpickling: frame ``i`` of the message being decoded."""
    frames = getattr(_loading, "frames", None)
    if frames is None or not isinstance(i, int) or not 0 <= i < len(frames):
        raise pickle.UnpicklingError(f"frame reference {i!r} out of range (message has {len(frames or ())})")
    return frames[i]


class _Pickler(pickle.Pickler):
    """Pickles a body, leaving large and device arrays out as frames (``reducer_override`` is not called for
    exact ints, strings, dicts and the other builtins, so small messages cost little)."""

    def __init__(self, file: io.BytesIO, frames: list) -> None:
        super().__init__(file, protocol=5)
        self.frames = frames

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.nbytes < INLINE_MAX or obj.dtype.hasobject:
                return NotImplemented
        elif isinstance(obj, type) or not hasattr(obj, "__cuda_array_interface__"):
            return NotImplemented
        self.frames.append(obj)
        return _frame, (len(self.frames) - 1,)


def encode(body: Any) -> dict[str, Any]:
    """The fields of a message carrying ``body``.

    Parameters
    ----------
    body : object
        Picklable; NumPy arrays of at least :data:`INLINE_MAX` bytes and
        device arrays become frames.

    Returns
    -------
    dict
        ``{"packed": bytes, "frames": Serialize(list) or None}``, to merge
        into the message.
    """
    from distributed.protocol import to_serialize

    buf, frames = io.BytesIO(), []
    _Pickler(buf, frames).dump(body)
    return {"packed": buf.getvalue(), "frames": to_serialize(frames) if frames else None}


def decode(packed: Any, frames: Any = None) -> Any:
    """The body of a message made by :func:`encode`.

    Parameters
    ----------
    packed : bytes
        The pickle.
    frames : list or distributed.protocol.Serialized, optional
        The large arrays (still serialized when the scheduler received them:
        its comm keeps frames as they came).

    Returns
    -------
    object
        The body.

    Raises
    ------
    TypeError
        ``packed`` is not bytes, or ``frames`` not a list.
    pickle.UnpicklingError
        A frame reference points past the frames.
    """
    from distributed.protocol import Serialized, deserialize

    if isinstance(frames, Serialized):
        frames = deserialize(frames.header, frames.frames)
    if frames is None:
        frames = []
    if not isinstance(packed, (bytes, bytearray, memoryview)) or not isinstance(frames, (list, tuple)):
        raise TypeError(
            f"a packed message needs bytes and a list of frames, got {type(packed).__name__} and {type(frames).__name__}"
        )
    _loading.frames = list(frames)
    try:
        return pickle.loads(packed)
    finally:
        _loading.frames = None


def ok(result: Any) -> dict[str, Any]:
    """A handler's success reply carrying ``result``.

    Parameters
    ----------
    result : object
        What the operation returned.

    Returns
    -------
    dict
        ``{"status": "OK", "packed": ..., "frames": ...}``.
    """
    return {"status": "OK", **encode(result)}


def result(resp: dict[str, Any]) -> Any:
    """The result of a success reply (packed, or a plain ``result`` field).

    Parameters
    ----------
    resp : dict
        A reply whose status is ``"OK"``.

    Returns
    -------
    object
        The result.
    """
    if "packed" in resp:
        return decode(resp["packed"], resp.get("frames"))
    r = resp.get("result")
    from distributed.protocol import Serialized, deserialize

    return deserialize(r.header, r.frames) if isinstance(r, Serialized) else r


def array_bytes(body: Any) -> int:
    """Bytes of the NumPy arrays in ``body`` (nested in dicts, lists and tuples).

    Parameters
    ----------
    body : object
        A request's arguments.

    Returns
    -------
    int
        Their total ``nbytes`` (what a message carrying ``body`` holds beyond
        its small fields).

    Examples
    --------
    >>> array_bytes({"parts": [{"chunks": [{"x": np.zeros(4, np.float32)}], "n": 3}]})
    16
    """
    if isinstance(body, np.ndarray):
        return body.nbytes
    if isinstance(body, dict):
        return sum(array_bytes(v) for v in body.values())
    if isinstance(body, (list, tuple)):
        return sum(array_bytes(v) for v in body)
    return 0


def unwrap(resp: Any) -> Any:
    """The result of a handler reply, or its error raised with its own type.

    Parameters
    ----------
    resp : dict
        A ``gear_flow`` handler's reply: ``{"status": "OK", "packed": ...,
        "frames": ...}`` (:func:`gear_flow.distributed.wire.ok`; or a plain
        ``"result"``) or ``{"status": "error", "error": exception or
        message}``.

    Returns
    -------
    object
        The result.

    Raises
    ------
    CoordinatorLostError
        ``resp`` is not a dict (no reply: the scheduler may be gone).
    GearFlowError
        The handler failed: its own exception, or a GearFlowError with its
        message.
    """
    if not isinstance(resp, dict):
        raise CoordinatorLostError(f"no reply (got {type(resp).__name__}); the scheduler may have gone away")
    if resp.get("status") != "OK":
        err = resp.get("error")
        from distributed.protocol import Serialized, deserialize

        if isinstance(err, Serialized):  # as the scheduler receives a worker's error: its comm keeps it as it came
            err = deserialize(err.header, err.frames)
        raise err if isinstance(err, BaseException) else GearFlowError(str(err))
    return result(resp)
