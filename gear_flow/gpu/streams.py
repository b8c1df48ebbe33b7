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

from ..backend import require_gpu


def _torch_stream_ptr(device_id: int) -> int | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.current_stream(device_id).cuda_stream)
    except Exception:  # torch without CUDA, or no torch
        return None


def learner_stream():
    """CuPy stream for torch's current CUDA stream (CuPy's current one when torch has no CUDA).

    Use as ``with learner_stream(): ...``: kernels launched inside run on it.
    """
    cp = require_gpu("the learner stream")
    dev = int(cp.cuda.runtime.getDevice())
    ptr = _torch_stream_ptr(dev)
    if ptr is None:
        return cp.cuda.get_current_stream()
    return cp.cuda.ExternalStream(ptr, dev)


def publish() -> None:
    """Order torch's current stream after everything issued so far on CuPy's current stream."""
    cp = require_gpu("the learner stream")
    dev = int(cp.cuda.runtime.getDevice())
    ptr = _torch_stream_ptr(dev)
    cur = cp.cuda.get_current_stream()
    if ptr is None or ptr == int(cur.ptr):
        return
    ev = cp.cuda.Event(disable_timing=True)
    ev.record(cur)
    cp.cuda.ExternalStream(ptr, dev).wait_event(ev)
