#!/usr/bin/python3
# The int8 tensor-core kernels (k_lin_tc8_q4k, then k_lin_tc8 for Q8_0 and Q4_0) emulated on the host.
#   /usr/bin/python3 scripts/dev/check_tc8.py  -> "max rel err" <= ~3e-8 for each when the indexing is right
# Host emulation of k_lin_tc8_q4k's index arithmetic for one (tile, warp): builds each lane's
# fragment registers from the shared-memory images the kernel's load() writes, assembles the
# A (16x32) and B (32x8) matrices per the PTX m16n8k32 .s8 layout, runs the mma, scatters C back
# per the layout and applies the kernel's epilogue; compares with the reference integer function.
import numpy as np
rng = np.random.default_rng(1)
BM, N, cols = 64, 128, 512
T, rows = 40, 100
nsb, np_ = cols // 256, cols // 64
X = rng.integers(-127, 128, (T, cols)).astype(np.int8)
xd = rng.random((T, nsb)).astype(np.float32)
# Q4_K rows: per super-block d, dmin, 6-bit sc/m (kept unpacked here), 128 bytes of nibbles.
d = rng.random((rows, nsb)).astype(np.float32); dm = rng.random((rows, nsb)).astype(np.float32)
sc = rng.integers(0, 64, (rows, nsb, 8)); mn = rng.integers(0, 64, (rows, nsb, 8))
Q = rng.integers(0, 16, (rows, nsb, 8, 32))  # quant k of sub-block j
qs = np.zeros((rows, nsb, 128), np.uint8)
for p in range(4):  # pair p: bytes 32p..32p+31, sub-block 2p low nibbles, 2p+1 high
    qs[:, :, 32*p:32*p+32] = Q[:, :, 2*p, :] | (Q[:, :, 2*p+1, :] << 4)
# Reference: y[t][r] = sum_sb xd * (d sum_j sc_j isum_j - dm sum_j m_j bsum_j)
ref = np.zeros((T, rows))
for t in range(T):
    for r in range(rows):
        acc = 0.0
        for sb in range(nsb):
            xs = X[t, sb*256:(sb+1)*256].astype(np.int64).reshape(8, 32)
            isum = (xs * Q[r, sb]).sum(1); bsum = xs.sum(1)
            acc += xd[t, sb] * (d[r, sb] * (sc[r, sb] * isum).sum() - dm[r, sb] * (mn[r, sb] * bsum).sum())
        ref[t, r] = acc
# Kernel emulation, tile (t0=0, r0=0), all 8 warps.
y = np.zeros((T, rows))
t0, r0 = 0, 0
acc = np.zeros((8, 32, BM // 32, 4, 4))
for p in range(np_):
    sb, pp = p // 4, p % 4
    As = np.zeros((BM, 80), np.int8); Bs = np.zeros((N, 48), np.uint8)
    Ad = np.zeros(BM, np.float32); Bsc = np.zeros((2, N), np.float32); Bmn = np.zeros((2, N), np.float32)
    for rr in range(BM):
        if t0 + rr < T:
            As[rr, :64] = X[t0 + rr, p*64:p*64+64]; Ad[rr] = xd[t0 + rr, sb]
    for rr in range(N):
        if r0 + rr < rows:
            Bs[rr, :32] = qs[r0 + rr, sb, 32*pp:32*pp+32]
            for s in range(2):
                Bsc[s, rr] = d[r0+rr, sb] * sc[r0+rr, sb, 2*pp+s]; Bmn[s, rr] = dm[r0+rr, sb] * mn[r0+rr, sb, 2*pp+s]
    for warp in range(8):
        wm, wn = warp // 4, warp % 4
        for s in range(2):
            for i in range(BM // 32):
                for j in range(4):
                    A = np.zeros((16, 32), np.int64); B = np.zeros((32, 8), np.int64)
                    bs = {}
                    for lane in range(32):
                        g, tq = lane // 4, lane % 4
                        arow = wm * (BM // 2) + g + i * 16
                        acol = 4 * tq + 32 * s
                        a0 = As[arow, acol:acol+4]; a1 = As[arow+8, acol:acol+4]
                        a2 = As[arow, acol+16:acol+20]; a3 = As[arow+8, acol+16:acol+20]
                        brow = wn * 32 + g + j * 8
                        wlo = Bs[brow, 4*tq:4*tq+4]; whi = Bs[brow, 16+4*tq:16+4*tq+4]
                        b0 = (wlo >> (4*s)) & 15; b1 = (whi >> (4*s)) & 15
                        # PTX layout
                        A[g, 4*tq:4*tq+4] = a0; A[g+8, 4*tq:4*tq+4] = a1
                        A[g, 16+4*tq:20+4*tq] = a2; A[g+8, 16+4*tq:20+4*tq] = a3
                        B[4*tq:4*tq+4, g] = b0; B[16+4*tq:20+4*tq, g] = b1
                        bs[lane] = (int(a0.astype(np.int64).sum() + a2.astype(np.int64).sum()), int(a1.astype(np.int64).sum() + a3.astype(np.int64).sum()))
                    C = A @ B
                    for lane in range(32):
                        g, tq = lane // 4, lane % 4
                        quad = [l for l in range(32) if l // 4 == g]
                        f0 = sum(bs[l][0] for l in quad); f1 = sum(bs[l][1] for l in quad)
                        c = [C[g, 2*tq], C[g, 2*tq+1], C[g+8, 2*tq], C[g+8, 2*tq+1]]
                        x0 = Ad[wm*(BM//2) + g + i*16]; x1 = Ad[wm*(BM//2) + g + i*16 + 8]
                        n0 = wn*32 + 2*tq + j*8
                        ws = [Bsc[s, n0], Bsc[s, n0+1]]; wmm = [Bmn[s, n0], Bmn[s, n0+1]]
                        a = acc[warp, lane, i, j]
                        a[0] += x0 * (ws[0]*c[0] - wmm[0]*f0); a[1] += x0 * (ws[1]*c[1] - wmm[1]*f0)
                        a[2] += x1 * (ws[0]*c[2] - wmm[0]*f1); a[3] += x1 * (ws[1]*c[3] - wmm[1]*f1)
for warp in range(8):
    wm, wn = warp // 4, warp % 4
    for lane in range(32):
        g, tq = lane // 4, lane % 4
        for i in range(BM // 32):
            for j in range(4):
                n = r0 + wn*32 + j*8 + 2*tq
                for hh in range(2):
                    t = t0 + wm*(BM//2) + i*16 + g + 8*hh
                    if t >= T: continue
                    if n < rows: y[t, n] = acc[warp, lane, i, j, 2*hh]
                    if n + 1 < rows: y[t, n+1] = acc[warp, lane, i, j, 2*hh+1]
err = np.abs(y - ref).max() / np.abs(ref).max()
print("q4k tc emulation: max rel err %.2e (rows %d, T %d)" % (err, rows, T))

# k_lin_tc8 (Q8_0 / Q4_0, repacked: a row's quants end to end, Q4_0 16 bytes a block with quant
# i in byte i's low nibble and i + 16 in its high one; f16 scales per block): the same emulation.
for DT in ("q8_0", "q4_0"):
    cols, T, rows, BM = 256, 40, 100, 64
    nb = cols // 32
    X = rng.integers(-127, 128, (T, cols)).astype(np.int8)
    xd = rng.random((T, nb)).astype(np.float32)
    Wq = rng.integers(-127, 128, (rows, cols)) if DT == "q8_0" else rng.integers(-8, 8, (rows, cols))
    wd = rng.random((rows, nb)).astype(np.float32)
    if DT == "q8_0":
        packed = Wq.astype(np.int8).view(np.uint8).reshape(rows, nb, 32)
    else:
        u = (Wq + 8).astype(np.uint8).reshape(rows, nb, 32)
        packed = u[:, :, :16] | (u[:, :, 16:] << 4)
    ref = np.zeros((T, rows))
    for t in range(T):
        for r in range(rows):
            ref[t, r] = sum(xd[t, b] * wd[r, b] * int((X[t, 32*b:32*b+32].astype(np.int64) * Wq[r, 32*b:32*b+32]).sum()) for b in range(nb))
    acc = np.zeros((8, 32, BM // 32, 4, 4))
    for kb in range(nb):
        As = np.zeros((BM, 48), np.int8); Bs = np.zeros((128, 48), np.uint8)
        Ad = np.zeros(BM, np.float32); Bd = np.zeros(128, np.float32)
        As[:T, :32] = X[:, 32*kb:32*kb+32]; Ad[:T] = xd[:, kb]
        WB = 32 if DT == "q8_0" else 16
        Bs[:rows, :WB] = packed[:, kb, :]; Bd[:rows] = wd[:, kb]
        for warp in range(8):
            wm, wn = warp // 4, warp % 4
            for i in range(BM // 32):
                for j in range(4):
                    A = np.zeros((16, 32), np.int64); B = np.zeros((32, 8), np.int64)
                    for lane in range(32):
                        g, tq = lane // 4, lane % 4
                        ar = wm * (BM // 2) + g + i * 16
                        A[g, 4*tq:4*tq+4] = As[ar, 4*tq:4*tq+4]; A[g+8, 4*tq:4*tq+4] = As[ar+8, 4*tq:4*tq+4]
                        A[g, 16+4*tq:20+4*tq] = As[ar, 16+4*tq:20+4*tq]; A[g+8, 16+4*tq:20+4*tq] = As[ar+8, 16+4*tq:20+4*tq]
                        br = wn * 32 + g + j * 8
                        if DT == "q8_0":
                            b0 = Bs[br, 4*tq:4*tq+4].view(np.int8); b1 = Bs[br, 16+4*tq:20+4*tq].view(np.int8)
                        else:
                            w = Bs[br, 4*tq:4*tq+4].astype(np.int64)
                            b0 = (w & 15) - 8; b1 = ((w >> 4) & 15) - 8  # __vsub4 of the masked nibbles
                        B[4*tq:4*tq+4, g] = b0; B[16+4*tq:20+4*tq, g] = b1
                    C = A @ B
                    for lane in range(32):
                        g, tq = lane // 4, lane % 4
                        s0 = Ad[wm*(BM//2) + g + i*16]; s1 = Ad[wm*(BM//2) + g + i*16 + 8]
                        n0 = wn*32 + j*8 + 2*tq
                        a = acc[warp, lane, i, j]
                        a[0] += C[g, 2*tq] * (s0 * Bd[n0]); a[1] += C[g, 2*tq+1] * (s0 * Bd[n0+1])
                        a[2] += C[g+8, 2*tq] * (s1 * Bd[n0]); a[3] += C[g+8, 2*tq+1] * (s1 * Bd[n0+1])
    y = np.zeros((T, rows))
    for warp in range(8):
        wm, wn = warp // 4, warp % 4
        for lane in range(32):
            g, tq = lane // 4, lane % 4
            for i in range(BM // 32):
                for j in range(4):
                    n = wn*32 + j*8 + 2*tq
                    for hh in range(2):
                        t = wm*(BM//2) + i*16 + g + 8*hh
                        if t >= T: continue
                        if n < rows: y[t, n] = acc[warp, lane, i, j, 2*hh]
                        if n + 1 < rows: y[t, n+1] = acc[warp, lane, i, j, 2*hh+1]
    print("%s tc emulation: max rel err %.2e (rows %d, T %d)" % (DT, np.abs(y - ref).max() / np.abs(ref).max(), rows, T))
