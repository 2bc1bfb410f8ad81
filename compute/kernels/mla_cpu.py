"""Absorbed MLA decode as one fused pass over the cache, for float32 on the CPU (a small C kernel).

Why: in PyTorch ops the absorbed decode is two skinny matmuls (heads x latent against tokens x latent, then
weights x latent) with a softmax between. With the trained model's 6 heads, a 48-number latent and a
16-number RoPE key, the [heads x tokens] intermediates are small (24 bytes a token against the cache's 256),
so they are not what costs: the matmuls are. MKL and oneDNN run these shapes (6 rows, K = 64) at about
50 GFLOP/s on one core of the machine the benchmark ran on, half of what they reach on a square matmul, so a
decode step there is bound by arithmetic (5.25 FLOPs per cached byte), not by reading the cache. Chunked
online softmax in PyTorch ops (flash-decoding), torch.compile (inductor, also with max-autotune) and one
matmul over concatenated keys were all measured and were no faster (see benchmarks/REPORT.md).

What: one pass over the cache in chunks of 64 tokens, each chunk's latent and RoPE key read from memory once
and then used from L1 for the scores of every head, an online softmax, and the weighted sum of the latent:
the flash-decoding loop, with the heads as the rows of each step (as FlashMLA does on a GPU). Scores take
four tokens at a time against three query rows (six where AVX-512 gives 32 vector registers), each row's four
sums finished by one transpose-sum; the weighted sum keeps six rows' outputs in registers. Where the CPU has
AVX-512 and the latent and RoPE widths are multiples of 16, both use 16-lane vectors: the same arithmetic in
half the instructions and loads (bench_kernels times the 8-lane build beside it in the same run; see
benchmarks/REPORT.md). The query is absorbed (W_uk), and W_uv and W_o
applied, in the same call. Per token it does the formula's 2 x heads x (latent + rope) + 2 x heads x latent
FLOPs.

The C source is compiled ahead of time by `kvx build-kernels` (kvx.site.native; `make setup` runs it) with the
system's C compiler (`cc`, or $CC), about a second a shape, specialised for each latent and RoPE width and for
this CPU (-march=native), into a private directory keyed by the source, the flags and the CPU's feature flags
($KVX_KERNEL_CACHE, else ~/.cache/kvx/kernels); the server only loads it, and never runs a compiler. A shape
not built, anything else, or any failure to load falls back to the PyTorch kernel
(`mla.absorbed_matmul`): another device (CUDA, meta), another dtype, a latent or RoPE width that is not a
multiple of 8, more than 64 heads x new tokens, or KVX_FUSED_KERNELS=0. With more than one PyTorch thread the
tokens are split between that many threads (pieces of at least 8,192 tokens), merged by their softmax maxima.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import platform
import shutil
import stat
import struct
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MAX_ROWS = 64          # heads x new tokens per sequence (MAXR below)
NAME = "fused C kernel (one pass over the cache, float32, CPU)"

SOURCE = r"""
/* Absorbed MLA decode, float32: see kvx/compute/kernels/mla_cpu.py. CD (latent) and PD (RoPE) are set by -D. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 64              /* tokens per step: their latent and RoPE key stay in L1 */
#define MAXR 64               /* query rows (heads x new tokens) per sequence */
#define KD (CD + PD)
#define CV (CD / 8)
#define PV (PD / 8)
/* With AVX-512 and widths that are multiples of 16, the scores and the weighted sum take 16-lane vectors: half
 * the instructions and loads for the same arithmetic. With 32 vector registers (AVX-512), scores take six query
 * rows at a time; with AVX2's sixteen, three. */
#if defined(__AVX512F__) && CD % 16 == 0 && PD % 16 == 0
#define WIDE 1
#endif
#if defined(WIDE) || defined(__AVX512VL__)
#define SR 6
#else
#define SR 3
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8 splat(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline v8 load(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, v8 v) { memcpy(p, &v, sizeof v); }
#ifdef __AVX__
static inline v8 vmax(v8 a, v8 b) { return __builtin_ia32_maxps256(a, b); }      /* a > b ? a : b, as below */
#else
static inline v8 vmax(v8 a, v8 b) { v8i gt = a > b; return (v8)(((v8i)a & gt) | ((v8i)b & ~gt)); }
#endif

/* 2^x for x <= 0 (a score minus the running maximum, scores being in base 2: log2(e) is in the query's scale):
 * 2^n by the exponent bits, 2^f for f = x - n in [-1/2, 1/2] by Cephes' exp2f polynomial, within about 1 ulp.
 * Below -125 it returns about 2^-125 (2.4e-38) instead of a denormal; a sum that holds at least one 1 cannot see
 * it. Six multiply-adds against the eleven multiplies of e^x. */
static inline v8 vexp2(v8 x) {
    x = vmax(x, splat(-125.0f));
    const v8 magic = splat(12582912.0f);                  /* 1.5 * 2^23: adding it rounds to an integer */
    const v8 t = x + magic;
    const v8 f = x - (t - magic);
    v8 p = splat(1.535336188319500E-4f);
    p = p * f + splat(1.339887440266574E-3f);
    p = p * f + splat(9.618437357674640E-3f);
    p = p * f + splat(5.550332471162809E-2f);
    p = p * f + splat(2.402264791363012E-1f);
    p = p * f + splat(6.931472028550421E-1f);
    p = p * f + splat(1.0f);
    return (v8)((v8i)p + (((v8i)t - (v8i)magic) << 23));
}

/* vexp2 of four vectors, step by step: four independent chains in program order, which the scheduler overlaps
 * (one chain at a time is bound by its latency). */
static inline void vexp2x4(v8 x[4]) {
    const v8 magic = splat(12582912.0f);
    v8 t[4], f[4], p[4];
    for (int i = 0; i < 4; i++) x[i] = vmax(x[i], splat(-125.0f));
    for (int i = 0; i < 4; i++) t[i] = x[i] + magic;
    for (int i = 0; i < 4; i++) f[i] = x[i] - (t[i] - magic);
    for (int i = 0; i < 4; i++) p[i] = splat(1.535336188319500E-4f) * f[i] + splat(1.339887440266574E-3f);
    for (int i = 0; i < 4; i++) p[i] = p[i] * f[i] + splat(9.618437357674640E-3f);
    for (int i = 0; i < 4; i++) p[i] = p[i] * f[i] + splat(5.550332471162809E-2f);
    for (int i = 0; i < 4; i++) p[i] = p[i] * f[i] + splat(2.402264791363012E-1f);
    for (int i = 0; i < 4; i++) p[i] = p[i] * f[i] + splat(6.931472028550421E-1f);
    for (int i = 0; i < 4; i++) p[i] = p[i] * f[i] + splat(1.0f);
    for (int i = 0; i < 4; i++) x[i] = (v8)((v8i)p[i] + (((v8i)t[i] - (v8i)magic) << 23));
}

static inline float hmax(v8 v) { float m = v[0]; for (int i = 1; i < 8; i++) m = v[i] > m ? v[i] : m; return m; }
static inline float hsum(v8 v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

/* a . b over n numbers: four 8-lane partial sums (C does not let the compiler reorder a float sum itself). */
static inline float dot(const float *a, const float *b, int n) {
    v8 acc[4] = {splat(0.0f), splat(0.0f), splat(0.0f), splat(0.0f)};
    int k = 0;
    for (; k + 32 <= n; k += 32)
        for (int u = 0; u < 4; u++) acc[u] += load(a + k + 8 * u) * load(b + k + 8 * u);
    for (; k + 8 <= n; k += 8) acc[0] += load(a + k) * load(b + k);
    float sum = hsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; k < n; k++) sum += a[k] * b[k];
    return sum;
}

typedef float v4 __attribute__((vector_size(16)));
static inline void store4(float *p, v4 v) { memcpy(p, &v, sizeof v); }

/* Lane i of the result is the sum of a[i]'s eight lanes, i < 4: two in-lane shuffle-add steps (vshufps) leave
 * each 128-bit half holding the four half-sums, and the halves are added. */
static inline v4 sum4(const v8 a[4]) {
    const v8i even = {0, 2, 8, 10, 4, 6, 12, 14}, odd = {1, 3, 9, 11, 5, 7, 13, 15};
    const v8 b0 = __builtin_shuffle(a[0], a[1], even) + __builtin_shuffle(a[0], a[1], odd);
    const v8 b1 = __builtin_shuffle(a[2], a[3], even) + __builtin_shuffle(a[2], a[3], odd);
    const v8 c = __builtin_shuffle(b0, b1, even) + __builtin_shuffle(b0, b1, odd);
    v4 lo, hi;
    memcpy(&lo, &c, sizeof lo); memcpy(&hi, (const char *)&c + sizeof lo, sizeof hi);
    return lo + hi;
}

#ifdef WIDE
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16 splat16(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
static inline v16 load16(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void store16(float *p, v16 v) { memcpy(p, &v, sizeof v); }

/* sum4 for 16 lanes: the same two in-lane shuffle-add steps leave each 128-bit lane holding its part of the four
 * sums, then the four 128-bit lanes are added. */
static inline v4 sum4_16(const v16 a[4]) {
    const v16i even = {0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30},
               odd = {1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31},
               halves = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
               quarters = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
    const v16 b0 = __builtin_shuffle(a[0], a[1], even) + __builtin_shuffle(a[0], a[1], odd);
    const v16 b1 = __builtin_shuffle(a[2], a[3], even) + __builtin_shuffle(a[2], a[3], odd);
    v16 c = __builtin_shuffle(b0, b1, even) + __builtin_shuffle(b0, b1, odd);
    c += __builtin_shuffle(c, halves);
    c += __builtin_shuffle(c, quarters);
    v4 lo;
    memcpy(&lo, &c, sizeof lo);
    return lo;
}

/* Scores of query rows q[0..nr) (nr <= 6) against four tokens, 16 lanes of the dimension at a time: twenty-four
 * accumulators, the query read from L1 as each multiply-add's operand. */
static inline __attribute__((always_inline)) void scores4(int nr, const float *q, const float *const lj0[4],
                                                          const float *const kj0[4], v4 *out) {
    v16 acc[6][4];
    const float *lj[4], *kj[4];
    for (int t = 0; t < 4; t++) {
        lj[t] = lj0[t]; kj[t] = kj0[t];
        __asm__("" : "+r"(lj[t]), "+r"(kj[t]));
    }
    for (int i = 0; i < nr; i++) for (int t = 0; t < 4; t++) acc[i][t] = splat16(0.0f);
    for (int v = 0; v < CD / 16; v++)
        for (int t = 0; t < 4; t++) {
            const v16 k = load16(lj[t] + 16 * v);
            for (int i = 0; i < nr; i++) acc[i][t] += load16(q + i * KD + 16 * v) * k;
        }
    for (int v = 0; v < PD / 16; v++)
        for (int t = 0; t < 4; t++) {
            const v16 k = load16(kj[t] + 16 * v);
            for (int i = 0; i < nr; i++) acc[i][t] += load16(q + i * KD + CD + 16 * v) * k;
        }
    for (int i = 0; i < nr; i++) out[i] = sum4_16(acc[i]);
}
#else
/* Scores of query rows q[0..nr) (nr <= SR) against four tokens: out[i] holds row i's four scores. Three rows
 * give twelve accumulators (three rows x four tokens, 8 lanes of the dimension each), which with three query
 * vectors and one key fill AVX2's sixteen registers; six rows fill AVX-512's thirty-two. The four-token
 * transpose-sum then takes three shuffle-add steps. */
static inline __attribute__((always_inline)) void scores4(int nr, const float *q, const float *const lj0[4],
                                                          const float *const kj0[4], v4 *out) {
    v8 acc[SR][4];
    const float *lj[4], *kj[4];
    for (int t = 0; t < 4; t++) {  /* read here, from L1: hoisted out of the loop over rows they would not fit */
        lj[t] = lj0[t]; kj[t] = kj0[t];
        __asm__("" : "+r"(lj[t]), "+r"(kj[t]));
    }
    for (int i = 0; i < nr; i++) for (int t = 0; t < 4; t++) acc[i][t] = splat(0.0f);
    for (int v = 0; v < CV; v++) {
        v8 qv[SR];
        for (int i = 0; i < nr; i++) qv[i] = load(q + i * KD + 8 * v);
        for (int t = 0; t < 4; t++) {
            const v8 k = load(lj[t] + 8 * v);
            for (int i = 0; i < nr; i++) acc[i][t] += qv[i] * k;
        }
    }
    for (int v = 0; v < PV; v++) {
        v8 qv[SR];
        for (int i = 0; i < nr; i++) qv[i] = load(q + i * KD + CD + 8 * v);
        for (int t = 0; t < 4; t++) {
            const v8 k = load(kj[t] + 8 * v);
            for (int i = 0; i < nr; i++) acc[i][t] += qv[i] * k;
        }
    }
    for (int i = 0; i < nr; i++) out[i] = sum4(acc[i]);
}
#endif

#ifdef WIDE
/* o[i] = o[i] * alpha[i] + sum over the chunk's n tokens of p[i][jj] * latent[jj], rows i < nr (<= 6), latent
 * vectors of 16 [v0, v0 + nv) (nv <= 3): eighteen accumulators, so a token's three loads and six broadcasts feed
 * eighteen multiply-adds. A fresh partial sum per chunk keeps the float32 rounding of a 32K-token sum near that
 * of a blocked matmul. */
static inline __attribute__((always_inline)) void weigh(int nr, int v0, int nv, float (*p)[CHUNK], const float *lat,
                                                        long ls, int n, float *o, const float *alpha) {
    v16 acc[6][3];
    for (int i = 0; i < nr; i++) for (int u = 0; u < nv; u++) acc[i][u] = splat16(0.0f);
    for (int jj = 0; jj < n; jj++) {
        v16 x[3];
        for (int u = 0; u < nv; u++) x[u] = load16(lat + jj * ls + 16 * (v0 + u));
        for (int i = 0; i < nr; i++) {
            const v16 w = splat16(p[i][jj]);
            for (int u = 0; u < nv; u++) acc[i][u] += w * x[u];
        }
    }
    for (int i = 0; i < nr; i++)
        for (int u = 0; u < nv; u++) {
            float *dst = o + i * CD + 16 * (v0 + u);
            store16(dst, load16(dst) * splat16(alpha[i]) + acc[i][u]);
        }
}

static inline __attribute__((always_inline)) void weigh_rows(int nr, float (*p)[CHUNK], const float *lat, long ls,
                                                             int n, float *o, const float *alpha) {
    int v = 0;
    for (; v + 3 <= CD / 16; v += 3) weigh(nr, v, 3, p, lat, ls, n, o, alpha);
    if (CD / 16 - v == 2) weigh(nr, v, 2, p, lat, ls, n, o, alpha);
    else if (CD / 16 - v == 1) weigh(nr, v, 1, p, lat, ls, n, o, alpha);
}
#else
/* o[i] = o[i] * alpha[i] + sum over the chunk's n tokens of p[i][jj] * latent[jj], rows i < nr (<= 6), latent
 * vectors [v0, v0 + nv) (nv <= 2): twelve accumulators. A fresh partial sum per chunk keeps the float32 rounding
 * of a 32K-token sum near that of a blocked matmul. The two vectors' loop is written out: as a loop over u, GCC
 * split it into one pass per vector and broadcast each weight twice. */
static inline __attribute__((always_inline)) void weigh(int nr, int v0, int nv, float (*p)[CHUNK], const float *lat,
                                                        long ls, int n, float *o, const float *alpha) {
    v8 acc[6][2];
    for (int i = 0; i < nr; i++) for (int u = 0; u < nv; u++) acc[i][u] = splat(0.0f);
    if (nv == 2)
        for (int jj = 0; jj < n; jj++) {
            const v8 x0 = load(lat + jj * ls + 8 * v0), x1 = load(lat + jj * ls + 8 * v0 + 8);
            for (int i = 0; i < nr; i++) {
                const v8 w = splat(p[i][jj]);
                acc[i][0] += w * x0;
                acc[i][1] += w * x1;
            }
        }
    else
        for (int jj = 0; jj < n; jj++) {
            const v8 x0 = load(lat + jj * ls + 8 * v0);
            for (int i = 0; i < nr; i++) acc[i][0] += splat(p[i][jj]) * x0;
        }
    for (int i = 0; i < nr; i++)
        for (int u = 0; u < nv; u++) {
            float *dst = o + i * CD + 8 * (v0 + u);
            store(dst, load(dst) * splat(alpha[i]) + acc[i][u]);
        }
}

static inline __attribute__((always_inline)) void weigh_rows(int nr, float (*p)[CHUNK], const float *lat, long ls,
                                                             int n, float *o, const float *alpha) {
    int v = 0;
    for (; v + 2 <= CV; v += 2) weigh(nr, v, 2, p, lat, ls, n, o, alpha);
    if (v < CV) weigh(nr, v, 1, p, lat, ls, n, o, alpha);
}
#endif

/* out[i] = (W[i] . x) / div for rows i < m of W (row stride ldw) over n numbers: four rows at a time, so one load of
 * x serves four multiply-adds and one transpose-sum finishes four rows. */
static void gemv(const float *W, long ldw, const float *x, int n, int m, float *out, float div) {
    const int n8 = n & ~7;
    int i = 0;
    for (; i + 4 <= m; i += 4) {
        v8 acc[4] = {splat(0.0f), splat(0.0f), splat(0.0f), splat(0.0f)};
        for (int k = 0; k < n8; k += 8) {
            const v8 xv = load(x + k);
            for (int u = 0; u < 4; u++) acc[u] += load(W + (i + u) * ldw + k) * xv;
        }
        const v4 sums = sum4(acc);
        for (int u = 0; u < 4; u++) {
            float t = sums[u];
            for (int k = n8; k < n; k++) t += W[(i + u) * ldw + k] * x[k];
            out[i + u] = t / div;
        }
    }
    for (; i < m; i++) out[i] = dot(W + i * ldw, x, n) / div;
}

/* row[c] = sum over d < D of (x[d] * mul) * W[d][c], c < CD: the query's latent (W_uk absorbed), six vectors of
 * the row in registers at a time. */
static void absorb(const float *x, int D, const float *W, float mul, float *row) {
    for (int c0 = 0; c0 < CV; c0 += 6) {
        const int nv = CV - c0 < 6 ? CV - c0 : 6;
        v8 acc[6];
        for (int u = 0; u < 6; u++) acc[u] = splat(0.0f);
        for (int d = 0; d < D; d++) {
            const v8 xd = splat(x[d] * mul);
            const float *w = W + (long)d * CD + 8 * c0;
            for (int u = 0; u < 6; u++) if (u < nv) acc[u] += xd * load(w + 8 * u);
        }
        for (int u = 0; u < 6; u++) if (u < nv) store(row + 8 * (c0 + u), acc[u]);
    }
}

/* Rows q[R][KD] (scaled) over tokens [s0, s1): o[R][CD] is the weighted sum before dividing by l[R], every
 * exponent taken relative to m[R]. */
static void attend(int s0, int s1, int R, const float *q, const float *lat, long ls, const float *kr, long ks,
                   float *o, float *m, float *l) {
    float s[MAXR][CHUNK] __attribute__((aligned(32)));
    float alpha[MAXR], top[MAXR + 8] = {0}, prev[MAXR + 8] = {0};   /* 8 more: read eight at a time */
    for (int r = 0; r < R; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    memset(o, 0, sizeof(float) * R * CD);
    for (int j0 = s0; j0 < s1; j0 += CHUNK) {
        const int n = s1 - j0 < CHUNK ? s1 - j0 : CHUNK;
        for (int j = 0; j < ((n + 7) & ~7); j += 4) {   /* whole 8s: the softmax reads s eight at a time */
            const float *lj[4], *kj[4];
            for (int t = 0; t < 4; t++) {            /* past the chunk's end: the last token again */
                const long tok = j0 + (j + t < n ? j + t : n - 1);
                lj[t] = lat + tok * ls; kj[t] = kr + tok * ks;
            }
            v4 sc[SR];
            int r = 0;
            for (; r + SR <= R; r += SR) {
                scores4(SR, q + r * KD, lj, kj, sc);
                for (int i = 0; i < SR; i++) store4(&s[r + i][j], sc[i]);
            }
            switch (R - r) {                          /* the last rows: a constant count, so registers stay */
#define TAIL(k) case k: scores4(k, q + r * KD, lj, kj, sc); for (int i = 0; i < k; i++) store4(&s[r + i][j], sc[i]); break;
            TAIL(1) TAIL(2)
#if SR > 3
            TAIL(3) TAIL(4) TAIL(5)
#endif
#undef TAIL
            }
        }
        for (int r = 0; r < R; r++) {                 /* online softmax: each row's maximum, */
            v8 mx[2] = {load(&s[r][0]), load(&s[r][0])};
            int j = 8;
            for (; j + 16 <= n; j += 16) { mx[0] = vmax(mx[0], load(&s[r][j])); mx[1] = vmax(mx[1], load(&s[r][j + 8])); }
            for (; j < n; j += 8) mx[0] = vmax(mx[0], load(&s[r][j]));   /* past n: the last token's score again */
            prev[r] = m[r];
            top[r] = fmaxf(m[r], hmax(vmax(mx[0], mx[1])));
        }
        for (int r = 0; r < R; r += 8) {              /* the factor for what came before, eight rows at once, */
            const v8 a = vexp2(load(&prev[r]) - load(&top[r]));
            for (int i = 0; i < 8 && r + i < R; i++) alpha[r + i] = m[r + i] == -INFINITY ? 0.0f : a[i];
        }
        memcpy(m, top, sizeof(float) * R);
        for (int r = 0; r < R; r++) {                 /* and the weights */
            const v8 t = splat(top[r]);
            v8 sum[2] = {splat(0.0f), splat(0.0f)};
            int j = 0;
            for (; j + 32 <= n; j += 32) {
                v8 p[4];
                for (int u = 0; u < 4; u++) p[u] = load(&s[r][j + 8 * u]) - t;
                vexp2x4(p);
                for (int u = 0; u < 4; u++) store(&s[r][j + 8 * u], p[u]);
                sum[0] += p[0] + p[2]; sum[1] += p[1] + p[3];
            }
            for (; j < n; j += 8) {
                v8 p = vexp2(load(&s[r][j]) - t);
                if (j + 8 > n) for (int i = n - j; i < 8; i++) p[i] = 0.0f;
                store(&s[r][j], p);
                sum[0] += p;
            }
            l[r] = l[r] * alpha[r] + hsum(sum[0] + sum[1]);
        }
        const float *lat0 = lat + j0 * ls;
        int r = 0;
        for (; r + 6 <= R; r += 6) weigh_rows(6, s + r, lat0, ls, n, o + r * CD, alpha + r);
        switch (R - r) {
        case 5: weigh_rows(5, s + r, lat0, ls, n, o + r * CD, alpha + r); break;
        case 4: weigh_rows(4, s + r, lat0, ls, n, o + r * CD, alpha + r); break;
        case 3: weigh_rows(3, s + r, lat0, ls, n, o + r * CD, alpha + r); break;
        case 2: weigh_rows(2, s + r, lat0, ls, n, o + r * CD, alpha + r); break;
        case 1: weigh_rows(1, s + r, lat0, ls, n, o + r * CD, alpha + r); break;
        }
    }
}

struct piece { int s0, s1, R; const float *q, *lat, *kr; long ls, ks; float *o, *m, *l; };

static void *attend_piece(void *arg) {
    struct piece *p = arg;
    attend(p->s0, p->s1, p->R, p->q, p->lat, p->ls, p->kr, p->ks, p->o, p->m, p->l);
    return NULL;
}

/* out[b][t][e] for B sequences of S cached tokens and T new tokens each, H heads of width D, E model
 * dimensions. q_nope [B,H,T,D] and q_rope [B,H,T,PD] by strides (in numbers; last dimension contiguous),
 * w_uk and w_uv [H][D][CD] and w_o [E][H*D] contiguous, latent [B,S,CD] and k_rope [B,S,PD] by strides.
 * Returns 0, or -1 with nothing written when the rows do not fit or memory is short. */
int mla_absorbed_decode(int B, int T, int H, int D, int E, int S, int threads, float scale,
                        const float *qn, long qn_b, long qn_h, long qn_t, const float *qr, long qr_b, long qr_h,
                        long qr_t, const float *w_uk, const float *w_uv, const float *w_o, const float *lat,
                        long lat_b, long lat_s, const float *kr, long kr_b, long kr_s, float *out) {
    const int R = H * T;
    const float scale2 = scale * 1.44269504088896341f;    /* scores in base 2: softmax by 2^x */
    if (R > MAXR || R < 1 || S < 1 || B < 1 || D < 1 || E < 1) return -1;
    if (threads > 8) threads = 8;
    if (threads > S / 8192) threads = S / 8192;       /* a thread costs tens of microseconds to start */
    if (threads < 1) threads = 1;
    float *q = malloc(sizeof(float) * R * KD), *buf = malloc(sizeof(float) * threads * R * (CD + 2)),
          *y = malloc(sizeof(float) * T * H * D);
    if (!q || !buf || !y) { free(q); free(buf); free(y); return -1; }
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++)                   /* the query in latent space (W_uk absorbed), and RoPE */
            for (int t = 0; t < T; t++) {
                float *row = q + (h * T + t) * KD;
                absorb(qn + b * qn_b + h * qn_h + t * qn_t, D, w_uk + (long)h * D * CD, scale2, row);
                const float *y = qr + b * qr_b + h * qr_h + t * qr_t;
                for (int c = 0; c < PD; c++) row[CD + c] = y[c] * scale2;
            }
        struct piece pieces[8];
        pthread_t tid[8];
        int started[8] = {0};
        for (int i = 0; i < threads; i++) {
            float *base = buf + (long)i * R * (CD + 2);
            pieces[i] = (struct piece){(int)((long)S * i / threads), (int)((long)S * (i + 1) / threads), R, q,
                                       lat + b * lat_b, kr + b * kr_b, lat_s, kr_s, base, base + R * CD,
                                       base + R * CD + R};
            if (i > 0) started[i] = pthread_create(&tid[i], NULL, attend_piece, &pieces[i]) == 0;
        }
        attend_piece(&pieces[0]);
        for (int i = 1; i < threads; i++) {
            if (started[i]) pthread_join(tid[i], NULL);
            else attend_piece(&pieces[i]);            /* no thread to be had: this piece here */
        }
        for (int r = 0; r < R; r++) {                 /* merge the pieces by their maxima, then W_uv */
            float top = -INFINITY, l = 0.0f, o[CD];
            for (int i = 0; i < threads; i++) top = fmaxf(top, pieces[i].m[r]);
            for (int c = 0; c < CD; c++) o[c] = 0.0f;
            for (int i = 0; i < threads; i++) {
                const float f = exp2f(pieces[i].m[r] - top);
                l += pieces[i].l[r] * f;
                for (int c = 0; c < CD; c++) o[c] += pieces[i].o[r * CD + c] * f;
            }
            const int h = r / T, t = r % T;
            float *dst = y + (long)t * H * D + (long)h * D;
            gemv(w_uv + (long)h * D * CD, CD, o, CD, D, dst, l);
        }
        for (int t = 0; t < T; t++)                   /* W_o */
            gemv(w_o, (long)H * D, y + (long)t * H * D, H * D, E, out + ((long)b * T + t) * E, 1.0f);
    }
    free(q); free(buf); free(y);
    return 0;
}

/* The vector width the kernel was built with, in floats: 16 (AVX-512) or 8. */
int mla_vector_width(void) {
#ifdef WIDE
    return 16;
#else
    return 8;
#endif
}

/* mla_absorbed_decode with its arguments packed in 26 eight-byte slots (one ctypes argument instead of 26,
 * whose conversion cost several microseconds a call): B, T, H, D, E, S, threads as integers, the scale as a
 * double, then qn, qn_b, qn_h, qn_t, qr, qr_b, qr_h, qr_t, w_uk, w_uv, w_o, lat, lat_b, lat_s, kr, kr_b, kr_s, out
 * (addresses and strides as integers). */
int mla_absorbed_decode_packed(const void *args) {
    int64_t a[26];
    double scale;
    memcpy(a, args, sizeof a);
    memcpy(&scale, &a[7], sizeof scale);
#define F(i) ((const float *)(intptr_t)a[i])
    return mla_absorbed_decode((int)a[0], (int)a[1], (int)a[2], (int)a[3], (int)a[4], (int)a[5], (int)a[6],
                               (float)scale, F(8), a[9], a[10], a[11], F(12), a[13], a[14], a[15], F(16), F(17),
                               F(18), F(19), a[20], a[21], F(22), a[23], a[24], (float *)(intptr_t)a[25]);
#undef F
}
"""

_lock = threading.Lock()
_libs: dict[tuple[int, int], object] = {}      # (latent, rope) -> the loaded function, or None after a failure
_widths: dict[tuple[int, int], int] = {}       # (latent, rope) -> the loaded kernel's vector width, in floats


# os.environ's own dictionary (bytes on POSIX), read directly: os.environ.get costs about 2 us a call, a tenth
# of the fused call's Python side. os.environ writes it (monkeypatch.setenv too); elsewhere, os.environ.get.
_ENV = getattr(os.environ, "_data", None)
try:
    _ENV_KEY, _ENV_OFF = os.environ.encodekey("KVX_FUSED_KERNELS"), os.environ.encodevalue("0")
except (AttributeError, TypeError):
    _ENV = None


def enabled() -> bool:
    if isinstance(_ENV, dict):
        return _ENV.get(_ENV_KEY) != _ENV_OFF
    return os.environ.get("KVX_FUSED_KERNELS", "1") != "0"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _private_dir(path: Path) -> bool:
    """A directory only this user can write to, so nobody else can put a library there for us to load."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def cache_dir() -> Path:
    env = os.environ.get("KVX_KERNEL_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvx" / "kernels"
    if _private_dir(base):
        return base
    return Path(tempfile.mkdtemp(prefix="kvx-kernels-"))     # private (0700), this process only


def plans(latent: int, rope: int) -> list[tuple[str, list[str], Path]]:
    """How the library for this latent and RoPE width is built, best first (this CPU's instructions, then
    generic): (compiler, flags, where the library goes). The builder (kvx.site.native, `kvx build-kernels`)
    compiles into these paths; this module only loads from them, so the server never runs a compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or "cc"
    out = []
    for arch in (["-march=native"], []):
        flags = ["-O3", *arch, "-fPIC", "-shared", f"-DCD={latent}", f"-DPD={rope}"]
        key = hashlib.sha256("\0".join([SOURCE, cc, *flags, platform.machine(), _cpu_flags()]).encode()).hexdigest()
        out.append((cc, flags, cache_dir() / f"mla_{latent}_{rope}_{key[:16]}.so"))
    return out


def _built(latent: int, rope: int) -> Path:
    for _, _, path in plans(latent, rope):
        if path.exists():
            return path
    raise FileNotFoundError(f"the fused MLA kernel is not built for a {latent}-number latent and {rope}-number "
                            f"RoPE key on this CPU (run `kvx build-kernels`)")


def load(path: Path) -> tuple:
    """The kernel's entry point in the library at `path`, and the vector width (floats) it was built with."""
    lib = ctypes.CDLL(str(path))
    fn = lib.mla_absorbed_decode_packed
    fn.argtypes = [ctypes.c_char_p]
    fn.restype = ctypes.c_int
    lib.mla_vector_width.restype = ctypes.c_int
    return fn, lib.mla_vector_width()


def _function(latent: int, rope: int):
    """The compiled kernel for this latent and RoPE width, or None (logged once) when it cannot be had."""
    key = (latent, rope)
    if key in _libs:
        return _libs[key]
    with _lock:
        if key not in _libs:
            try:
                fn, _widths[key] = load(_built(latent, rope))
                _libs[key] = fn
            except Exception as err:                  # no compiler, a failed build or load: PyTorch instead
                log.warning("fused MLA kernel unavailable, using the PyTorch kernel: %s", err)
                _libs[key] = None
    return _libs[key]


# mla_absorbed_decode_packed's arguments: B, T, H, D, E, S, threads, the scale (a double), then 18 addresses and
# strides. One packed argument: ctypes took about 7 us to convert 26 separate ones.
_ARGS = struct.Struct("=7qd18q")


def _weight(layer, name: str) -> torch.Tensor:
    """layer.<name>.weight. Read from the modules' own dictionaries where it is a plain parameter: nn.Module's
    attribute lookup costs microseconds, and the call's fixed cost weighs on a short cache."""
    try:
        return layer._modules[name]._parameters["weight"]
    except (KeyError, AttributeError, TypeError):          # a parametrization, a property, another module
        return getattr(layer, name).weight


def _has_no_bias(module) -> bool:
    params = getattr(module, "_parameters", {})
    return params["bias"] is None if "bias" in params else getattr(module, "bias", None) is None


def _weights(layer, inp: dict) -> tuple | None:
    """W_uk, W_uv and W_o when the fused kernel applies to these inputs (without building it), else None."""
    c, q_nope, latent = layer.c, inp["q_nope"], inp["latent"]
    if not (enabled() and c.kv_latent % 8 == 0 and c.kv_latent > 0 and c.rope_dim % 8 == 0
            and 0 < q_nope.shape[1] * q_nope.shape[2] <= MAX_ROWS and latent.shape[1] > 0):
        return None
    w_uk, w_uv, w_o = _weight(layer, "w_uk"), _weight(layer, "w_uv"), _weight(layer, "wo")
    f32, k_rope, q_rope = torch.float32, inp["k_rope"], inp["q_rope"]
    wo = layer._modules.get("wo")
    if (_has_no_bias(layer.wo if wo is None else wo)
            and latent.is_cpu and latent.dtype is f32 and k_rope.is_cpu and k_rope.dtype is f32
            and q_nope.is_cpu and q_nope.dtype is f32 and q_rope.is_cpu and q_rope.dtype is f32
            and w_uk.is_cpu and w_uk.dtype is f32 and w_uv.is_cpu and w_uv.dtype is f32
            and w_o.is_cpu and w_o.dtype is f32):
        return w_uk, w_uv, w_o
    return None


def vector_width(latent: int, rope: int) -> int | None:
    """The vector width (floats) of the kernel loaded for this shape: 16 with AVX-512, else 8; None if none."""
    return _widths.get((latent, rope)) if _function(latent, rope) is not None else None


def applies(layer, inp: dict) -> bool:
    """Whether `absorbed` runs the fused kernel for these inputs (without building it)."""
    return _weights(layer, inp) is not None


def _last_contiguous(t: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """t with its last dimension contiguous (a copy only where it is not), and its strides."""
    st = t.stride()
    if st[-1] == 1 or t.shape[-1] <= 1:
        return t, st
    t = t.contiguous()
    return t, t.stride()


def absorbed(layer, inp: dict) -> torch.Tensor | None:
    """The absorbed decode's output [B, T, d_model] (what `mla.absorbed_matmul` returns), or None where the
    fused kernel does not apply or is unavailable. (No autograd: the kernel only reads the inputs' memory and
    writes a new tensor, so there is no graph to keep and no need for no_grad's cost.)"""
    weights = _weights(layer, inp)
    if weights is None:
        return None
    c = layer.c
    fn = _libs.get((c.kv_latent, c.rope_dim)) or _function(c.kv_latent, c.rope_dim)
    if fn is None:
        return None
    latent, k_rope, q_nope, q_rope = inp["latent"], inp["k_rope"], inp["q_nope"], inp["q_rope"]
    lat_st, kr_st, qn_st, qr_st = latent.stride(), k_rope.stride(), q_nope.stride(), q_rope.stride()
    if lat_st[-1] != 1 or kr_st[-1] != 1 or qn_st[-1] != 1 or qr_st[-1] != 1:
        (latent, lat_st), (k_rope, kr_st) = _last_contiguous(latent), _last_contiguous(k_rope)
        (q_nope, qn_st), (q_rope, qr_st) = _last_contiguous(q_nope), _last_contiguous(q_rope)
    w_uk, w_uv, w_o = (w if w.is_contiguous() else w.detach().contiguous() for w in weights)
    b, h, t, d = q_nope.shape
    e = w_o.shape[0]
    out = torch.empty(b, t, e, dtype=torch.float32)
    args = _ARGS.pack(b, t, h, d, e, latent.shape[1], torch.get_num_threads(),
                      1 / math.sqrt(c.head_dim + c.rope_dim),
                      q_nope.data_ptr(), qn_st[0], qn_st[1], qn_st[2], q_rope.data_ptr(), qr_st[0], qr_st[1], qr_st[2],
                      w_uk.data_ptr(), w_uv.data_ptr(), w_o.data_ptr(), latent.data_ptr(), lat_st[0], lat_st[1],
                      k_rope.data_ptr(), kr_st[0], kr_st[1], out.data_ptr())
    if fn(args) != 0:
        return None
    return out
