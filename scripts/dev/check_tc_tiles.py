#!/usr/bin/env python3
"""Checks the CUDA tensor-core product's tiling (kernels.cu, k_lin_tc) on the host: its grid
of (weight-row tile, input-row tile) blocks over a job of several matrices, each block's 8 warps
(2 x 4) and their m16n8k16 fragments (A rows g / g+8, columns 2t, 2t+1 and +8; B k rows 2t,
2t+1 and +8, column g; C rows g / g+8, columns 2t, 2t+1), the 32-column slices, the zero-filled
edges and the epilogue's row/column arithmetic, against X W^T in float64. Needs numpy."""
import numpy as np

rng = np.random.default_rng(2)
TCN, TCK = 128, 32


def run(ws, x, BM):
    T, cols = x.shape
    tiles, wend = 0, []
    for w in ws:
        tiles += (w.shape[0] + TCN - 1) // TCN
        wend.append(tiles)
    ys = [np.full((T, w.shape[0]), np.nan) for w in ws]
    MT = BM // 32
    for bx in range(tiles):
        m = 0
        while bx >= wend[m]:
            m += 1
        r0 = (bx - (wend[m - 1] if m else 0)) * TCN
        W, rows = ws[m], ws[m].shape[0]
        for by in range((T + BM - 1) // BM):
            t0 = by * BM
            acc = np.zeros((8, MT, 4, 32, 4))  # warp, m-tile, n-tile, lane, element
            for kt in range(cols // TCK):
                As = np.zeros((BM, TCK))
                Bs = np.zeros((TCN, TCK))
                for rr in range(BM):
                    if t0 + rr < T:
                        As[rr] = x[t0 + rr, kt * TCK:(kt + 1) * TCK]
                for rr in range(TCN):
                    if r0 + rr < rows:
                        Bs[rr] = W[r0 + rr, kt * TCK:(kt + 1) * TCK]
                for warp in range(8):
                    wm, wn = warp // 4, warp % 4
                    for kk in (0, 16):
                        for i in range(MT):
                            for j in range(4):
                                for lane in range(32):
                                    g, t = lane // 4, lane % 4
                                    # this lane's C elements, each the dot of an A row and a B column
                                    for e in range(4):
                                        row = wm * (BM // 2) + i * 16 + g + (8 if e >= 2 else 0)
                                        col = wn * 32 + j * 8 + 2 * t + (e & 1)
                                        acc[warp, i, j, lane, e] += As[row, kk:kk + 16] @ Bs[col, kk:kk + 16]
            for warp in range(8):
                wm, wn = warp // 4, warp % 4
                for i in range(MT):
                    for j in range(4):
                        for lane in range(32):
                            g, tq = lane // 4, lane % 4
                            n = r0 + wn * 32 + j * 8 + 2 * tq
                            for hh in range(2):
                                tt = t0 + wm * (BM // 2) + i * 16 + g + 8 * hh
                                if tt >= T:
                                    continue
                                if n < rows:
                                    ys[m][tt, n] = acc[warp, i, j, lane, 2 * hh]
                                if n + 1 < rows:
                                    ys[m][tt, n + 1] = acc[warp, i, j, lane, 2 * hh + 1]
    return ys


for T, cols, shapes, BM in ((40, 64, (130, 64, 3), 64), (130, 96, (200, 128), 128)):
    x = rng.standard_normal((T, cols))
    ws = [rng.standard_normal((r, cols)) for r in shapes]
    ys = run(ws, x, BM)
    for w, y in zip(ws, ys):
        err = np.abs(y - x @ w.T).max()
        print("T %d cols %d rows %d BM %d: max |tiles - X W^T| %.1e" % (T, cols, w.shape[0], BM, err))
        assert np.isfinite(y).all() and err < 1e-9
