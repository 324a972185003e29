#!/usr/bin/env python3
"""Checks the ldmatrix tensor-core product (kernels.cu, k_lin_tc<BM, true>) on the host: each lane's
ldmatrix.x4 row address (A: row lane % 16 of the m16 tile at column 8 (lane / 16); B: weight
row (lane % 8) + 8 (lane / 16) of an n-tile pair at column 8 ((lane / 8) % 2)), ldmatrix's
distribution (lane l gets row l / 4, elements 2 (l % 4) and +1 of matrix i into register i,
matrix i's rows addressed by lanes 8i..8i+7), and m16n8k16's fragment layout (A: a0 rows g,
columns 2t, 2t+1; a1 rows g+8; a2, a3 the same at +8 columns; B: b0 k rows 2t, 2t+1 of column
g, b1 at +8; C: rows g / g+8, columns 2t, 2t+1), for every warp, m-tile, n-tile and k-step of
a 64-column slice, against the slices' product in float64. Needs numpy."""
import numpy as np

rng = np.random.default_rng(3)
TCN, K2, LD = 128, 64, 72


def ldmatrix_x4(smem, addrs):
    """addrs[lane] = (row, col) of the 8 consecutive elements lane provides; returns
    regs[lane][i] = the two elements lane receives from matrix i."""
    regs = np.zeros((32, 4, 2))
    for i in range(4):
        rows = [smem[addrs[8 * i + r][0], addrs[8 * i + r][1]:addrs[8 * i + r][1] + 8] for r in range(8)]
        for lane in range(32):
            regs[lane, i] = rows[lane // 4][2 * (lane % 4):2 * (lane % 4) + 2]
    return regs


def mma(a, b):
    """a[lane] = (a0, a1, a2, a3) pairs, b[lane] = (b0, b1) pairs -> C[16, 8] as the lanes hold it."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        A[g, 2 * t:2 * t + 2] = a[lane][0]
        A[g + 8, 2 * t:2 * t + 2] = a[lane][1]
        A[g, 2 * t + 8:2 * t + 10] = a[lane][2]
        A[g + 8, 2 * t + 8:2 * t + 10] = a[lane][3]
        B[2 * t:2 * t + 2, g] = b[lane][0]
        B[2 * t + 8:2 * t + 10, g] = b[lane][1]
    return A @ B


for BM in (64, 128):
    MT = BM // 32
    As = rng.standard_normal((BM, LD))
    Bs = rng.standard_normal((TCN, LD))
    want = As[:, :K2] @ Bs[:, :K2].T  # [t, n]
    worst = 0.0
    for warp in range(8):
        wm, wn = warp // 4, warp % 4
        acc = np.zeros((MT, 4, 16, 8))
        for kk in range(0, K2, 16):
            bf = []
            for p in range(2):
                addrs = [(wn * 32 + 16 * p + l % 8 + 8 * (l // 16), 8 * ((l // 8) % 2) + kk) for l in range(32)]
                bf.append(ldmatrix_x4(Bs, addrs))
            for i in range(MT):
                addrs = [(wm * (BM // 2) + i * 16 + l % 16, 8 * (l // 16) + kk) for l in range(32)]
                af = ldmatrix_x4(As, addrs)
                for j in range(4):
                    b = [(bf[j // 2][l, 2 * (j % 2)], bf[j // 2][l, 2 * (j % 2) + 1]) for l in range(32)]
                    acc[i, j] += mma([tuple(af[l]) for l in range(32)], b)
        for i in range(MT):
            for j in range(4):
                t0 = wm * (BM // 2) + i * 16
                n0 = wn * 32 + j * 8
                worst = max(worst, np.abs(acc[i, j] - want[t0:t0 + 16, n0:n0 + 8]).max())
    print("BM %d: max |ldmatrix tiles - A B^T| %.1e" % (BM, worst))
    assert worst < 1e-9
