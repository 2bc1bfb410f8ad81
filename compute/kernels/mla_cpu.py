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
the flash-decoding loop, with the heads as the rows of each step (as FlashMLA does on a GPU). Scores use
eight tokens at a time against three heads at a time (24 accumulators in registers) and one transpose-sum;
the weighted sum keeps three heads' outputs in registers. The query is absorbed (W_uk), and W_uv and W_o
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

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8 splat(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline v8 load(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, v8 v) { memcpy(p, &v, sizeof v); }
static inline v8 vmax(v8 a, v8 b) { v8i gt = a > b; return (v8)(((v8i)a & gt) | ((v8i)b & ~gt)); }

/* e^x for x <= 0 (a score minus the running maximum): Cephes' expf polynomial, within about 1 ulp. Below -87
 * it returns about e^-87 (1.6e-38) instead of a denormal; a sum that holds at least one 1 cannot see it. */
static inline v8 vexp(v8 x) {
    x = vmax(x, splat(-87.0f));
    const v8 magic = splat(12582912.0f);                  /* 1.5 * 2^23: adding it rounds to an integer */
    const v8 t = x * splat(1.44269504088896341f) + magic;
    const v8 n = t - magic;
    v8 r = x - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    v8 p = splat(1.9875691500E-4f);
    p = p * r + splat(1.3981999507E-3f);
    p = p * r + splat(8.3334519073E-3f);
    p = p * r + splat(4.1665795894E-2f);
    p = p * r + splat(1.6666665459E-1f);
    p = p * r + splat(5.0000001201E-1f);
    p = p * (r * r) + r + splat(1.0f);
    const v8i two_n = ((v8i)t - (v8i)magic + 127) << 23;
    return p * (v8)two_n;
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

/* Lane i of the result is the sum of a[i]'s eight lanes (a transpose-sum: 14 shuffles, 7 adds). */
static inline v8 sum8(const v8 a[8]) {
    v8 b[4], c[2];
    for (int i = 0; i < 4; i++)
        b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], (v8i){0, 8, 2, 10, 4, 12, 6, 14}) +
               __builtin_shuffle(a[2 * i], a[2 * i + 1], (v8i){1, 9, 3, 11, 5, 13, 7, 15});
    for (int i = 0; i < 2; i++)
        c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], (v8i){0, 1, 8, 9, 4, 5, 12, 13}) +
               __builtin_shuffle(b[2 * i], b[2 * i + 1], (v8i){2, 3, 10, 11, 6, 7, 14, 15});
    return __builtin_shuffle(c[0], c[1], (v8i){0, 1, 2, 3, 8, 9, 10, 11}) +
           __builtin_shuffle(c[0], c[1], (v8i){4, 5, 6, 7, 12, 13, 14, 15});
}

/* Scores of query rows q[0..nr) against eight tokens, into s[i][j..j+8); each row's running maximum in mx. */
static inline __attribute__((always_inline)) void scores(int nr, const float *q, const float *const lj[8],
                                                         const float *const kj[8], float (*s)[CHUNK], int j, v8 *mx) {
    v8 acc[3][8];
    for (int i = 0; i < nr; i++) for (int t = 0; t < 8; t++) acc[i][t] = splat(0.0f);
    for (int v = 0; v < CV; v++) {
        v8 qv[3];
        for (int i = 0; i < nr; i++) qv[i] = load(q + i * KD + 8 * v);
        for (int t = 0; t < 8; t++) {
            const v8 k = load(lj[t] + 8 * v);
            for (int i = 0; i < nr; i++) acc[i][t] += qv[i] * k;
        }
    }
    for (int v = 0; v < PV; v++) {
        v8 qv[3];
        for (int i = 0; i < nr; i++) qv[i] = load(q + i * KD + CD + 8 * v);
        for (int t = 0; t < 8; t++) {
            const v8 k = load(kj[t] + 8 * v);
            for (int i = 0; i < nr; i++) acc[i][t] += qv[i] * k;
        }
    }
    for (int i = 0; i < nr; i++) { const v8 sc = sum8(acc[i]); store(&s[i][j], sc); mx[i] = vmax(mx[i], sc); }
}

/* o[i] = o[i] * alpha[i] + sum over the chunk's n tokens of p[i][jj] * latent[jj], rows i < nr. A fresh partial
 * sum per chunk keeps the float32 rounding of a 32K-token sum near that of a blocked matmul. */
static inline __attribute__((always_inline)) void weigh(int nr, float (*p)[CHUNK], const float *lat, long ls, int n,
                                                        float *o, const float *alpha) {
    v8 acc[3][CV];
    for (int i = 0; i < nr; i++) for (int v = 0; v < CV; v++) acc[i][v] = splat(0.0f);
    for (int jj = 0; jj < n; jj++) {
        v8 w[3];
        for (int i = 0; i < nr; i++) w[i] = splat(p[i][jj]);
        const float *lj = lat + jj * ls;
        for (int v = 0; v < CV; v++) {
            const v8 x = load(lj + 8 * v);
            for (int i = 0; i < nr; i++) acc[i][v] += w[i] * x;
        }
    }
    for (int i = 0; i < nr; i++)
        for (int v = 0; v < CV; v++) store(o + i * CD + 8 * v, load(o + i * CD + 8 * v) * splat(alpha[i]) + acc[i][v]);
}

/* Rows q[R][KD] (scaled) over tokens [s0, s1): o[R][CD] is the weighted sum before dividing by l[R], every
 * exponent taken relative to m[R]. */
static void attend(int s0, int s1, int R, const float *q, const float *lat, long ls, const float *kr, long ks,
                   float *o, float *m, float *l) {
    float s[MAXR][CHUNK] __attribute__((aligned(32)));
    float alpha[MAXR];
    v8 mx[MAXR];
    for (int r = 0; r < R; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    memset(o, 0, sizeof(float) * R * CD);
    for (int j0 = s0; j0 < s1; j0 += CHUNK) {
        const int n = s1 - j0 < CHUNK ? s1 - j0 : CHUNK;
        for (int r = 0; r < R; r++) mx[r] = splat(-INFINITY);
        for (int j = 0; j < n; j += 8) {
            const float *lj[8], *kj[8];
            for (int t = 0; t < 8; t++) {            /* past the chunk's end: the last token again */
                const long tok = j0 + (j + t < n ? j + t : n - 1);
                lj[t] = lat + tok * ls; kj[t] = kr + tok * ks;
            }
            int r = 0;
            for (; r + 3 <= R; r += 3) scores(3, q + r * KD, lj, kj, s + r, j, mx + r);
            if (R - r == 2) scores(2, q + r * KD, lj, kj, s + r, j, mx + r);
            else if (R - r == 1) scores(1, q + r * KD, lj, kj, s + r, j, mx + r);
        }
        for (int r = 0; r < R; r++) {                 /* online softmax */
            const float top = fmaxf(m[r], hmax(mx[r]));
            alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - top);
            m[r] = top;
            v8 sum = splat(0.0f);
            for (int j = 0; j < n; j += 8) {
                v8 p = vexp(load(&s[r][j]) - splat(top));
                if (j + 8 > n) for (int t = n - j; t < 8; t++) p[t] = 0.0f;
                store(&s[r][j], p);
                sum += p;
            }
            l[r] = l[r] * alpha[r] + hsum(sum);
        }
        const float *lat0 = lat + j0 * ls;
        int r = 0;
        for (; r + 3 <= R; r += 3) weigh(3, s + r, lat0, ls, n, o + r * CD, alpha + r);
        if (R - r == 2) weigh(2, s + r, lat0, ls, n, o + r * CD, alpha + r);
        else if (R - r == 1) weigh(1, s + r, lat0, ls, n, o + r * CD, alpha + r);
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
                const float *x = qn + b * qn_b + h * qn_h + t * qn_t;
                for (int c = 0; c < CD; c++) row[c] = 0.0f;
                for (int d = 0; d < D; d++) {
                    const float xd = x[d] * scale, *w = w_uk + ((long)h * D + d) * CD;
                    for (int c = 0; c < CD; c++) row[c] += xd * w[c];
                }
                const float *y = qr + b * qr_b + h * qr_h + t * qr_t;
                for (int c = 0; c < PD; c++) row[CD + c] = y[c] * scale;
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
                const float f = expf(pieces[i].m[r] - top);
                l += pieces[i].l[r] * f;
                for (int c = 0; c < CD; c++) o[c] += pieces[i].o[r * CD + c] * f;
            }
            const int h = r / T, t = r % T;
            float *dst = y + (long)t * H * D + (long)h * D;
            for (int d = 0; d < D; d++) dst[d] = dot(o, w_uv + ((long)h * D + d) * CD, CD) / l;
        }
        for (int t = 0; t < T; t++)                   /* W_o */
            for (int e = 0; e < E; e++)
                out[((long)b * T + t) * E + e] = dot(w_o + (long)e * H * D, y + (long)t * H * D, H * D);
    }
    free(q); free(buf); free(y);
    return 0;
}
"""

_lock = threading.Lock()
_libs: dict[tuple[int, int], object] = {}      # (latent, rope) -> the loaded function, or None after a failure


def enabled() -> bool:
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


def _function(latent: int, rope: int):
    """The compiled kernel for this latent and RoPE width, or None (logged once) when it cannot be had."""
    key = (latent, rope)
    if key in _libs:
        return _libs[key]
    with _lock:
        if key not in _libs:
            try:
                fn = ctypes.CDLL(str(_built(latent, rope))).mla_absorbed_decode
                i, f, p, n = ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_long
                fn.argtypes = [i, i, i, i, i, i, i, f, p, n, n, n, p, n, n, n, p, p, p, p, n, n, p, n, n, p]
                fn.restype = i
                _libs[key] = fn
            except Exception as err:                  # no compiler, a failed build or load: PyTorch instead
                log.warning("fused MLA kernel unavailable, using the PyTorch kernel: %s", err)
                _libs[key] = None
    return _libs[key]


def _weights(layer, inp: dict) -> tuple | None:
    """W_uk, W_uv and W_o when the fused kernel applies to these inputs (without building it), else None.
    (Module attribute lookups cost about a microsecond each, so they are made once a call.)"""
    c, q_nope, latent = layer.c, inp["q_nope"], inp["latent"]
    if not (enabled() and c.kv_latent % 8 == 0 and c.kv_latent > 0 and c.rope_dim % 8 == 0
            and 0 < q_nope.shape[1] * q_nope.shape[2] <= MAX_ROWS and latent.shape[1] > 0):
        return None
    wo = layer.wo
    weights = layer.w_uk.weight, layer.w_uv.weight, wo.weight
    if wo.bias is None and all(t.is_cpu and t.dtype is torch.float32
                               for t in (latent, inp["k_rope"], q_nope, inp["q_rope"], *weights)):
        return weights
    return None


def applies(layer, inp: dict) -> bool:
    """Whether `absorbed` runs the fused kernel for these inputs (without building it)."""
    return _weights(layer, inp) is not None


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


@torch.no_grad()
def absorbed(layer, inp: dict) -> torch.Tensor | None:
    """The absorbed decode's output [B, T, d_model] (what `mla.absorbed_matmul` returns), or None where the
    fused kernel does not apply or is unavailable."""
    weights = _weights(layer, inp)
    if weights is None:
        return None
    c = layer.c
    fn = _function(c.kv_latent, c.rope_dim)
    if fn is None:
        return None
    latent, k_rope = _last_contiguous(inp["latent"]), _last_contiguous(inp["k_rope"])
    q_nope, q_rope = _last_contiguous(inp["q_nope"]), _last_contiguous(inp["q_rope"])
    w_uk, w_uv, w_o = (w.contiguous() for w in weights)
    b, h, t, d = q_nope.shape
    out = torch.empty(b, t, w_o.shape[0], dtype=torch.float32)
    if fn(b, t, h, d, w_o.shape[0], latent.shape[1], torch.get_num_threads(), 1 / math.sqrt(c.head_dim + c.rope_dim),
          q_nope.data_ptr(), *q_nope.stride()[:3], q_rope.data_ptr(), *q_rope.stride()[:3],
          w_uk.data_ptr(), w_uv.data_ptr(), w_o.data_ptr(), latent.data_ptr(), *latent.stride()[:2],
          k_rope.data_ptr(), *k_rope.stride()[:2], out.data_ptr()) != 0:
        return None
    return out
