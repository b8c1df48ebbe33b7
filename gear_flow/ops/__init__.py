"""Numeric cores: plain functions over explicit arrays.

These are the CPU implementations and, at the same time, the parity references
("twins") of the CUDA kernels in ``kernels/``: same arguments, same semantics.
Classes elsewhere are thin wrappers around them.
"""
