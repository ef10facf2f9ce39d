"""CUDA C device functions linked into numba kernels (tensor cores: numba-cuda has no mma API)."""
