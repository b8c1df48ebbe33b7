"""Stream handoff between the gather kernels (CuPy) and the learner (torch).

Device sample buffers are reused from batch to batch, so two orderings matter:

* the gather into a buffer must run after the learner's kernels that still read
  the previous batch from it, and
* the learner's kernels must run after the gather that filled it.

The simplest way to get both is to gather on the learner's own stream:
:func:`learner_stream` wraps torch's current stream as a CuPy stream, to be used
as a context manager around the table's gather.  :func:`publish` additionally
makes torch's current stream wait for CuPy's current stream (an event, no host
synchronisation; nothing when they are the same stream), for batches gathered
outside that context.  torch and CuPy share the device's primary context, so
their stream handles are interchangeable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..backend import require_gpu

if TYPE_CHECKING:
    import cupy


def _torch_stream(device_id: int):
    """torch's current stream on ``device_id``, or None without a CUDA-enabled torch."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.current_stream(device_id)
    except Exception:  # torch without CUDA, or no torch
        return None


def _as_cupy(cp, ts, device_id: int):
    ptr = int(ts.cuda_stream)
    if ptr == 0:  # the legacy default stream
        return cp.cuda.Stream.null
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is not None:  # CuPy >= 14: the CUDA stream protocol
        return from_external(ts)
    return cp.cuda.ExternalStream(ptr, device_id)


def learner_stream() -> cupy.cuda.Stream:
    """CuPy stream for torch's current CUDA stream (CuPy's current one when torch has no CUDA).

    Use as ``with learner_stream(): ...``: kernels launched inside run on it.

    Returns
    -------
    cupy.cuda.Stream
        An external stream wrapping torch's current stream on CuPy's current
        device (the null stream when torch uses the legacy default stream),
        or CuPy's current stream.

    Raises
    ------
    BackendUnavailableError
        No CuPy or no usable device.
    """
    cp = require_gpu("the learner stream")
    dev = int(cp.cuda.runtime.getDevice())
    ts = _torch_stream(dev)
    if ts is None:
        return cp.cuda.get_current_stream()
    return _as_cupy(cp, ts, dev)


def publish() -> None:
    """Order torch's current stream after everything issued so far on CuPy's current stream."""
    cp = require_gpu("the learner stream")
    dev = int(cp.cuda.runtime.getDevice())
    ts = _torch_stream(dev)
    cur = cp.cuda.get_current_stream()
    if ts is None or int(ts.cuda_stream) == int(cur.ptr):
        return
    ev = cp.cuda.Event(disable_timing=True)
    ev.record(cur)
    _as_cupy(cp, ts, dev).wait_event(ev)
