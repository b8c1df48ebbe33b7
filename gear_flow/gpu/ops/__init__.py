"""CUDA twins of :mod:`gear_flow.ops`: same functions, same arguments, same semantics.

Each function launches the kernels of ``kernels/<name>.cu`` (through the
memoised :mod:`gear_flow.gpu.loader`) on CuPy's current stream.  Arrays are CuPy
arrays (host inputs such as indices are copied to the device); outputs are
written in place, like the twins' ``out`` arguments.  Results are identical to
the CPU twins, bit for bit, which tests/test_gpu_parity.py checks.

Importing these modules imports CuPy; :mod:`gear_flow.gpu` itself does not.
"""
