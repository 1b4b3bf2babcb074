#!/usr/bin/env python3
"""Error of a 3x3 convolution in bf16 (operands rounded to bf16, sums in full precision):
direct, Winograd F(2x2, 3x3) and F(4x4, 3x3) (Lavin & Gray 2016; the transformed tiles
rounded to bf16, as a bf16 GEMM over them would round them), each relative to the exact
f64 convolution (norm of the error over norm of the output).

Pure Python (no numpy): a post-ReLU input of C channels, He-initialised filters, valid
convolution, the output tiles that fit whole. Usage:
    python3 scripts/winograd-bf16-error.py [seed] [channels]
"""
import math
import random
import struct
import sys


def bf16(v):
    """v rounded to the nearest bf16 (ties to even), as the products round their operands."""
    b = struct.unpack("<I", struct.pack("<f", v))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", b))[0]


def mm(a, b):
    return [[sum(a[i][t] * b[t][j] for t in range(len(b))) for j in range(len(b[0]))]
            for i in range(len(a))]


def tr(a):
    return [list(r) for r in zip(*a)]


# F(m x m, 3 x 3): output tile m, input tile m + 2; Y = At [(G g Gt) . (Bt d B)] A.
F23 = dict(m=2,
           BT=[[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
           G=[[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
           AT=[[1, 1, 1, 0], [0, 1, -1, -1]])
F43 = dict(m=4,
           BT=[[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
               [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
           G=[[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
           AT=[[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
               [0, 1, -1, 8, -8, 1]])


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    c = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    k, h = 4, 10
    o = h - 2
    rng = random.Random(seed)
    x = [[[max(0.0, rng.gauss(0, 1)) for _ in range(h)] for _ in range(h)] for _ in range(c)]
    std = math.sqrt(2 / (9 * c))
    w = [[[[rng.gauss(0, std) for _ in range(3)] for _ in range(3)] for _ in range(c)]
         for _ in range(k)]

    def direct(r):
        return [[[sum(r(x[ci][i + a][j + b]) * r(w[kk][ci][a][b])
                      for ci in range(c) for a in range(3) for b in range(3))
                  for j in range(o)] for i in range(o)] for kk in range(k)]

    def winograd(f, r):
        m, bt, g, at = f["m"], f["BT"], f["G"], f["AT"]
        a = m + 2
        u = [[[[r(v) for v in row] for row in mm(mm(g, w[kk][ci]), tr(g))] for ci in range(c)]
             for kk in range(k)]
        y, cover = {}, []
        for ti in range(0, o - m + 1, m):
            for tj in range(0, o - m + 1, m):
                v = [[[r(e) for e in row]
                      for row in mm(mm(bt, [rw[tj:tj + a] for rw in x[ci][ti:ti + a]]), tr(bt))]
                     for ci in range(c)]
                for kk in range(k):
                    mt = [[sum(u[kk][ci][p][q] * v[ci][p][q] for ci in range(c))
                           for q in range(a)] for p in range(a)]
                    yt = mm(mm(at, mt), tr(at))
                    for p in range(m):
                        for q in range(m):
                            y[kk, ti + p, tj + q] = yt[p][q]
                cover += [(ti + p, tj + q) for p in range(m) for q in range(m)]
        return y, cover

    exact = direct(lambda v: v)

    def error(get, points):
        num = sum((get(kk, i, j) - exact[kk][i][j]) ** 2 for kk in range(k) for i, j in points)
        den = sum(exact[kk][i][j] ** 2 for kk in range(k) for i, j in points)
        return math.sqrt(num / den)

    d = direct(bf16)
    every = [(i, j) for i in range(o) for j in range(o)]
    print(f"seed {seed}, {c} channels: direct bf16 {100 * error(lambda kk, i, j: d[kk][i][j], every):.3f}%")
    for name, f in [("F(2x2, 3x3)", F23), ("F(4x4, 3x3)", F43)]:
        y, cover = winograd(f, bf16)
        exact_y, _ = winograd(f, lambda v: v)
        print(f"  {name} bf16 {100 * error(lambda kk, i, j: y[kk, i, j], cover):.3f}%"
              f" (unrounded: {error(lambda kk, i, j: exact_y[kk, i, j], cover):.1e})")


if __name__ == "__main__":
    main()
