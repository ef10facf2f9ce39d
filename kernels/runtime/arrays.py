"""Operands: what a launcher needs to know about an array argument, and the checks every launcher makes.

A launcher accepts, for each array argument,
  - a numpy array: copied to the device before the launch; outputs and in-place arguments are copied back;
  - a numba device array, or any object with `__cuda_array_interface__` (CuPy, PyTorch, ...): used in place,
    with no copy at all.

`operand()` turns any of these into an `Operand` (pointer, shape, byte strides, dtype) and `check_*` validate
it with one-line errors that name the argument, the bad value and what is allowed. `HostSync` collects the
numpy arguments of one call so they are copied back once, after the launch.

The hot path (device arrays on a real GPU) reads a handful of attributes per argument and builds no dicts:
the per-type extractor is picked once per Python type and cached, because the generic
`__cuda_array_interface__` property builds a fresh dict on every access (a few microseconds each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import ml_dtypes
import numpy as np
from numba import cuda

SIMULATED: bool = bool(cuda.config.ENABLE_CUDASIM)

# dtypes with fp32 accumulation inside the kernels; fp16 I/O halves the bytes of memory-bound ops
FLOAT_IO: tuple[np.dtype, ...] = (np.dtype(np.float32), np.dtype(np.float16))
# bfloat16 (numpy has none: ml_dtypes' type, which numba-cuda maps). Its kernels take the raw 16-bit words
# (kernels.primitives.bf16), and host copies go through a uint16 view: numba copies host memory through the
# buffer protocol, which refuses ml_dtypes' types ("cannot include dtype 'E' in a buffer").
BF16: np.dtype = np.dtype(ml_dtypes.bfloat16)
FLOAT_IO_BF16: tuple[np.dtype, ...] = (*FLOAT_IO, BF16)
# float8 e4m3fn (ml_dtypes' type; numba has no fp8 type at all): kernels write the raw 8-bit words
# (kernels.primitives.fp8) and host copies go through a uint8 view, as for bf16
FP8: np.dtype = np.dtype(ml_dtypes.float8_e4m3fn)
_U16 = np.dtype(np.uint16)
_U8 = np.dtype(np.uint8)
# dtypes numba cannot copy or type, and the unsigned words of the same size the kernels take them as
_WORD_OF: dict[np.dtype, np.dtype] = {BF16: _U16, FP8: _U8}


def to_device(host: np.ndarray) -> Any:
    """cuda.to_device, bf16 and fp8 included (a device array filled through its uint16 / uint8 view)."""
    w = _WORD_OF.get(host.dtype)
    if w is None:
        return cuda.to_device(host)
    dev = cuda.device_array(host.shape, dtype=host.dtype)
    dev.view(w).copy_to_device(np.ascontiguousarray(host).view(w))
    return dev


def to_host(dev: Any, host: np.ndarray | None = None) -> np.ndarray:
    """dev.copy_to_host([host]), bf16 and fp8 included."""
    dt = np.dtype(dev.dtype)
    w = _WORD_OF.get(dt)
    if w is None:
        got: np.ndarray = dev.copy_to_host() if host is None else dev.copy_to_host(host)
        return got
    if host is None:
        raw: np.ndarray = dev.view(w).copy_to_host()
        return raw.view(dt)
    dev.view(w).copy_to_host(host.view(w))
    return host


def words(dev: Any) -> Any:
    """The uint16 view of a bf16 device array, the uint8 view of an fp8 one (what numba's dispatcher gets
    for such an operand); other arrays as they are."""
    w = _WORD_OF.get(np.dtype(dev.dtype))
    return dev if w is None else dev.view(w)


def host_words(host: np.ndarray) -> np.ndarray:
    """A host bf16 / fp8 array as its uint16 / uint8 words (what numba can copy); other arrays as they are."""
    w = _WORD_OF.get(host.dtype)
    return host if w is None else host.view(w)


class Operand:
    """One array argument, resolved to device memory.

    `dev` is an object numba's dispatcher accepts (a numba device array, or on the simulator its fake array);
    it is made lazily for CAI objects because the fast launch path needs only `ptr`.
    `host` is the numpy array the caller passed (None for device arrays).
    """

    __slots__ = ("name", "ptr", "shape", "strides", "dtype", "_dev", "src", "host")

    def __init__(
        self,
        name: str,
        ptr: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: np.dtype,
        src: Any,
        host: np.ndarray | None = None,
        dev: Any = None,
    ) -> None:
        self.name = name
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.src = src
        self.host = host
        self._dev = dev

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def dev(self) -> Any:
        """A numba-dispatchable view of the same memory (no copy)."""
        if self._dev is None:
            self._dev = cuda.as_cuda_array(self.src)
        return self._dev

    def reshaped(self, shape: tuple[int, ...]) -> Operand:
        """The same C-contiguous memory seen with another shape (no copy)."""
        dev = self._dev.reshape(shape) if self._dev is not None else None
        src = self.src if dev is None else dev
        return Operand(self.name, self.ptr, shape, c_strides(shape, self.dtype.itemsize), self.dtype, src,
                       None, dev)  # fmt: skip

    def flat(self) -> Operand:
        """The same C-contiguous memory as one dimension (no copy)."""
        n = self.size
        return self if len(self.shape) == 1 else self.reshaped((n,))

    def __repr__(self) -> str:  # for error messages and debugging
        return f"Operand({self.name}, shape={self.shape}, dtype={self.dtype})"


_CSTRIDES: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Byte strides of a C-contiguous array. Memoised: launchers ask for the same few shapes on every
    call, and this sits on the host-overhead path (kernels.harness.overhead)."""
    key = (shape, itemsize)
    hit = _CSTRIDES.get(key)
    if hit is not None:
        return hit
    out = []
    acc = itemsize
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    res = tuple(reversed(out))
    if len(_CSTRIDES) < 4096:
        _CSTRIDES[key] = res
    return res


# --- extractors: type -> (ptr, shape, strides, dtype) ------------------------------------------------------

_Extract = Callable[[Any], tuple[int, tuple[int, ...], tuple[int, ...], np.dtype]]
_EXTRACTORS: dict[type, _Extract] = {}


def _from_numba(a: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], np.dtype]:
    gd = a.gpu_data
    ptr = 0 if gd is None else int(gd.device_pointer)
    return ptr, a.shape, a.strides, a.dtype


def _from_cupy(a: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], np.dtype]:
    return a.data.ptr, a.shape, a.strides, a.dtype


def _from_cai(a: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], np.dtype]:
    cai = a.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides") or c_strides(shape, dtype.itemsize)
    return int(cai["data"][0] or 0), shape, tuple(strides), dtype


def _from_sim(a: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], np.dtype]:
    # the simulator's fake device arrays have no device pointer; launches go through the dispatcher
    return 0, a.shape, a.strides, a.dtype


def _extractor_for(t: type) -> _Extract | None:
    ex = _EXTRACTORS.get(t)
    if ex is not None:
        return ex
    mod = t.__module__ or ""
    if SIMULATED and mod.startswith("numba.cuda.simulator"):
        ex = _from_sim
    elif mod.startswith("numba.cuda") and hasattr(t, "device_ctypes_pointer"):
        # (a class-level attribute: `gpu_data` is set per instance, so hasattr on the type misses it and
        # would send numba arrays down the slower generic __cuda_array_interface__ path)
        ex = _from_numba
    elif mod.startswith("cupy") and hasattr(t, "data"):
        ex = _from_cupy
    elif hasattr(t, "__cuda_array_interface__"):
        ex = _from_cai
    else:
        return None
    _EXTRACTORS[t] = ex
    return ex


def fast_extractor(t: type) -> _Extract | None:
    """The extractor of a device-array type for kernels.runtime.launch.FastCache: None for numpy arrays,
    anything unknown, and the simulator's arrays (no device pointer)."""
    ex = _EXTRACTORS.get(t)
    if ex is None:
        ex = _extractor_for(t)
    return None if ex is None or ex is _from_sim else ex


def is_device_array(obj: Any) -> bool:
    return _extractor_for(type(obj)) is not None


def operand(name: str, obj: Any, sync: HostSync | None = None, *, writeback: bool = False) -> Operand:
    """Resolve one array argument. numpy arrays are copied to the device (and registered with `sync` for the
    copy back when `writeback`); device arrays are used as they are."""
    ex = _extractor_for(type(obj))
    if ex is not None:
        ptr, shape, strides, dtype = ex(obj)
        dev = obj if SIMULATED else None
        return Operand(name, ptr, tuple(shape), tuple(strides), dtype, obj, None, dev)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError(
                f"{name}: expected a C-contiguous array, got strides {obj.strides} for shape {obj.shape}"
            )
        dev = to_device(obj)
        ptr, shape, strides, dtype = (0, obj.shape, obj.strides, obj.dtype) if SIMULATED else _from_numba(dev)
        op = Operand(name, ptr, tuple(shape), tuple(strides), dtype, dev, obj, dev)
        if writeback:
            if sync is None:
                raise RuntimeError(f"{name}: a numpy output needs a HostSync to be copied back")
            sync.add(op)
        return op
    raise TypeError(
        f"{name}: expected a numpy array, a numba device array or an object with __cuda_array_interface__, "
        f"got {type(obj).__name__}"
    )


def empty_like_device(name: str, shape: tuple[int, ...], dtype: np.dtype) -> Operand:
    """A fresh device output (used when the caller passes no `out`)."""
    dev = cuda.device_array(shape, dtype=dtype)
    ptr = 0 if SIMULATED else _from_numba(dev)[0]
    return Operand(name, ptr, shape, c_strides(shape, dtype.itemsize), dtype, dev, None, dev)


class HostSync:
    """Copies numpy outputs / in-place arguments back after the launch, then waits for the device."""

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: list[Operand] = []

    def add(self, op: Operand) -> None:
        self._ops.append(op)

    def finish(self) -> None:
        for op in self._ops:
            assert op.host is not None
            to_host(op.dev, op.host)


# --- checks -----------------------------------------------------------------------------------------------


def check_dtype(op: Operand, allowed: Iterable[np.dtype]) -> None:
    allowed = tuple(allowed)
    for a in allowed:  # builtin dtypes are singletons: identity first, equality only on a miss
        if op.dtype is a:
            return
    if op.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"{op.name}: dtype {op.dtype} is not supported; expected one of: {names}")


def check_same_dtype(op: Operand, ref: Operand) -> None:
    if op.dtype is not ref.dtype and op.dtype != ref.dtype:
        raise TypeError(f"{op.name}: dtype {op.dtype} must match {ref.name}'s dtype {ref.dtype}")


def check_contiguous(op: Operand) -> None:
    if op.strides != c_strides(op.shape, op.dtype.itemsize) and op.size > 1:  # size 0/1: any strides
        raise ValueError(
            f"{op.name}: expected a C-contiguous array, got strides {op.strides} for shape {op.shape}"
        )


def check_ndim(op: Operand, ndims: Iterable[int]) -> None:
    ndims = tuple(ndims)
    if len(op.shape) not in ndims:
        raise ValueError(
            f"{op.name}: expected {' or '.join(str(n) for n in ndims)} dimensions, got shape {op.shape}"
        )


def check_shape(op: Operand, shape: tuple[int, ...], what: str) -> None:
    if op.shape != shape:
        raise ValueError(f"{op.name}: expected shape {shape} ({what}), got {op.shape}")


def check_like(op: Operand, ref: Operand, what: str) -> None:
    """`op` must have `ref`'s dtype and shape and be C-contiguous; `ref` was checked contiguous already.
    One comparison chain on the hot path; the detailed checks (and their messages) only on a mismatch."""
    if op.dtype is ref.dtype and op.shape == ref.shape and op.strides == ref.strides:
        return
    check_same_dtype(op, ref)
    check_shape(op, ref.shape, what)
    check_contiguous(op)


def check_vector(op: Operand, ref: Operand, n: int, what: str) -> None:
    """`op` must be a contiguous 1-d array of n elements with `ref`'s dtype (weights, biases)."""
    if op.dtype is ref.dtype and op.shape == (n,) and op.strides[0] == op.dtype.itemsize:
        return
    check_same_dtype(op, ref)
    check_shape(op, (n,), what)
    check_contiguous(op)


def _sim_array(op: Operand) -> Any:
    """The numpy array behind a simulator device array (None for anything else)."""
    return getattr(op.src, "_ary", None)


def overlaps(a: Operand, b: Operand) -> bool:
    """Whether two operands' memory can overlap. A numpy argument gets a device copy of its own, so it can
    only overlap another numpy argument (the same host memory, copied back twice); simulator arrays are
    compared through the numpy arrays behind them; device arrays by their byte ranges (C-contiguous)."""
    if a.host is not None or b.host is not None:
        return a.host is not None and b.host is not None and bool(np.may_share_memory(a.host, b.host))
    if SIMULATED:
        sa, sb = _sim_array(a), _sim_array(b)
        return sa is not None and sb is not None and bool(np.may_share_memory(sa, sb))
    return a.ptr < b.ptr + b.size * b.dtype.itemsize and b.ptr < a.ptr + a.size * a.dtype.itemsize


def same_memory(a: Operand, b: Operand) -> bool:
    """Whether two operands are the same array exactly: same first byte, shape and dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.host is not None or b.host is not None:
        return a.host is not None and b.host is not None and _first_byte(a.host) == _first_byte(b.host)
    if SIMULATED:
        sa, sb = _sim_array(a), _sim_array(b)
        return sa is not None and sb is not None and _first_byte(sa) == _first_byte(sb)
    return a.ptr == b.ptr


def _first_byte(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


# one aliasing rule of a launcher: (operand index, other operand index, may it be the other one exactly?, what
# the kernel does that an overlap would break); checked by check_overlaps here and, on FastCache hits, by
# kernels.runtime.launch.OverlapGuard with the same messages
Overlap = tuple[int, int, bool, str]


def overlap_message(name: str, other: str, same_ok: bool, why: str) -> str:
    if same_ok:
        return f"{name}: must be {other} itself or not overlap it ({why})"
    return f"{name}: must not overlap {other} ({why})"


def check_overlaps(ops: tuple[Operand, ...], rules: tuple[Overlap, ...]) -> None:
    for i, j, same_ok, why in rules:
        a, b = ops[i], ops[j]
        if overlaps(a, b) and not (same_ok and same_memory(a, b)):
            raise ValueError(overlap_message(a.name, b.name, same_ok, why))


def check_nonempty(op: Operand) -> None:
    if op.size == 0:
        raise ValueError(f"{op.name}: expected a non-empty array, got shape {op.shape}")


def check_positive(name: str, value: float) -> float:
    v = float(value)
    if not v > 0.0 or v != v:
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")
    return v


def as_rows(op: Operand) -> Operand:
    """View an N-d (N >= 1) C-contiguous array as 2-d (rows, last dim), the layout the row kernels take."""
    if len(op.shape) == 2:
        return op
    n = op.shape[-1]
    return op.reshaped((op.size // n if n else 0, n))


def finish(sync: HostSync, result: Operand, out: Any, first: Operand) -> Any:
    """The value a launcher returns: numpy in -> numpy out (copied back), device in -> device out."""
    sync.finish()
    if out is None:
        return to_host(result.dev) if first.host is not None else result.src
    return out


def output(name: str, out: Any, sync: HostSync, shape: tuple[int, ...], dtype: np.dtype) -> Operand:
    """The output operand: the caller's `out` (checked) or a fresh device array."""
    if out is None:
        return empty_like_device(name, shape, dtype)
    op = operand(name, out, sync, writeback=True)
    if op.dtype is dtype and op.shape == shape and op.strides == c_strides(shape, dtype.itemsize):
        return op
    if op.dtype != dtype:
        raise TypeError(f"{name}: dtype {op.dtype} is not allowed; expected {dtype}")
    check_shape(op, shape, "the shape of the result")
    check_contiguous(op)
    return op
