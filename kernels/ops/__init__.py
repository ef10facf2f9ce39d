"""Importing this package registers every operator with kernels.registry."""

import importlib.util

from kernels.ops import (  # noqa: F401  (registration side effect)
    cast,
    clip_grad_norm,
    layernorm,
    residual_add,
    rmsnorm,
    softmax,
)

# gemm / o_proj land from the matmul engineer; imported plainly once their modules exist
for _name in ("gemm", "o_proj"):
    if importlib.util.find_spec(f"kernels.ops.{_name}") is not None:
        importlib.import_module(f"kernels.ops.{_name}")
