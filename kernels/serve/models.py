"""The model catalogue: every registered op as a KServe v2 "model", with the shapes and dtypes it accepts.

The registry (kernels.registry) knows how to make and launch a problem but not which shapes a caller may
send, so each op's tensors are declared here with symbolic dimensions: `("rows", "cols")` means any 2-d
shape, and a second tensor with `("cols",)` must match the first one's columns. `check()` binds the symbols
and answers one line naming the tensor and what was expected. tests/serve/test_models.py checks every
declaration against the op's own `make_problem` so the two cannot drift apart.

Scalars (eps, max_norm) are request parameters. In-place inputs (clip_grad_norm's gradients,
fused_add_rmsnorm's residual) come back as outputs of the same name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.registry import OpSpec

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
# KServe v2 / Triton datatype names of the dtypes the ops take
V2_OF = {F32: "FP32", F16: "FP16", np.dtype(np.float64): "FP64", np.dtype(np.int32): "INT32"}
NP_OF: dict[str, np.dtype] = {
    "FP32": F32,
    "FP16": F16,
    "FP64": np.dtype(np.float64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "BOOL": np.dtype(np.bool_),
}
MAX_VARIADIC = 64  # clip_grad_norm arrays per request: far past any real optimizer's parameter groups


class BadInput(ValueError):
    """A request the op cannot take: the message names the tensor or parameter and what was expected."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dims: tuple[str, ...]  # symbolic dimension names; the same name must have the same size everywhere
    dtypes: tuple[np.dtype, ...] | None = None  # None: the same dtype as the model's first input
    optional: bool = False
    finite: bool = False  # NaN/inf refused: one bad element would spread to a whole row or the whole result


@dataclass(frozen=True)
class OutputSpec:
    name: str
    dims: tuple[str, ...]
    dtype: np.dtype | None = None  # None: the first input's dtype


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: float | str | None  # None: required
    choices: tuple[str, ...] = ()  # a word parameter (linear's activation): one of these, else a number


@dataclass(frozen=True)
class Model:
    name: str
    spec: OpSpec
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[OutputSpec, ...]
    params: tuple[ParamSpec, ...] = ()
    # inputs named <prefix>0, <prefix>1, ...: each 1-d with its own length, modified in place
    variadic: str = ""

    @property
    def inplace(self) -> bool:
        return bool(self.variadic)

    def metadata(self, version: str) -> dict[str, Any]:
        """GET /v2/models/{name}: KServe v2 model metadata. A tensor taking several dtypes lists the first as
        `datatype` and every one under `parameters.datatypes`."""

        def tensor(name: str, dims: tuple[str, ...], dts: tuple[np.dtype, ...]) -> dict[str, Any]:
            return {
                "name": name,
                "datatype": V2_OF[dts[0]],
                "shape": [-1] * len(dims),
                "parameters": {"datatypes": [V2_OF[d] for d in dts], "dims": list(dims)},
            }

        first = self.inputs[0].dtypes or tuple(np.dtype(d) for d in self.spec.dtypes)
        ins = [
            tensor(t.name, t.dims, t.dtypes or first) | ({"optional": True} if t.optional else {})
            for t in self.inputs
        ]
        outs = [tensor(o.name, o.dims, (o.dtype,) if o.dtype is not None else first) for o in self.outputs]
        if self.variadic:
            ins[0]["parameters"]["variadic"] = f"{self.variadic}0 .. {self.variadic}{MAX_VARIADIC - 1}"
            outs.append(dict(ins[0]) | {"name": f"{self.variadic}0 ..", "parameters": {"inplace": True}})
        return {
            "name": self.name,
            "versions": [version],
            "platform": "solfleet_numba_cuda",
            "inputs": ins,
            "outputs": outs,
            "parameters": {p.name: p.default for p in self.params},
        }


@dataclass(frozen=True)
class Plan:
    """A validated request: input dtypes and shapes, outputs to allocate, scalars, device bytes needed."""

    dtype: np.dtype
    inputs: dict[str, tuple[tuple[int, ...], np.dtype]]
    outputs: dict[str, tuple[tuple[int, ...], np.dtype]]  # includes in-place inputs that come back
    scalars: dict[str, float | str]
    device_bytes: int
    finite: frozenset[str]


_X = ("rows", "cols")
CATALOGUE: dict[str, dict[str, Any]] = {
    "cast": {"inputs": (TensorSpec("x", _X, (F32,)),), "outputs": (OutputSpec("out", _X, F16),)},
    "residual_add": {
        "inputs": (TensorSpec("x", _X, (F32, F16)), TensorSpec("r", _X)),
        "outputs": (OutputSpec("out", _X),),
    },
    "gemm": {
        "inputs": (
            TensorSpec("a", ("M", "K"), (F32, F16), finite=True),
            TensorSpec("b", ("K", "N"), finite=True),
        ),
        "outputs": (OutputSpec("c", ("M", "N"), F32),),
    },
    "o_proj": {
        "inputs": (
            TensorSpec("attn", ("B", "S", "K"), (F32, F16), finite=True),
            TensorSpec("w", ("K", "N"), finite=True),
            TensorSpec("residual", ("B", "S", "N")),
            TensorSpec("bias", ("N",), optional=True),
        ),
        "outputs": (OutputSpec("out", ("B", "S", "N")),),
    },
    "linear": {
        "inputs": (
            TensorSpec("x", ("B", "S", "K"), (F16,), finite=True),
            TensorSpec("weight", ("N", "K"), finite=True),
            TensorSpec("bias", ("N",), optional=True),
        ),
        "outputs": (OutputSpec("out", ("B", "S", "N")),),
        "params": (ParamSpec("activation", "none", ("none", "silu", "gelu_tanh")),),
    },
    "layernorm": {
        "inputs": (
            TensorSpec("x", _X, (F32, F16), finite=True),
            TensorSpec("weight", ("cols",)),
            TensorSpec("bias", ("cols",)),
        ),
        "outputs": (OutputSpec("out", _X),),
        "params": (ParamSpec("eps", 1e-5),),
    },
    "rmsnorm": {
        "inputs": (TensorSpec("x", _X, (F32, F16), finite=True), TensorSpec("weight", ("cols",))),
        "outputs": (OutputSpec("out", _X),),
        "params": (ParamSpec("eps", 1e-6),),
    },
    "fused_add_rmsnorm": {
        "inputs": (
            TensorSpec("x", _X, (F32, F16), finite=True),
            TensorSpec("residual", _X, finite=True),
            TensorSpec("weight", ("cols",)),
        ),
        # residual is updated in place: it comes back as an output of the same name (the engine copies the
        # staged input back; it allocates nothing for it)
        "outputs": (OutputSpec("out", _X), OutputSpec("residual", _X)),
        "params": (ParamSpec("eps", 1e-6),),
    },
    "swiglu": {
        "inputs": (TensorSpec("a", _X, (F32, F16)), TensorSpec("b", _X)),
        "outputs": (OutputSpec("out", _X),),
    },
    "softmax": {
        "inputs": (TensorSpec("x", _X, (F32, F16), finite=True),),
        "outputs": (OutputSpec("out", _X),),
    },
    "clip_grad_norm": {
        "inputs": (TensorSpec("g0", ("n0",), (F32, F16), finite=True),),
        "outputs": (OutputSpec("norm", ("one",), F32),),
        "params": (ParamSpec("max_norm", None),),
        "variadic": "g",
    },
}


# Ops deliberately not served yet, each with why: the service's codec has no BF16 tensors (KServe v2 names
# the datatype, but host copies of bf16 need uint16 views end to end). Served dtypes are the declarations':
# the bf16 paths of residual_add, rmsnorm, layernorm, softmax, fused_add_rmsnorm and swiglu (registered
# dtypes) are not declared above.
NOT_SERVED: dict[str, str] = {
    "cast_bf16": "its output is bf16, which the service's tensor codec does not carry yet",
    "cast_fp8": "its output is float8 e4m3fn, which KServe v2 has no datatype for (and the codec no fp8)",
    "rope": "it works in place on x, and the catalogue's only in-place form is variadic (clip_grad_norm's)",
}


def catalogue(ops: Mapping[str, OpSpec]) -> dict[str, Model]:
    """A Model for every registered op but NOT_SERVED; an op with no declaration here is an error at
    start-up, not a model that 500s on its first request."""
    missing = sorted(set(ops) - set(CATALOGUE) - set(NOT_SERVED))
    if missing:
        raise RuntimeError(
            f"no serving declaration for op(s) {', '.join(missing)} in kernels/serve/models.py"
        )
    return {
        name: Model(name=name, spec=ops[name], **CATALOGUE[name]) for name in sorted(ops) if name in CATALOGUE
    }


def nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def plan(
    model: Model,
    declared: Mapping[str, tuple[tuple[int, ...], str]],
    params: Mapping[str, Any],
    *,
    memory_limit: int,
) -> Plan:
    """Check the declared inputs (name -> (shape, v2 datatype)) and parameters against the model, before any
    data is decoded or allocated. Raises BadInput with one line."""
    specs = list(model.inputs)
    if model.variadic:
        count = sum(
            1 for n in declared if n.startswith(model.variadic) and n[len(model.variadic) :].isdigit()
        )
        if count > MAX_VARIADIC:
            raise BadInput(f"{model.name}: {count} inputs {model.variadic}0..; at most {MAX_VARIADIC}")
        base = specs[0]
        specs = [
            TensorSpec(f"{model.variadic}{k}", (f"n{k}",), base.dtypes, finite=base.finite)
            for k in range(max(count, 1))
        ]
    allowed = {t.name for t in specs}
    for name in declared:
        if name not in allowed:
            names = ", ".join(t.name for t in specs)
            raise BadInput(f"input {name!r}: {model.name} has no input of that name; inputs: {names}")
    sizes: dict[str, tuple[int, str]] = {}
    first_dtype: np.dtype | None = None
    inputs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for t in specs:
        if t.name not in declared:
            if t.optional:
                continue
            raise BadInput(f"input {t.name!r}: missing; {model.name} needs {_describe(t, model)}")
        shape, v2 = declared[t.name]
        dt: np.dtype | None = NP_OF.get(str(v2))
        allowed_dts = t.dtypes if t.dtypes is not None else (first_dtype,)
        if dt is None or dt not in allowed_dts:
            want = " or ".join(V2_OF[d] for d in allowed_dts if d is not None)
            extra = "" if t.dtypes is not None else f" (the same as {specs[0].name})"
            raise BadInput(f"input {t.name!r}: datatype {v2}, expected {want}{extra}")
        if first_dtype is None:
            first_dtype = dt
        if len(shape) != len(t.dims):
            raise BadInput(
                f"input {t.name!r}: shape {list(shape)} has {len(shape)} dimensions, expected "
                f"{len(t.dims)} [{', '.join(t.dims)}]"
            )
        for axis, (n, sym) in enumerate(zip(shape, t.dims, strict=True)):
            if n < 1:
                raise BadInput(f"input {t.name!r}: dimension {axis} ({sym}) is {n}, expected >= 1")
            if sym in sizes and sizes[sym][0] != n:
                raise BadInput(
                    f"input {t.name!r}: dimension {axis} ({sym}) is {n}, expected {sizes[sym][0]} "
                    f"(the {sym} of input {sizes[sym][1]!r})"
                )
            sizes.setdefault(sym, (n, t.name))
        inputs[t.name] = (tuple(shape), dt)
    assert first_dtype is not None  # the first input is never optional
    outputs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for o in model.outputs:
        shape = tuple(1 if s == "one" else sizes[s][0] for s in o.dims)
        outputs[o.name] = (shape, o.dtype if o.dtype is not None else first_dtype)
    if model.variadic:
        outputs.update({n: v for n, v in inputs.items()})
    scalars = _scalars(model, params)
    dev = sum(nbytes(s, d) for s, d in inputs.values())
    dev += sum(nbytes(s, d) for n, (s, d) in outputs.items() if n not in inputs)
    if dev > memory_limit:
        raise BadInput(
            f"{model.name}: the request needs {dev / 2**20:.1f} MiB of device memory "
            f"(inputs + outputs); memory_limit_mb is {memory_limit // 2**20}"
        )
    finite = frozenset(t.name for t in specs if t.finite and t.name in inputs)
    return Plan(first_dtype, inputs, outputs, scalars, dev, finite)


def _describe(t: TensorSpec, model: Model) -> str:
    dts = t.dtypes if t.dtypes is not None else None
    what = "/".join(V2_OF[d] for d in dts) if dts else f"the datatype of {model.inputs[0].name}"
    return f"{t.name} [{', '.join(t.dims)}] of {what}"


def _scalars(model: Model, params: Mapping[str, Any]) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    for p in model.params:
        v = params.get(p.name, p.default)
        if p.choices:
            if not isinstance(v, str) or v not in p.choices:
                raise BadInput(f"parameter {p.name!r}: {v!r}, expected one of: {', '.join(p.choices)}")
            out[p.name] = v
            continue
        if v is None:
            raise BadInput(f"parameter {p.name!r}: missing; {model.name} needs it (a positive number)")
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise BadInput(f"parameter {p.name!r}: {v!r}, expected a positive finite number")
        out[p.name] = float(v)
    return out


def nonfinite_count(a: np.ndarray) -> int:
    """Elements of `a` that are NaN or +-inf, read in cache-sized slices (no full-size temporaries). fp16 is
    tested on its bit pattern (all exponent bits set): numpy's isfinite on fp16 is several times slower."""
    flat = a.reshape(-1)
    step = 1 << 20
    bad = 0
    if a.dtype == F16:
        bits = flat.view(np.uint16)
        for s in range(0, bits.size, step):
            bad += int(np.count_nonzero((bits[s : s + step] & 0x7C00) == 0x7C00))
        return bad
    for s in range(0, flat.size, step):
        bad += int(flat[s : s + step].size - np.count_nonzero(np.isfinite(flat[s : s + step])))
    return bad
