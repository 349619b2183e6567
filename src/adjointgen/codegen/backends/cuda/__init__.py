"""The CUDA backend: the elementwise kernels of the pairwise products and divided differences
(``cuda/op.cu.j2``; the header ``adjointgen_divided.cuh``), which the CuPy backend launches."""
from __future__ import annotations

from .. import Backend

BACKEND = Backend("cuda", "cuda/op.cu.j2", None, "//", runtime=("adjointgen_divided.cuh",), kernels=True)
