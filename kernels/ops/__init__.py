"""Importing this package registers every operator with kernels.registry."""

from kernels.ops import (  # noqa: F401  (registration side effect)
    cast,
    clip_grad_norm,
    fused_add_rmsnorm,
    gemm,
    layernorm,
    o_proj,
    residual_add,
    rmsnorm,
    softmax,
    swiglu,
)
