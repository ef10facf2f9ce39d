"""A fast launch path for compiled numba kernels: compile once per signature, pack arguments into a
pre-built parameter block and call the driver's `cuLaunchKernel` through ctypes.

Why: numba's dispatcher re-types every argument, wraps it, and builds cuda.core launch objects on each call:
about 29 us per launch on the H200 host (FACTS.md). Host overhead matters for small ops, and the issue's goal
is <= 10 us per op call on device arrays. Here a call costs: one Python loop over the arguments writing
int64 slots, and one ctypes call.

Parameter ABI (numba-cuda 0.30.4, `_Kernel._prepare_args`): every argument is flattened into 8-byte
parameters; an array of ndim d becomes 5 + 2d of them: meminfo (0), parent (0), nitems, itemsize, data
pointer, shape[0..d), strides[0..d) in bytes. Scalars: float32 -> 4 bytes, float64/int64 -> 8 bytes.

Under the CUDA simulator (or with SOLFLEET_LAUNCH=dispatcher) the same `Kernel.launch` goes through numba's
dispatcher, so the simulator and the GPU run one kernel body.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from numba import cuda, types
from numba.core import sigutils

from kernels.runtime import arrays
from kernels.runtime.arrays import _EXTRACTORS, SIMULATED, Operand

USE_DISPATCHER: bool = SIMULATED or os.environ.get("SOLFLEET_LAUNCH", "") == "dispatcher"

_libcuda: ctypes.CDLL | None = None


def _driver() -> ctypes.CDLL:
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        # no argtypes for cuLaunchKernel on purpose: per-argument from_param conversion costs more than the
        # call; every argument is passed as a C int (grid, block, shared memory: unsigned int in the ABI) or
        # as a prebuilt ctypes pointer object (function, stream, parameter array)
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuKernelGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.cuKernelGetFunction.restype = ctypes.c_int
        _libcuda = lib
    return _libcuda


class LaunchError(RuntimeError):
    pass


_TLS = threading.local()


def context() -> int:
    """The calling thread's current CUDA context (its CUcontext handle): the key of every per-context cache
    (compiled functions, validated launches, graphs, device buffers, device facts). A thread starts with no
    context (a launch then fails with CUDA_ERROR_INVALID_CONTEXT, 201): numba binds its context of the
    current device on a thread's first numba call, which the fast path skips, so when the driver reports
    none this asks numba for it (numba's `cuda.select_device` in the thread decides which device that is).
    One ctypes call per use: a FastCache hit asks once; a call that validates asks several times (its
    kernels, SM count, compute capability, buffers), which launchers with no FastCache avoid by asking once
    and passing `ctx` on. 0 under the simulator, which has one simulated device."""
    if SIMULATED:
        return 0
    q = getattr(_TLS, "ctx_query", None)
    if q is None:
        out = ctypes.c_void_p()  # one out-parameter per thread
        q = _TLS.ctx_query = (_driver().cuCtxGetCurrent, ctypes.byref(out), out)
    if q[0](q[1]) == 0:
        ctx = q[2].value
        if ctx:
            return int(ctx)
    cuda.current_context()  # numba: the primary context of the current device, made current here
    if q[0](q[1]) != 0 or not q[2].value:
        raise LaunchError("no CUDA context is current in this thread and numba could not make one")
    return int(q[2].value)


def bind_thread() -> None:
    """Make sure the calling thread has a CUDA context current before a driver launch (see `context`); one
    thread-local flag read per call once it has. For launches whose context was checked earlier in the same
    call (a FastCache hit: `FastCache.find` asked for the context)."""
    if SIMULATED or getattr(_TLS, "bound", False):
        return
    context()
    _TLS.bound = True


class Kernel:
    """One numba kernel specialised to one signature, launched with low host overhead.

    `launch(grid, block, args, shared=0, stream=0)`: `args` follow the signature; array slots take an
    `Operand`, scalar slots a Python number. The caller has validated shapes: nothing is re-checked here.
    A 1-d array slot accepts a C-contiguous operand of any shape, seen flat.

    Contexts: a CUfunction belongs to one CUDA context (one device's). This object holds the function of the
    context it was first used in; a launch from another context (another GPU made current: `with
    cuda.gpus[i]:`, `torch.cuda.set_device(i)`; a thread bound to another GPU) goes to a sibling Kernel
    loaded for that context (`here`): numba lowers once per signature and makes the PTX / cubin per device.
    `on_load(func)`, when given, runs once per context with the new CUfunction handle (e.g. to raise its
    shared-memory limit).
    """

    def __init__(self, dispatcher: Any, sig: str, on_load: Callable[[int], None] | None = None) -> None:
        self.dispatcher = dispatcher
        self.sig = sig
        self.on_load = on_load
        argtypes, _ = sigutils.normalize_signature(sig)
        self.argtypes: tuple[Any, ...] = tuple(argtypes)
        self._ready = False
        self._ctx: int | None = None  # the context `_func` belongs to, once ready
        self._others: dict[int, Kernel] = {}  # this kernel in other contexts
        # one launch at a time per Kernel: `pack` writes the shared parameter block that the launch reads
        # (the operator service calls launchers from several threads)
        self._lock = threading.Lock()
        # making a sibling for another context (a compile: seconds for the tensor-core tiles) takes this one,
        # so launches of this context's function never wait for another GPU's compile
        self._others_lock = threading.Lock()

    # compiled lazily: importing an op module must not need a GPU (the fleet imports them for PTX builds)
    def _prepare(self) -> None:
        """Compile for the current device and load into the current context (numba does both per device)."""
        if USE_DISPATCHER:
            self._ready = True
            return
        kern = self.dispatcher.compile(self.sig)
        cufunc = kern._codelibrary.get_cufunc()
        self._func = ctypes.c_void_p(self._resolve(cufunc))
        self.regs = cufunc.attrs.regs
        self.build_plan()
        self._launch = _driver().cuLaunchKernel
        self._ready = True

    @staticmethod
    def _resolve(cufunc: Any) -> int:
        """The CUfunction of numba's compiled kernel in the current context. cuda.core loads modules as
        libraries, so numba's handle is a CUkernel; resolved here (a CUkernel is also accepted by
        cuLaunchKernel on CUDA >= 12: the fallback)."""
        handle = int(cufunc.handle)
        func = ctypes.c_void_p()
        rc = _driver().cuKernelGetFunction(ctypes.byref(func), ctypes.c_void_p(handle))
        return int(func.value) if rc == 0 and func.value else handle

    def _load(self, ctx: int) -> None:
        """`_prepare` in the current context `ctx`, then `on_load` with its function. On a GPU `on_load` runs
        on the dispatcher launch path too (SOLFLEET_LAUNCH=dispatcher): numba launches that very function.
        `_ctx` is cleared first: no thread takes this Kernel as ready for a context while it (re)loads."""
        self._ctx = None
        self._prepare()
        if self.on_load is not None and not (USE_DISPATCHER and SIMULATED):  # the simulator has no function
            if USE_DISPATCHER:
                f: Any = self._resolve(self.dispatcher.compile(self.sig)._codelibrary.get_cufunc())
            else:
                f = self._func
            self.on_load(int(getattr(f, "value", f) or 0))
        self._ctx = ctx

    def here(self, ctx: int | None = None) -> Kernel:
        """This kernel for the current context (`ctx`, when the caller asked already): compiled and loaded on
        first use there."""
        if ctx is None:
            ctx = context()
        if ctx == self._ctx and self._ready:
            return self
        if not self._ready or self._ctx is None:
            with self._lock:  # `_prepare` replaces the parameter block a launch in another thread may pack
                if not self._ready or self._ctx is None:
                    self._load(ctx)
                    return self
        if ctx == self._ctx:
            return self
        other = self._others.get(ctx)
        if other is None:
            with self._others_lock:
                other = self._others.get(ctx)
                if other is None:
                    other = Kernel(self.dispatcher, self.sig, self.on_load)
                    other._load(ctx)
                    self._others[ctx] = other
        return other

    def build_plan(self) -> None:
        """Lay out the parameter block (no GPU needed): one int64 buffer for every 8-byte parameter, one
        ctypes object per 4-byte scalar, and the void* array cuLaunchKernel reads. Constant slots (meminfo,
        parent, itemsize) are written here, once."""
        plan: list[tuple[int, int, int]] = []  # (kind, slot, ndim); kind: 0 array, 1 int64, 2 f64, 3 4-byte
        ptrs_rel: list[tuple[str, int]] = []  # ("b", int64 slot) or ("s", scalar index)
        scalars: list[ctypes._SimpleCData[Any]] = []
        consts: list[tuple[int, int]] = []
        i8 = 0
        for t in self.argtypes:
            if isinstance(t, types.Array):
                plan.append((0, i8, t.ndim))
                consts += [(i8, 0), (i8 + 1, 0), (i8 + 3, t.dtype.bitwidth // 8)]
                ptrs_rel += [("b", i8 + j) for j in range(5 + 2 * t.ndim)]
                i8 += 5 + 2 * t.ndim
            elif t in (types.float64, types.int64, types.intp, types.uint64):
                plan.append((2 if t == types.float64 else 1, i8, 0))
                ptrs_rel.append(("b", i8))
                i8 += 1
            elif t in (types.float32, types.int32, types.uint32):
                plan.append((3, len(scalars), 0))
                ptrs_rel.append(("s", len(scalars)))
                scalars.append(ctypes.c_float() if t == types.float32 else ctypes.c_int32())
            else:
                raise LaunchError(f"fast launch: unsupported argument type {t} in {self.sig}")
        self._block = (ctypes.c_int64 * max(i8, 1))()
        for slot, value in consts:
            self._block[slot] = value
        base = ctypes.addressof(self._block)
        ptrs = [base + 8 * i if kind == "b" else ctypes.addressof(scalars[i]) for kind, i in ptrs_rel]
        self._params = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        self._scalars = scalars
        self._plan = tuple(plan)

    def pack(self, args: Sequence[Any]) -> None:
        """Write one call's arguments into the parameter block (the per-call work of the fast path)."""
        blk = self._block
        for (kind, at, ndim), a in zip(self._plan, args, strict=True):
            if kind == 0:
                shape = a.shape
                blk[at + 4] = a.ptr
                if ndim == 1:
                    # a 1-d slot takes any C-contiguous operand as flat (the launchers checked contiguity):
                    # elementwise launchers pass N-d arrays without building reshaped views per call
                    if len(shape) == 1:
                        blk[at + 2] = blk[at + 5] = shape[0]
                        blk[at + 6] = a.strides[0]
                    else:
                        blk[at + 2] = blk[at + 5] = a.size
                        blk[at + 6] = a.dtype.itemsize
                elif ndim == 2:
                    blk[at + 2] = shape[0] * shape[1]
                    blk[at + 5] = shape[0]
                    blk[at + 6] = shape[1]
                    st = a.strides
                    blk[at + 7] = st[0]
                    blk[at + 8] = st[1]
                else:
                    n = 1
                    for d in shape:
                        n *= d
                    blk[at + 2] = n
                    blk[at + 5 : at + 5 + ndim] = shape
                    blk[at + 5 + ndim : at + 5 + 2 * ndim] = a.strides
            elif kind == 1:
                blk[at] = int(a)
            elif kind == 2:
                ctypes.c_double.from_buffer(blk, 8 * at).value = float(a)
            else:
                self._scalars[at].value = a

    def launch(
        self,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        args: Sequence[Any],
        shared: int = 0,
        stream: Any = 0,
        ctx: int | None = None,
    ) -> None:
        """One launch in the current context (`ctx`: the caller's `context()` of this call, if it has it)."""
        k = self.here(ctx)
        with k._lock:
            k._launch_locked(grid, block, args, shared, stream)

    def clone(self) -> Kernel:
        """A copy for the current context with a private parameter block and lock (compiled first): for
        callers that keep one packed launch of their own in that context (Bound, clip_grad_norm's plans)."""
        src = self.here()
        own = Kernel.__new__(Kernel)
        own.__dict__.update(src.__dict__)
        own._lock = threading.Lock()
        own._others_lock = threading.Lock()
        own._others = {}  # a clone launches in its own context only: its owner is per context
        own.build_plan()
        return own

    def _launch_locked(self, grid: Any, block: Any, args: Sequence[Any], shared: int, stream: Any) -> None:
        if USE_DISPATCHER:
            dev = [_dispatchable(a, t) for a, t in zip(args, self.argtypes, strict=True)]
            self.dispatcher[grid, block, stream, shared](*dev)
            return
        self.pack(args)
        if type(grid) is int:
            gx, gy, gz = grid, 1, 1
        else:
            gx, gy, gz = (tuple(grid) + (1, 1))[:3]  # not an int: a tuple
        if type(block) is int:
            bx, by, bz = block, 1, 1
        else:
            bx, by, bz = (tuple(block) + (1, 1))[:3]  # not an int: a tuple
        h = stream if type(stream) is int else _stream_handle(stream)
        hs = ctypes.c_void_p(h) if h else None
        rc = self._launch(self._func, gx, gy, gz, bx, by, bz, shared, hs, self._params, None)
        if rc != 0:
            raise LaunchError(f"cuLaunchKernel failed with CUresult {rc} for {self.sig}")

    def resident_blocks(self, block: int, shared: int = 0) -> int:
        """Blocks of `block` threads one SM holds at once (the driver's occupancy query, cached): the
        persistent grids of the prefetching row kernels are SMs x this (both of the current device). 1 on
        the dispatcher path."""
        k = self.here()
        if USE_DISPATCHER:
            return 1
        cache: dict[tuple[int, int], int] = k.__dict__.setdefault("_resident", {})
        hit = cache.get((block, shared))
        if hit is None:
            n = ctypes.c_int()
            occ = _driver().cuOccupancyMaxActiveBlocksPerMultiprocessor
            rc = occ(ctypes.byref(n), k._func, block, shared)
            if rc != 0 or n.value < 1:
                raise LaunchError(f"occupancy query failed (CUresult {rc}, {n.value} blocks) for {self.sig}")
            hit = cache[(block, shared)] = n.value
        return hit

    def bind(self, grid: int | tuple[int, ...], block: int | tuple[int, ...], args: Sequence[Any],
             shared: int = 0, ptr_args: Sequence[int] | None = None) -> Bound:  # fmt: skip
        """A launch of this kernel with `args` packed once into a parameter block of its own: later calls
        pass only the array pointers (`Bound.launch`). For FastCache: same shapes, new pointers.
        `ptr_args`: the argument indices `Bound.launch`'s pointers go to, in its order (array slots take
        the data pointer, int64 slots the address itself); default: every array argument in order.
        The launch belongs to the current context (FastCache keys hold it)."""
        return Bound(self, grid, block, args, shared, ptr_args)


class Bound:
    """One kernel + grid + block + a private, fully packed parameter block. `launch(ptrs, stream)` rewrites
    only the data-pointer slot of each array argument (in signature order; or of the arguments `ptr_args`
    names, int64 address arguments included) and calls cuLaunchKernel.

    Repeat calls with the very same pointers (a loop over fixed buffers) replay a CUDA graph instead: the
    second call in a row with a pointer tuple captures the launch (LaunchGraph) and every later call with
    that tuple replays it: one cuGraphLaunch costs the host less than one cuLaunchKernel (figures in
    benchmarks/notes-clip.md). Everything but the pointers is fixed per Bound, so the graph launches
    exactly what a direct launch with those pointers would. Up to GRAPHS_PER_BOUND tuples, oldest dropped."""

    __slots__ = ("_kern", "_call", "_slots", "_blk", "_dims", "_shared", "_graphs", "_prev", "_lock")
    _call: Any  # the driver's cuLaunchKernel (None on the dispatcher path, where _direct never runs)

    def __init__(self, kern: Kernel, grid: Any, block: Any, args: Sequence[Any], shared: int,
                 ptr_args: Sequence[int] | None = None) -> None:  # fmt: skip
        own = kern.clone()  # a private block, so two bound layouts of one kernel never share slots
        own.pack(args)
        self._kern = own
        self._blk = own._block
        if ptr_args is None:
            self._slots = tuple(at + 4 for kind, at, _ in own._plan if kind == 0)
        else:
            slots = []
            for i in ptr_args:
                kind, at, _ = own._plan[i]
                if kind not in (0, 1):
                    raise LaunchError(f"bind: argument {i} of {kern.sig} holds no pointer")
                slots.append(at + 4 if kind == 0 else at)
            self._slots = tuple(slots)
        g = (grid, 1, 1) if type(grid) is int else (tuple(grid) + (1, 1))[:3]
        b = (block, 1, 1) if type(block) is int else (tuple(block) + (1, 1))[:3]
        self._dims = (*g, *b)
        self._shared = shared
        self._call = None if USE_DISPATCHER else own._launch
        self._graphs = GraphCache(GRAPHS_PER_BOUND)
        self._prev: tuple[int, ...] | None = None
        self._lock = threading.Lock()  # one launch at a time: the pointers are written into one block

    def launch(self, ptrs: Sequence[int], stream: Any = 0) -> None:
        key = tuple(ptrs)
        h = stream if type(stream) is int else _stream_handle(stream)
        hs = ctypes.c_void_p(h) if h else None
        bind_thread()
        with self._lock:
            if hs is not None and capturing(hs):
                # the caller is recording its own CUDA graph on this stream: launch directly, so that the
                # launch lands in their graph as it is (no graph of ours captured, none replayed into theirs)
                self._write(key)
                self._direct(hs)
                return
            graph = self._graphs.find(key)
            if graph is not None:
                graph.launch(hs)
                return
            self._write(key)
            if key == self._prev and GRAPH_REPLAY:
                self._graphs.add(key, self._direct).launch(hs)  # captures the block as just written
                return
            self._prev = key
            self._direct(hs)

    def _write(self, key: tuple[int, ...]) -> None:
        blk = self._blk
        for slot, p in zip(self._slots, key, strict=True):
            blk[slot] = p

    def _direct(self, hs: Any) -> None:
        k = self._kern
        gx, gy, gz, bx, by, bz = self._dims
        rc = self._call(k._func, gx, gy, gz, bx, by, bz, self._shared, hs, k._params, None)
        if rc != 0:
            raise LaunchError(f"cuLaunchKernel failed with CUresult {rc} for {k.sig}")


# Graph replay of repeat calls (Bound, above, and clip_grad_norm's two-launch plan). Off: every call launches
# directly (the stubbed-driver tests turn it off).
GRAPH_REPLAY = True
GRAPHS_PER_BOUND = 4


class LaunchGraph:
    """A fixed sequence of kernel launches captured once into a CUDA graph and replayed by one cuGraphLaunch.

    `record(stream)` issues the launches (cuLaunchKernel calls on `stream`, a CUstream as ctypes.c_void_p);
    it runs once, under stream capture on a private stream, so nothing executes then. The driver copies
    every kernel's parameters at capture: a replay runs exactly the arguments packed then, whatever the
    parameter blocks hold later. `launch(stream)` queues the whole sequence on `stream` (None: the legacy
    default stream), ordered after the stream's earlier work like the launches it replaces.

    Why: an op of two kernels (clip_grad_norm's "two") pays the driver's launch cost twice per call; one
    graph launch pays it once (benchmarks/notes-clip.md, "Host overhead").
    """

    __slots__ = ("_exec", "_call", "_graph", "_nodes", "_updates")
    _exec: Any  # the CUgraphExec handle, None once closed

    def __init__(self, record: Callable[[Any], None], *, updatable: bool = False) -> None:
        """`updatable`: keep the captured graph and its kernel nodes in launch order, so that
        `set_kernel_params` can change a launch's arguments in the executable graph later."""
        lib = _driver()
        s = ctypes.c_void_p()
        _check(lib.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")  # 1: CU_STREAM_NON_BLOCKING
        graph = ctypes.c_void_p()
        keep = False  # the captured graph outlives this call only when updatable and all went well
        try:
            # 2: CU_STREAM_CAPTURE_MODE_RELAXED: captures this private stream only; other threads unaffected
            _check(lib.cuStreamBeginCapture_v2(s, 2), "cuStreamBeginCapture")
            try:
                record(s)
            finally:
                # ends the capture even when `record` failed, so the stream can be destroyed
                rc = lib.cuStreamEndCapture(s, ctypes.byref(graph))
            _check(rc, "cuStreamEndCapture")
            ex = ctypes.c_void_p()
            _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(ex), graph, ctypes.c_ulonglong(0)),
                   "cuGraphInstantiateWithFlags")  # fmt: skip
            try:
                self._nodes = _chain(lib, graph) if updatable else ()
            except LaunchError:
                lib.cuGraphExecDestroy(ex)
                raise
            keep = updatable
        finally:
            if graph.value and not keep:
                lib.cuGraphDestroy(graph)  # the executable graph keeps what it needs
            lib.cuStreamDestroy_v2(s)
        self._graph = graph if updatable else None  # node handles stay valid while their graph lives
        self._exec = ex
        self._call = lib.cuGraphLaunch
        self._updates: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # set_kernel_params' structs, built once

    def launch(self, stream: Any = None) -> None:
        rc = self._call(self._exec, stream)
        if rc != 0:
            raise LaunchError(f"cuGraphLaunch failed with CUresult {rc}")

    def set_kernel_params(self, i: int, kern: Kernel, grid: int, block: int, shared: int = 0) -> None:
        """Launch i (in the order `record` issued them) takes `kern`'s parameter block as it is now, from
        the next replay on (replays already queued keep the arguments they had: the driver copies them).
        One driver call (cuGraphExecKernelNodeSetParams), no new capture. Needs `updatable`. The node
        parameters (function, dims, the address of `kern`'s parameter block) are built once per (i, kern,
        dims): a caller that rewrites a value in that block and updates again (clip's new max_norm) pays
        the driver call alone; the driver reads the block's contents at each call."""
        key = (i, id(kern), grid, block, shared)
        hit = self._updates.get(key)
        if hit is None:
            p = _KernelNodeParams(kern._func, grid, 1, 1, block, 1, 1, shared, ctypes.addressof(kern._params))
            lib = _driver()
            fn = getattr(lib, "cuGraphExecKernelNodeSetParams_v2", None) or lib.cuGraphExecKernelNodeSetParams
            # p and kern held with it: the struct and the block it points to stay where they are
            hit = self._updates[key] = (fn, ctypes.byref(p), p, kern)
        _check(hit[0](self._exec, self._nodes[i], hit[1]), "cuGraphExecKernelNodeSetParams")

    def close(self) -> None:
        """Free the executable graph (a replay still in flight completes first: the driver defers it)."""
        if self._exec is not None:
            _driver().cuGraphExecDestroy(self._exec)
            self._exec = None
        if self._graph is not None:
            _driver().cuGraphDestroy(self._graph)
            self._graph = None


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (its first ten fields are the v1 struct: either entry point reads it)."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("params", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]

    def __init__(self, func: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int,
                 params: int) -> None:  # fmt: skip
        super().__init__(func, (gx, gy, gz), (bx, by, bz), shared, params, None, None, None)


def _chain(lib: Any, graph: Any) -> tuple[Any, ...]:
    """The nodes of a captured linear sequence of launches, in launch order (root, then each one's single
    dependent). A graph that is not a chain is an error: its launch order is not defined by its edges."""
    nodes: list[Any] = []
    arr = (ctypes.c_void_p * 2)()
    n = ctypes.c_size_t(2)
    _check(lib.cuGraphGetRootNodes(graph, arr, ctypes.byref(n)), "cuGraphGetRootNodes")
    while n.value:
        if n.value != 1:
            raise LaunchError(f"an updatable launch graph must be a chain; a node has {n.value} successors")
        nodes.append(ctypes.c_void_p(arr[0]))
        n = ctypes.c_size_t(2)
        rc = lib.cuGraphNodeGetDependentNodes(nodes[-1], arr, ctypes.byref(n))
        _check(rc, "cuGraphNodeGetDependentNodes")
    return tuple(nodes)


class GraphCache:
    """Captured launch graphs by key, at most `size` of them, the oldest freed first (its operands may be long
    gone). `find(key, tag)`: the graph stored under `key` with this very `tag` object, else None: a caller
    whose key holds an id() passes that object as the tag, so a reused id cannot match. `add(key, record,
    tag)` captures `record` into a LaunchGraph, stores it and returns it."""

    __slots__ = ("_d", "size")

    def __init__(self, size: int) -> None:
        self._d: dict[Any, tuple[Any, LaunchGraph]] = {}
        self.size = size

    def find(self, key: Any, tag: Any = None) -> LaunchGraph | None:
        hit = self._d.get(key)
        return hit[1] if hit is not None and hit[0] is tag else None

    def add(self, key: Any, record: Callable[[Any], None], tag: Any = None) -> LaunchGraph:
        if len(self._d) >= self.size:
            self._d.pop(next(iter(self._d)))[1].close()
        graph = LaunchGraph(record)
        self._d[key] = (tag, graph)  # holds the tag: its id cannot be reused while the entry lives
        return graph

    def keys(self) -> list[Any]:
        """The keys, oldest first."""
        return list(self._d)


def capturing(hs: Any) -> bool:
    """Whether the stream `hs` (a CUstream as ctypes.c_void_p) is being captured into a CUDA graph, by the
    caller (torch.cuda.graph, cudaStreamBeginCapture...). Launchers then launch directly: their launches go
    into the caller's graph as plain kernel nodes, and no graph of their own is captured or replayed there. A
    query the driver refuses (a capture in a mode that forbids it) counts as capturing. The legacy default
    stream (None) cannot be captured: not asked."""
    st = ctypes.c_int()
    rc = _driver().cuStreamIsCapturing(hs, ctypes.byref(st))
    return rc != 0 or st.value != 0


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise LaunchError(f"{what} failed with CUresult {rc}")


class Replayable(Protocol):
    """What FastCache keeps: a validated launch that runs again with new data pointers (Bound, or an op's
    own, e.g. kernels.ops.gemm.Replay)."""

    def launch(self, ptrs: Sequence[int], stream: Any) -> None: ...


class OverlapGuard:
    """A FastCache entry for a launcher with aliasing rules (kernels.runtime.arrays.Overlap): FastCache keys
    by layout, not address, so a hit checks the new pointers against the rules the validating call checked
    (operand i spans spans[i] bytes, C-contiguous) before it replays `bound`."""

    __slots__ = ("bound", "spans", "names", "rules")

    def __init__(
        self, bound: Replayable, spans: Sequence[int], names: Sequence[str], rules: tuple[arrays.Overlap, ...]
    ) -> None:
        self.bound, self.spans, self.names, self.rules = bound, tuple(spans), tuple(names), rules

    @classmethod
    def over(
        cls, bound: Replayable, ops: Sequence[Operand], rules: tuple[arrays.Overlap, ...]
    ) -> OverlapGuard:
        """`bound` behind `rules` over the validated operands `ops`, given in the FastCache key's order: each
        operand's name and byte span (C-contiguous) are the ones the validating call checked."""
        return cls(bound, [op.size * op.dtype.itemsize for op in ops], [op.name for op in ops], rules)

    def launch(self, ptrs: Sequence[int], stream: Any) -> None:
        sp = self.spans
        for i, j, same_ok, why in self.rules:
            pi, pj = ptrs[i], ptrs[j]
            if pi < pj + sp[j] and pj < pi + sp[i] and not (same_ok and pi == pj):
                raise ValueError(arrays.overlap_message(self.names[i], self.names[j], same_ok, why))
        self.bound.launch(ptrs, stream)


class FastCache:
    """Per-launcher cache of validated launches, keyed by the current CUDA context (`context`: a launch, its
    compiled function and its graphs belong to one) and the operands' layout (shape, strides, dtype of each
    array, 16-byte alignment of all pointers) plus the launcher's own options. A hit skips every check and
    the packing: the launcher validated exactly this layout on the call that stored it, and only the
    pointers differ. Device arrays only (numba, CuPy, __cuda_array_interface__); off under the simulator /
    the dispatcher launch path, where `find` always misses.

    Why: issue 4's host-overhead goal (<= 10 us per op call); the checks and packing of a launcher cost
    ~5-7 us of Python per call, a hit ~1-2 us (benchmarks/notes-memory.md, "Host overhead")."""

    MAX = 64  # entries per context: one GPU's layouts never crowd out another's

    __slots__ = ("_d", "_n")

    def __init__(self) -> None:
        self._d: dict[Any, Replayable] = {}
        self._n: dict[int, int] = {}  # entries per context

    def find(self, objs: tuple[Any, ...], opts: Any) -> tuple[Replayable | None, list[int]]:
        if USE_DISPATCHER:
            return None, []
        get = _EXTRACTORS.get  # filled by arrays.operand on the validating call; a miss is a cache miss
        ptrs: list[int] = []
        key: list[Any] = [context(), opts]
        acc = 0
        for o in objs:
            ex = get(type(o))
            if ex is None:
                return None, ptrs
            p, sh, st, dt = ex(o)
            ptrs.append(p)
            acc |= p
            key.append((sh, st, dt))
        key.append(acc & 15)
        return self._d.get(tuple(key)), ptrs

    def store(self, objs: tuple[Any, ...], opts: Any, bound: Replayable) -> None:
        if USE_DISPATCHER:
            return
        ctx = context()
        if self._n.get(ctx, 0) >= self.MAX:
            return
        key: list[Any] = [ctx, opts]
        acc = 0
        for o in objs:
            ex = arrays.fast_extractor(type(o))
            if ex is None:
                return
            p, sh, st, dt = ex(o)
            acc |= p
            key.append((sh, st, dt))
        key.append(acc & 15)
        k = tuple(key)
        if k not in self._d:
            self._n[ctx] = self._n.get(ctx, 0) + 1
        self._d[k] = bound

    def clear(self) -> None:
        self._d.clear()
        self._n.clear()


def _dispatchable(a: Any, t: Any) -> Any:
    """What numba's dispatcher takes for one argument: the operand's array, seen flat for a 1-d slot."""
    if not isinstance(a, Operand):
        return a
    if isinstance(t, types.Array) and t.ndim == 1 and len(a.shape) != 1:
        return arrays.words(a.flat().dev)
    return arrays.words(a.dev)  # bf16 operands fill uint16 slots (kernels.primitives.bf16)


def _stream_handle(stream: Any) -> int:
    """The CUstream address of a numba Stream, a CuPy Stream (`.ptr`) or a raw handle."""
    h = getattr(stream, "handle", None)
    if h is None:
        h = getattr(stream, "ptr", stream)
    h = getattr(h, "value", h)
    return int(h or 0)


STATIC_SMEM_LIMIT = 48 * 1024  # shared memory a kernel may use without asking for more
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def dynamic_smem(nbytes: int) -> Callable[[int], None]:
    """An `on_load` that raises a loaded CUfunction's dynamic shared-memory limit to `nbytes` (numba exposes
    no setter; the default is 48 KB, so a smaller request needs nothing). The mma and wgmma tiles use it."""

    def allow(func: int) -> None:
        if nbytes <= STATIC_SMEM_LIMIT:
            return
        drv = _driver()
        drv.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        rc = drv.cuFuncSetAttribute(
            ctypes.c_void_p(func), _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes
        )
        if rc != 0:
            raise LaunchError(
                f"cuFuncSetAttribute(max dynamic shared = {nbytes} B) failed with CUresult {rc}"
            )

    return allow


def kernel(dispatcher: Any, sig: str, on_load: Callable[[int], None] | None = None) -> Kernel:
    """The fast-launch handle of `dispatcher` at `sig` (compiled on first launch in each context, where
    `on_load` then runs with the new CUfunction)."""
    return Kernel(dispatcher, sig, on_load)


def sm_count(ctx: int | None = None) -> int:
    """Multiprocessors of the current device (`ctx`: its context, when the caller asked already), asked
    once per context (a small fixed number under the simulator)."""
    if ctx is None:
        ctx = context()
    n = _SM.get(ctx)
    if n is None:
        n = _SM[ctx] = 4 if SIMULATED else int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return n


_SM: dict[int, int] = {}


def smem_optin(ctx: int | None = None) -> int:
    """Bytes of shared memory one block may use on the current device after opting in (dynamic_smem): 227 KB
    on sm_90, 163 KB on sm_80, 99 KB on sm_86 / sm_89. Asked once per context; under the simulator, as much as
    any kernel asks; 0 without a usable GPU (a selection rule asked on a machine with none)."""
    if SIMULATED:
        return 1 << 30
    if not _OPTIN and not cuda.is_available():
        return 0
    if ctx is None:
        ctx = context()
    n = _OPTIN.get(ctx)
    if n is None:
        n = _OPTIN[ctx] = int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    return n


_OPTIN: dict[int, int] = {}
