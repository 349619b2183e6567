"""Tools the tests look for on this machine (a module of its own: the vendored JAX tests bring a
``conftest`` module of theirs, so nothing imports from ``conftest`` by name)."""
import os
import shutil


def nvcc_path():
    """The CUDA compiler, or None."""
    return shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc") or None
