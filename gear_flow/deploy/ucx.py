"""What UCX needs on this node: a CUDA context only where a GPU exists, loopback-only devices for a
loopback deployment.

``distributed-ucxx`` with ``create-cuda-context: true`` initialises NVML and CUDA before UCX; on a
CPU-only node that crashes the process (``pynvml.NVMLError_Uninitialized``).  A deployment bound to
127.0.0.1 also tells UCX to use the loopback device only (``UCX_NET_DEVICES=lo``): otherwise UCX
opens its transports on every network device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .gpu import has_gpu
from .net import is_loopback

#: the Dask config key (as an environment variable) that distributed-ucxx reads
CUDA_CONTEXT_VAR = "DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT"


def ucx_environment(
    host: str | None, gpu: bool | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Variables to export for UCX on this node; values the caller already set are kept.

    Parameters
    ----------
    host : str or None
        The address the process listens on (loopback → ``UCX_NET_DEVICES=lo``).
    gpu : bool, optional
        Whether this node has a GPU (default: :func:`~gear_flow.deploy.gpu.has_gpu`).
    environ : mapping of str to str, optional
        The environment already set (default: ``os.environ``); its variables are not overridden.

    Returns
    -------
    dict of str to str
        The variables to add: :data:`CUDA_CONTEXT_VAR` (``"True"`` only with a
        GPU) and ``UCX_NET_DEVICES=lo`` on loopback, each only where not set.
    """
    environ = os.environ if environ is None else environ
    out = {}
    if CUDA_CONTEXT_VAR not in environ:
        out[CUDA_CONTEXT_VAR] = "True" if (has_gpu() if gpu is None else gpu) else "False"
    if host and is_loopback(host) and "UCX_NET_DEVICES" not in environ:
        out["UCX_NET_DEVICES"] = "lo"
    return out
