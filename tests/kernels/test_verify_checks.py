"""The verify harness's checks each fail on a deliberately broken kernel (and pass on the correct one): a
few wrong elements that the norm hides, a NaN swallowed, an infinity made up."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda
from opcheck import needs_device

from kernels.harness import verify
from kernels.registry import Case, OpSpec, Problem
from kernels.runtime.arrays import BF16

N = 4099
WRONG = (5, 777, 4000)  # the elements the broken kernel gets wrong


@cuda.jit
def _copy(x, out, bug):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    while i < x.shape[0]:
        v = x[i]
        if bug == 1 and (i == 5 or i == 777 or i == 4000):
            v = v + 1.0  # a few fully wrong elements
        if bug == 2 and v != v:
            v = 0.0  # a NaN swallowed
        if bug == 3 and i == 9:
            v = math.inf  # an infinity made up
        out[i] = v
        i += cuda.gridsize(1)


def _spec(bug: int, special: bool) -> OpSpec:
    def make(case: Case, rng: np.random.Generator) -> Problem:
        x = rng.standard_normal(N).astype(np.float32)
        if special:
            x[[3, 100, 2000]] = [np.nan, np.inf, -np.inf]
        return Problem(inputs={"x": x}, outputs={"out": ((N,), np.dtype(np.float32))},
                       reference={"out": x.astype(np.float64)})  # fmt: skip

    def launch(a: dict[str, Any]) -> None:
        _copy[4, 32](a["x"], a["out"], bug)

    case = Case("odd", {"n": N}, "float32")
    return OpSpec(name="copy", dtypes=("float32",), make_problem=make, launch=launch, flops=lambda c: 0.0,
                  bytes=lambda c: 8.0 * N, tolerance={"float32": 5e-2}, sim_cases=(case,),
                  verify_cases=(case,), bench_cases=(case,))  # fmt: skip


def _check(bug: int, special: bool) -> verify.CaseResult:
    spec = _spec(bug, special)
    return verify.check_case(spec, spec.sim_cases[0], np.random.default_rng())


@needs_device
def test_correct_kernel_passes_with_nan_and_inf_inputs() -> None:
    assert _check(0, special=True).ok
    assert _check(0, special=False).ok


@needs_device
def test_a_few_wrong_elements_pass_the_norm_and_fail_the_element_bound() -> None:
    r = _check(1, special=False)
    assert r.rel_err is not None and r.rel_err <= 5e-2  # ||err|| / ||ref|| ~ sqrt(3 / 4099): the norm passes
    assert not r.ok and r.error is not None and "per-element error" in r.error, r
    assert r.elem_err is not None and r.elem_err > 0.1


@needs_device
def test_a_swallowed_nan_fails() -> None:
    r = _check(2, special=True)
    assert not r.ok and r.error is not None and "NaN or infinite" in r.error, r


@needs_device
def test_a_made_up_infinity_fails() -> None:
    r = _check(3, special=False)
    assert not r.ok and r.error is not None and "not written or not finite" in r.error, r


def test_errors_measures_both_bounds() -> None:
    ref = np.linspace(-1.0, 1.0, 1001)
    out = ref.copy()
    out[10] += 0.5
    e = verify.errors(out, ref)
    assert e.why is None and e.rel < 0.05 and e.elem > 0.3
    out = ref.copy()
    ref2 = ref.copy()
    ref2[3], out[3] = np.nan, 1.0
    assert "NaN or infinite" in str(verify.errors(out, ref2).why)
    out[3] = np.nan
    assert verify.errors(out, ref2).why is None


def test_subnormal_fp16_outputs_are_measured_from_the_smallest_normal() -> None:
    # Found on an H100 (2026-12-05): clip_grad_norm's Llama-3 case has one-element arrays, and one draw
    # scaled to -1.815e-5, an fp16 subnormal. Its correctly rounded fp16 value is 1.6e-3 off relatively
    # (spacing 2^-24 there), which failed verify's 1e-3 though the kernel was right.
    ref = np.array([-1.81502103e-05])
    out = ref.astype(np.float16)
    assert float(abs(out.astype(np.float64) - ref)[0]) / abs(ref[0]) > 1e-3  # the raw relative error
    e = verify.errors(out, ref)
    assert e.why is None and e.rel <= 2.0**-11 and e.elem <= 2.0**-11
    # the floor is the fp16 smallest normal, not a blanket allowance: two spacings off still fails
    wrong = (out.astype(np.float64) + 2 * 2.0**-24).astype(np.float16)
    assert verify.errors(wrong, ref).rel > 1e-3
    # fp32 and bf16 outputs: the floor is 1.2e-38, so the same value keeps its relative measure
    assert verify.floor_of(np.dtype(np.float16)) == 2.0**-14
    assert verify.floor_of(np.dtype(np.float32)) == verify.floor_of(BF16) == 2.0**-126
    assert verify.floor_of(np.dtype(np.uint8)) == 0.0
    small32 = np.array([1e-30], dtype=np.float32)
    assert verify.errors(small32 * np.float32(1.001), np.array([1e-30])).rel > 5e-4
    # an all-zero reference keeps the absolute measure
    assert verify.errors(np.zeros(4, np.float16), np.zeros(4)).rel == 0.0
