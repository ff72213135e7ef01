"""Native int8 / int4 matrix-vector products for the CPU: each code read once, widened and multiplied in registers.

Decoding at batch 1 reads every weight once per token, so a layer's speed is its bytes over memory bandwidth. An int8
matrix has a quarter of float32's bytes, but no PyTorch kernel reads it at that speed on an AVX2 CPU: the compiled
reduction (:func:`vgen.kernels.quant.int8_gemv`) loads 8 codes at a time into one accumulator per output, the tiled
product (:func:`vgen.kernels.quant.int8_tiled`) writes and rereads a float tile, and ``torch._weight_int8pack_mm`` /
``torch._weight_int4pack_mm_for_cpu`` run 3-8x slower than float32 there. These kernels, a few dozen lines of C with
AVX2 intrinsics, widen 16 codes to floats in registers and multiply them by up to 4 activation rows at a time, their
outputs split over PyTorch's OpenMP threads (the process's own ``libgomp``, already loaded by torch):

* ``int8``: one scale per output (:class:`vgen.kernels.quant.Int8Linear`'s codes as they are);
* ``int4``: two codes a byte, a scale and offset per group (:class:`vgen.kernels.quant.Int4Linear`'s portable
  layout, its scales stored output by output); the offsets' term is each row's sum over a group, taken once a call.

The timings are in docs/quantization.md ("Speed on this CPU"; docs/bench/quant-kernels-cpu-avx2.json and, with
the int4 kernel below, quant-kernels-cpu-avx512-native.json).

They are built once per machine with the C compiler the CPU build of PyTorch already needs for ``torch.compile``
(``$CC``, else ``cc`` / ``gcc`` / ``clang``), into vgen's cache (``$VGEN_CACHE``, else ``~/.cache/vgen``,
``native/``), written under a temporary name and renamed, so concurrent processes never load half a file; then loaded
with ``ctypes`` (no Python or PyTorch headers: about a second to build). Where there is no compiler, no x86-64 CPU
with AVX2 and FMA, or the build fails, :func:`library` says why once and vgen keeps PyTorch's products.

Each output is one reduction in a fixed order whatever the number of rows, so a row's bytes do not depend on the rows
beside it (batch-invariant, unlike a BLAS product).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

ROWS = 16  # widest input the kernels take: 1.4-2x faster than the tiled int8 product at 16 rows on AVX2, mixed at 32

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

/* y[m][n] = scale[n] * sum_k x[m][k] * q[n][k] for outputs n0..n1 and MM rows of x (K floats apart), 16 codes a step */
#define ROWS_OF(MM) \
static void rows##MM(const float *x, const int8_t *q, const float *scale, float *y, long N, long K, long n0, long n1) { \
    for (long n = n0; n < n1; n++) { \
        const int8_t *w = q + n * K; \
        __m256 a0[MM], a1[MM]; \
        for (int m = 0; m < MM; m++) { a0[m] = _mm256_setzero_ps(); a1[m] = _mm256_setzero_ps(); } \
        long k = 0; \
        for (; k + 16 <= K; k += 16) { \
            __m128i c = _mm_loadu_si128((const __m128i *)(w + k)); \
            __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)); \
            __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8))); \
            for (int m = 0; m < MM; m++) { \
                a0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * K + k), a0[m]); \
                a1[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * K + k + 8), a1[m]); \
            } \
        } \
        for (int m = 0; m < MM; m++) { \
            float s = hsum(_mm256_add_ps(a0[m], a1[m])); \
            for (long j = k; j < K; j++) s += x[m * K + j] * (float)w[j]; \
            y[m * N + n] = s * scale[n]; \
        } \
    } \
}
ROWS_OF(1) ROWS_OF(2) ROWS_OF(3) ROWS_OF(4)

/* x (M, K) float32, q (N, K) int8, scale (N) float32 -> y (M, N) float32; 64 outputs per task, 4 rows per sweep */
void vgen_int8_gemv(const float *x, const int8_t *q, const float *scale, float *y, long M, long N, long K,
                    int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long b = 0; b < (N + 63) / 64; b++) {
        long n0 = b * 64, n1 = n0 + 64 < N ? n0 + 64 : N;
        for (long m = 0; m < M; m += 4) {
            long mm = M - m < 4 ? M - m : 4;
            const float *xm = x + m * K;
            float *ym = y + m * N;
            if (mm == 1) rows1(xm, q, scale, ym, N, K, n0, n1);
            else if (mm == 2) rows2(xm, q, scale, ym, N, K, n0, n1);
            else if (mm == 3) rows3(xm, q, scale, ym, N, K, n0, n1);
            else rows4(xm, q, scale, ym, N, K, n0, n1);
        }
    }
}

/* int4, two codes a byte (low nibble first), w = q * s + lo per group of G inputs (sz: (N, K/G, 2) = s, z with
   z = lo + 8 s, tinygemm's form); y[m][n] = sum_k (q s) x + sum_g (z - 8 s) * sum_g x. Each 8 codes are one 32-bit
   word broadcast to 8 lanes and shifted by 0, 4, ..., 28 (no byte shuffles), widened and scaled by the group's s
   (shared by the rows), then two accumulators per row (even and odd steps of 8) keep two FMA chains in flight */
#define ROWS4_OF(MM) \
static void rows4_##MM(const float *x, const float *xs, const uint8_t *q, const float *sz, float *y, long N, long K, \
                       long G, long n0, long n1) { \
    const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), low = _mm256_set1_epi32(15); \
    for (long n = n0; n < n1; n++) { \
        const uint8_t *w = q + n * (K / 2); \
        __m256 a0[MM], a1[MM]; float bias[MM]; \
        for (int m = 0; m < MM; m++) { a0[m] = _mm256_setzero_ps(); a1[m] = _mm256_setzero_ps(); bias[m] = 0.f; } \
        for (long g = 0; g < K / G; g++) { \
            float s = sz[(n * (K / G) + g) * 2], c = sz[(n * (K / G) + g) * 2 + 1] - 8.f * s; \
            __m256 sv = _mm256_set1_ps(s); \
            for (long k = g * G; k < (g + 1) * G; k += 16) { \
                int32_t b0, b1; \
                memcpy(&b0, w + k / 2, 4); memcpy(&b1, w + k / 2 + 4, 4); \
                __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256( \
                    _mm256_srlv_epi32(_mm256_set1_epi32(b0), shift), low)), sv); \
                __m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256( \
                    _mm256_srlv_epi32(_mm256_set1_epi32(b1), shift), low)), sv); \
                for (int m = 0; m < MM; m++) { \
                    a0[m] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * K + k), a0[m]); \
                    a1[m] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * K + k + 8), a1[m]); \
                } \
            } \
            for (int m = 0; m < MM; m++) bias[m] += c * xs[m * (K / G) + g]; \
        } \
        for (int m = 0; m < MM; m++) y[m * N + n] = hsum(_mm256_add_ps(a0[m], a1[m])) + bias[m]; \
    } \
}
ROWS4_OF(1) ROWS4_OF(2) ROWS4_OF(3) ROWS4_OF(4)

/* x (M, K) float32, q (N, K/2) uint8, sz (N, K/G, 2) float32, xs (M, K/G) scratch -> y (M, N) float32 */
void vgen_int4_gemv(const float *x, const uint8_t *q, const float *sz, float *xs, float *y, long M, long N, long K,
                    long G, int threads) {
    for (long m = 0; m < M; m++)
        for (long g = 0; g < K / G; g++) {
            float t = 0.f;
            for (long k = g * G; k < (g + 1) * G; k++) t += x[m * K + k];
            xs[m * (K / G) + g] = t;
        }
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long b = 0; b < (N + 63) / 64; b++) {
        long n0 = b * 64, n1 = n0 + 64 < N ? n0 + 64 : N;
        for (long m = 0; m < M; m += 4) {
            long mm = M - m < 4 ? M - m : 4;
            const float *xm = x + m * K, *xsm = xs + m * (K / G);
            float *ym = y + m * N;
            if (mm == 1) rows4_1(xm, xsm, q, sz, ym, N, K, G, n0, n1);
            else if (mm == 2) rows4_2(xm, xsm, q, sz, ym, N, K, G, n0, n1);
            else if (mm == 3) rows4_3(xm, xsm, q, sz, ym, N, K, G, n0, n1);
            else rows4_4(xm, xsm, q, sz, ym, N, K, G, n0, n1);
        }
    }
}

/* rows n0..n1 of the int4 matrix dequantized into out ((n1 - n0), K) float32: a tile for a wide product */
void vgen_int4_rows(const uint8_t *q, const float *sz, float *out, long n0, long n1, long K, long G, int threads) {
    const __m128i low = _mm_set1_epi8(15);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = n0; n < n1; n++) {
        const uint8_t *w = q + n * (K / 2);
        float *o = out + (n - n0) * K;
        for (long g = 0; g < K / G; g++) {
            float s = sz[(n * (K / G) + g) * 2];
            __m256 sv = _mm256_set1_ps(s), lo = _mm256_set1_ps(sz[(n * (K / G) + g) * 2 + 1] - 8.f * s);
            for (long k = g * G; k < (g + 1) * G; k += 16) {
                __m128i b = _mm_loadl_epi64((const __m128i *)(w + k / 2));
                __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(b, low), _mm_and_si128(_mm_srli_epi16(b, 4), low));
                _mm256_storeu_ps(o + k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), sv, lo));
                _mm256_storeu_ps(o + k + 8, _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))), sv, lo));
            }
        }
    }
}
"""

FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]

_LIB: dict = {}  # "fn": the loaded function, or "failed": why there is none (said once)


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else the first of cc, gcc, clang on the PATH."""
    cc = os.environ.get("CC")
    return cc if cc else next((shutil.which(c) for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def supported() -> str | None:
    """Why this machine cannot run the kernel (None: it can): an x86-64 CPU whose PyTorch build runs AVX2 or
    AVX-512 code (both imply FMA), on Linux or macOS, with a C compiler."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the CPU is {platform.machine()}, not x86-64"
    cap = torch.backends.cpu.get_cpu_capability()
    if not cap.startswith(("AVX2", "AVX512")):
        return f"the CPU runs {cap} code, not AVX2"
    if os.name != "posix":
        return "the build needs a POSIX C compiler"
    if compiler() is None:
        return "no C compiler (set $CC, or install gcc)"
    return None


def build(folder: Path | None = None) -> Path:
    """The shared library, built into ``folder`` (default: vgen's cache, ``native/``) unless a build of this source
    with these flags is there already. Raises ``RuntimeError`` with the compiler's message when it fails."""
    from vgen.io import cache_dir
    cc = compiler()
    key = hashlib.sha256("\0".join([SOURCE, cc or "", *FLAGS]).encode()).hexdigest()[:16]
    folder = Path(folder) if folder is not None else cache_dir() / "native"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"vgen_int8_{key}.so"
    if path.exists():
        return path
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src, out = Path(tmp) / "int8.c", Path(tmp) / "int8.so"
        src.write_text(SOURCE)
        done = subprocess.run([cc, *FLAGS, str(src), "-o", str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(cc).name} failed: {done.stderr.strip()[-300:]}")
        os.replace(out, path)  # atomic: another process sees the whole file or none
    return path


def library():
    """The kernels' shared library (``ctypes``), built and loaded on first use; None where :func:`supported` or the build says no
    (a warning names why, once per process)."""
    if "fn" in _LIB or "failed" in _LIB:
        return _LIB.get("fn")
    why = supported()
    if why is None:
        try:
            lib = ctypes.CDLL(str(build()))
            lib.vgen_int8_gemv.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
            lib.vgen_int4_gemv.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long] * 4 + [ctypes.c_int]
            lib.vgen_int4_rows.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 4 + [ctypes.c_int]
            lib.vgen_int8_gemv.restype = lib.vgen_int4_gemv.restype = lib.vgen_int4_rows.restype = None
            _LIB["fn"] = lib
            return lib
        except (RuntimeError, OSError) as e:
            why = f"the build failed ({e})"
    _LIB["failed"] = why
    warnings.warn(f"vgen: the native int8 kernel is off: {why}; int8 layers use PyTorch's products (slower at batch "
                  "1)", stacklevel=3)
    return None


def takes(x: torch.Tensor) -> bool:
    """Whether :func:`int8_gemv` takes this input: float32 on the CPU, at most :data:`ROWS` rows, on a machine where
    the kernel built."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[0] <= ROWS and library() is not None


def int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (M, K) float32 times the int8 matrix (N, K), scaled per output channel (float32 (N,)): (M, N) float32.
    Call only where :func:`takes` is true."""
    x, qweight, scale = x.contiguous(), qweight.contiguous(), scale.float().contiguous()
    (m, k), n = x.shape, qweight.shape[0]
    if qweight.dtype != torch.int8 or qweight.shape[1] != k or scale.shape != (n,):
        raise ValueError(f"int8_gemv: x {tuple(x.shape)}, weight {tuple(qweight.shape)}, scale {tuple(scale.shape)}")
    y = torch.empty(m, n, dtype=torch.float32)
    library().vgen_int8_gemv(x.data_ptr(), qweight.data_ptr(), scale.data_ptr(), y.data_ptr(), m, n, k,
                             torch.get_num_threads())
    return y


def int4_gemv(x: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """x (M, K) float32 times an int4 matrix in :class:`vgen.kernels.quant.Int4Linear`'s portable layout: codes two
    to a byte (N, K/2) uint8, the low nibble first, and ``scale_zero`` (K/G, N, 2), a scale and tinygemm's offset per
    group of ``group_size`` inputs (``w = (q - 8) * s + z``), read output by output: a transposed view of an
    (N, K/G, 2) float32 tensor (any other is copied each call). Gives (M, N) float32. Call only where :func:`takes`
    is true; ``group_size`` a multiple of 16 dividing K."""
    x, qweight, sz = x.contiguous(), qweight.contiguous(), scale_zero.float().transpose(0, 1).contiguous()
    (m, k), n = x.shape, qweight.shape[0]
    if qweight.dtype != torch.uint8 or 2 * qweight.shape[1] != k or sz.shape != (n, k // group_size, 2) or \
            group_size % 16 or k % group_size:
        raise ValueError(f"int4_gemv: x {tuple(x.shape)}, codes {tuple(qweight.shape)}, scales "
                         f"{tuple(scale_zero.shape)}, group {group_size}")
    y = torch.empty(m, n, dtype=torch.float32)
    sums = torch.empty(m, k // group_size, dtype=torch.float32)  # each row's sum over each group (the offsets' term)
    library().vgen_int4_gemv(x.data_ptr(), qweight.data_ptr(), sz.data_ptr(), sums.data_ptr(), y.data_ptr(), m, n,
                             k, group_size, torch.get_num_threads())
    return y


def int4_rows(qweight: torch.Tensor, scale_zero: torch.Tensor, group_size: int, rows: slice,
              out: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` of an int4 matrix in the portable layout (as :func:`int4_gemv` takes it) dequantized into
    ``out`` (a contiguous float32 (rows, K) buffer, returned): a tile for :func:`vgen.kernels.quant.int4_tiled`."""
    sz = scale_zero.transpose(0, 1)
    if qweight.dtype != torch.uint8 or not (qweight.is_contiguous() and sz.is_contiguous() and out.is_contiguous()) \
            or sz.dtype != torch.float32 or out.dtype != torch.float32:
        raise ValueError("int4_rows takes contiguous uint8 codes, float32 scales stored output by output and a "
                         "contiguous float32 buffer")
    k = 2 * qweight.shape[1]
    library().vgen_int4_rows(qweight.data_ptr(), sz.data_ptr(), out.data_ptr(), rows.start, rows.stop, k, group_size,
                             torch.get_num_threads())
    return out
