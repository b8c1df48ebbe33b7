"""Whether this node has a usable NVIDIA GPU, asked without creating a CUDA context."""

from __future__ import annotations

import shutil
import subprocess


def has_gpu() -> bool:
    """True when ``nvidia-smi -L`` lists a GPU, or NVML counts one (where nvidia-smi is missing).

    NVML is initialised and shut down here; no CUDA context is created.  Any failure (no driver,
    ``NVMLError_Uninitialized``, no ``pynvml``) means no GPU.

    Returns
    -------
    bool
        Whether this node has at least one NVIDIA GPU.
    """
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return False
        return r.returncode == 0 and any(line.startswith("GPU") for line in r.stdout.splitlines())
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: no GPU
        return False
