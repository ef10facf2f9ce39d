"""Offline model of gemm_wgmma.cu's shared-memory layouts against the wgmma descriptors it builds.

Writes every 16-byte chunk of one stage where wg_load puts it, tagged with the (row, k) or (k, n) of its first
element, then reads every element of every k-step's operand back the way the hardware does for that
descriptor: the canonical layouts of the PTX ISA (section "Shared Memory Matrix Layout", 128-byte swizzle;
CUTLASS's make_gmma_desc uses the same forms), then the swizzle (byte address bits 4-6 ^= bits 7-9).
It checks that the code's copy plan and its descriptors agree; not that the hardware agrees with the
documentation (only the H200 run shows that).

    python lab/wgmma/layout_model.py
"""

from __future__ import annotations

BK = 64


def swz(addr: int) -> int:
    return addr ^ (((addr >> 7) & 7) << 4)


def store_a(bm: int) -> dict[int, tuple[int, int]]:
    """byte offset -> (row, k) of each element, as wg_load's A part writes it (chunk c of row r)."""
    mem = {}
    for r in range(bm):
        for c in range(8):
            off = r * 128 + ((c ^ (r & 7)) << 4)
            for e in range(8):
                mem[off + 2 * e] = (r, c * 8 + e)
    return mem


def store_b_nn(bn: int) -> dict[int, tuple[int, int]]:
    """byte offset -> (k, n), wg_load's WG_BT == 0 branch."""
    mem = {}
    for kr in range(BK):
        for cn in range(bn // 8):
            off = ((cn >> 3) * (BK // 8) + (kr >> 3)) * 1024 + (kr & 7) * 128 + (((cn & 7) ^ (kr & 7)) << 4)
            for e in range(8):
                mem[off + 2 * e] = (kr, cn * 8 + e)
    return mem


def read_kmajor(mem: dict[int, tuple[int, int]], start: int, rows: int, sbo: int) -> None:
    """K-major, 128B swizzle: ((8,m),(T,2)):((8T,SBO),(1,T)), T = 8 elements; row r, k in 0..15."""
    for r in range(rows):
        r0, r1 = r % 8, r // 8
        for k in range(16):
            k0, k1 = k % 8, k // 8
            elem = 64 * r0 + (sbo // 2) * r1 + k0 + 8 * k1
            got = mem[swz(start + 2 * elem)]
            want_k = (start % 128) // 2 + k  # the k-step's first k within the 64-wide slice
            assert got == (r, want_k), (r, k, got, want_k)


def read_nmajor(mem: dict[int, tuple[int, int]], start: int, n: int, kbase: int, lbo: int, sbo: int) -> None:
    """MN-major, 128B swizzle: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)); element (n, k), k in 0..15."""
    for nn in range(n):
        n0, n1, n2 = nn % 8, (nn // 8) % 8, nn // 64
        for k in range(16):
            k0, k1 = k % 8, k // 8
            elem = n0 + 8 * n1 + (lbo // 2) * n2 + 64 * k0 + (sbo // 2) * k1
            got = mem[swz(start + 2 * elem)]
            assert got == (kbase + k, nn), (nn, k, got)


def main() -> None:
    for bn in (128, 256):
        a = store_a(128)
        for wg in range(2):
            for kk in range(BK // 16):
                # rows of this warpgroup: the descriptor's row 0 is tile row 64 wg
                sub = {
                    addr - wg * 64 * 128: (r - 64 * wg, kcol)
                    for addr, (r, kcol) in a.items()
                    if r // 64 == wg
                }
                read_kmajor(sub, kk * 32, 64, 1024)
        b = store_b_nn(bn)
        for kk in range(BK // 16):
            read_nmajor(b, kk * 2048, bn, kk * 16, (BK // 8) * 1024, 1024)
        # NT B is A's layout with bn rows
        bt = store_a(bn)
        for kk in range(BK // 16):
            read_kmajor(bt, kk * 32, bn, 1024)
        print(
            f"bn {bn}: A (both warpgroups), B nn (N-major), B nt (K-major): each k-step reads what was stored"
        )


if __name__ == "__main__":
    main()
