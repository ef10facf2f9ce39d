"""`bench --plot roofline.png`: every benchmarked op as a point (arithmetic intensity, achieved TFLOP/s)
under the ceilings: the memory roof (measured copy bandwidth x intensity), the fp32 FMA peak and, where
the device has one, the dense fp16 tensor-core peak (what the `mma` path of gemm/o_proj is bound by).
matplotlib is an optional dependency (`pip install solfleet[plot]`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any


def plot(report: dict[str, Any], path: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"--plot needs matplotlib (pip install 'solfleet[plot]'): {e}") from e
    import numpy as np

    peaks = report["peaks"]
    bw = float(peaks["mem_gbs"]) / 1e3  # TB/s: TFLOP/s per (FLOP/byte)
    fp = float(peaks["fp32_tflops"] or 0.0)
    rows = [r for r in report["results"] if r.get("median_us")]
    ai = [r["flops"] / r["bytes"] for r in rows]
    lo = min([0.01, *ai]) / 2
    hi = max([100.0, *ai]) * 2
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig, ax = plt.subplots(figsize=(11, 5.5))
    ax.loglog(xs, np.minimum(xs * bw, fp) if fp else xs * bw, "k-", lw=1.5,
              label=f"roof: {bw:.2f} TB/s copy, {fp:.1f} TFLOP/s fp32")  # fmt: skip
    tc = float(peaks.get("fp16_tensor_tflops") or 0.0)
    if tc:
        ax.loglog(xs, np.minimum(xs * bw, tc), "k--", lw=1, label=f"roof: {tc:.0f} TFLOP/s fp16 tensor cores")
    colors = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]  # a ListedColormap
    seen = Counter((r["op"], r["dtype"], r.get("case")) for r in rows)
    for i, (r, x) in enumerate(zip(rows, ai, strict=True)):
        marker = "o" if r["dtype"] == "float32" else "s"  # one colour per point: tab20 has 20
        kernel = (
            f" {r.get('path')}" if seen[(r["op"], r["dtype"], r.get("case"))] > 1 else ""
        )  # two kernels of a case
        ax.loglog([x], [r["tflops"]], marker, color=colors[i % len(colors)],
                  label=f"{r['op']} {r['dtype']}{kernel} ({r.get('sol', 0) or 0:.2f} SOL)")  # fmt: skip
        if r.get("cupy", {}).get("tflops"):
            ax.loglog([x], [r["cupy"]["tflops"]], "x", color="gray")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of the floor)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"{report['device'].get('name', '?')}: ops vs measured ceilings (x = CuPy)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never hides a point
    out = Path(path)
    # "tight" grows the canvas to hold the legend outside the axes (tight_layout cannot fit ~100 entries and
    # warns on every table)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out
