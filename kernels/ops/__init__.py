"""Importing this package registers every operator with kernels.registry."""

from kernels.ops import (  # noqa: F401  (registration side effect)
    cast,
    cast_fp8,
    clip_grad_norm,
    fused_add_rmsnorm,
    gemm,
    layernorm,
    linear,
    o_proj,
    residual_add,
    rmsnorm,
    rope,
    softmax,
    swiglu,
)
