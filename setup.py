"""Packaging hook: the wheel carries the CUDA sources as package data.

Everything else about the project is in pyproject.toml.  This file exists for one mapping
pyproject.toml cannot express next to a package search: ``kernels/`` (the sources' one home
in the repository, DESIGN.md) is installed as ``gear_flow/_kernels``, where
:func:`gear_flow.gpu.loader.kernel_dir` finds it in an installed wheel.  Source checkouts and
editable installs read ``kernels/`` itself; tests/test_packaging.py builds a wheel and checks.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["gear_flow", "gear_flow.*"]), "gear_flow._kernels"],
    package_dir={"gear_flow._kernels": "kernels"},
    package_data={"gear_flow": ["py.typed", "gear-flow.yaml"], "gear_flow._kernels": ["*.cu"]},
)
