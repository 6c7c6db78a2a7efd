/* tests/gpu/test_lt_fp8.c - the W8A8 FP8 prefill GEMM of the CUDA engine: kernels/dequant.h's
 * activation quantization (tm_k_act_quant_fp8) and runner/engine/cuda/lt_fp8.h's cuBLASLt
 * block-scaled (1 x 128 activations, 128 x 128 weights) and row-scaled (per token, per row) GEMMs.
 * Skipped (77) without a GPU or in a build without CUDA.
 *
 * Checks:
 * - activation quantization: every e4m3 byte and fp32 scale equal to a host quantization written
 *   here from the rule (s = amax / 448 per group, q = tm_f32_to_e4m3(x / s)), including all-zero
 *   groups, +-448-sized values and tiny ones;
 * - GEMMs: against a double-precision reference computed from the same quantized activations and
 *   weights (so only the library's accumulation differs): |gpu - ref| <= TOL_REL * sum |w x|,
 *   with beta 0 and beta 1 (a residual already in dst), several prefill sizes including ones that
 *   are not tile multiples or multiples of 4 (the GEMM pads them, lt_fp8.h). TOL_REL is loose
 * (1e-3) because Hopper's FP8 MMA accumulates with fewer than fp32's bits inside a K block; the
 * worst error seen is printed. If cuBLASLt has no algorithm for a mode (older library), that mode's
 * GEMM checks are skipped with a message (the engine then dequantizes, see llama.c lt_setup). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tm_test.h"

#ifndef TM_HAVE_CUDA
int main(void) { tm_test_skip("built without CUDA"); }
#else

#include <cuda_runtime_api.h>

#include "kernels/dequant.h"
#include "runner/engine/cuda/lt_fp8.h"
#include "runner/model/tensor.h"
#include "tm_gpu_test.h"

#define TOL_REL 1e-3

static void *g_ws;
static const size_t g_ws_bytes = (size_t)32 << 20;

/* Host quantization of x [n_tok][n_in] bf16 by the kernel's rule; scales in the kernel's layout. */
static void host_quant(const uint16_t *x, uint32_t n_tok, uint32_t n_in, uint32_t group, uint8_t *q,
                       float *sc) {
    const uint32_t n_pad = TM_LT_FP8_TOK(n_tok);
    for (uint32_t t = n_tok; t < n_pad; t++) { // padding rows: zeros, scale 1
        memset(q + (size_t)t * n_in, 0, n_in);
        for (uint32_t g0 = 0; g0 < n_in; g0 += group)
            sc[group == 128 ? (size_t)(g0 / 128) * n_pad + t : t] = 1.0f;
    }
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t g0 = 0; g0 < n_in; g0 += group) {
            float amax = 0.0f;
            for (uint32_t i = g0; i < g0 + group; i++)
                amax = fmaxf(amax, fabsf(bf(x[(size_t)t * n_in + i])));
            const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
            for (uint32_t i = g0; i < g0 + group; i++)
                q[(size_t)t * n_in + i] = tm_f32_to_e4m3(bf(x[(size_t)t * n_in + i]) / s);
            if (group == 128)
                sc[(size_t)(g0 / 128) * n_pad + t] = s;
            else
                sc[t] = s;
        }
}

static void rand_acts(uint16_t *x, uint32_t n_tok, uint32_t n_in) {
    for (size_t i = 0; i < (size_t)n_tok * n_in; i++) {
        const uint32_t r = urand(100);
        const float mag = r == 0 ? 300.0f : r == 1 ? 1e-5f : 3.0f;
        x[i] = to_bf(mag * frand());
    }
    if (n_in >= 128) // one all-zero group
        memset(x, 0, 128 * sizeof(uint16_t));
}

static void quant_case(uint32_t n_tok, uint32_t n_in, uint32_t group) {
    tm_err err = {0};
    const uint32_t n_pad = TM_LT_FP8_TOK(n_tok);
    const size_t n = (size_t)n_pad * n_in, n_sc = group == 128 ? n / 128 : n_pad;
    uint16_t *x = xmalloc(n * 2);
    rand_acts(x, n_pad, n_in); // rows past n_tok must be ignored
    uint8_t *q = xmalloc(n), *gq = xmalloc(n);
    float *sc = xmalloc(n_sc * 4), *gsc = xmalloc(n_sc * 4);
    host_quant(x, n_tok, n_in, group, q, sc);
    uint16_t *d_x = dup_to_dev(x, n * 2);
    uint8_t *d_q = dalloc(n, 0xff);
    float *d_sc = dalloc(n_sc * 4, 0xff);
    tm_k_act_quant_fp8_args a = {.out = d_q,
                                 .scale = d_sc,
                                 .x = d_x,
                                 .n_tok = n_tok,
                                 .n_in = n_in,
                                 .n_tok_pad = n_pad,
                                 .group = group};
    TM_CHECK(tm_k_act_quant_fp8(&a, g_stream, &err) == TM_OK);
    TM_ASSERT(cudaStreamSynchronize(g_stream) == cudaSuccess);
    to_host(gq, d_q, n);
    to_host(gsc, d_sc, n_sc * 4);
    size_t bad_q = 0, bad_s = 0;
    for (size_t i = 0; i < n; i++)
        bad_q += gq[i] != q[i];
    for (size_t i = 0; i < n_sc; i++)
        bad_s += memcmp(&gsc[i], &sc[i], 4) != 0;
    TM_CHECK_MSG(bad_q == 0 && bad_s == 0,
                 "act_quant %u tok x %u, group %u: %zu bytes and %zu scales differ from the host",
                 n_tok, n_in, group, bad_q, bad_s);
    cudaFree(d_x), cudaFree(d_q), cudaFree(d_sc);
    free(x), free(q), free(gq), free(sc), free(gsc);
}

static void gemm_case(tm_lt_fp8 *lt, tm_lt_fp8_mode mode, uint32_t n_tok, uint32_t n_in,
                      uint32_t n_out, float beta) {
    tm_err err = {0};
    const uint32_t group = mode == TM_LT_FP8_BLOCK ? 128 : n_in;
    const uint32_t n_pad = TM_LT_FP8_TOK(n_tok);
    const size_t nx = (size_t)n_pad * n_in, nw = (size_t)n_out * n_in, ny = (size_t)n_pad * n_out;
    uint16_t *x = xmalloc(nx * 2);
    rand_acts(x, n_tok, n_in);
    uint8_t *xq = xmalloc(nx), *w = xmalloc(nw);
    const size_t n_xs = group == 128 ? nx / 128 : n_pad;
    float *xs = xmalloc(n_xs * 4);
    host_quant(x, n_tok, n_in, group, xq, xs);
    for (size_t i = 0; i < nw; i++) { // e4m3 of uniform values, no NaN codes
        uint8_t b;
        do
            b = (uint8_t)urand(256);
        while ((b & 0x7f) == 0x7f || (b & 0x7f) > 0x70);
        w[i] = b;
    }
    const size_t n_ws = mode == TM_LT_FP8_BLOCK ? (size_t)(n_out / 128) * (n_in / 128) : n_out;
    float *ws = xmalloc(n_ws * 4);
    for (size_t i = 0; i < n_ws; i++)
        ws[i] = 1e-2f * (1.0f + 0.9f * frand());
    float *y0 = xmalloc(ny * 4), *y = xmalloc(ny * 4);
    for (size_t i = 0; i < ny; i++)
        y0[i] = beta != 0.0f ? frand() : NAN; // poisoned when beta is 0
    uint8_t *d_w = dup_to_dev(w, nw), *d_xq = dup_to_dev(xq, nx);
    float *d_ws = dup_to_dev(ws, n_ws * 4), *d_xs = dup_to_dev(xs, n_xs * 4);
    float *d_y = dup_to_dev(y0, ny * 4);
    const tm_rc rc = tm_lt_fp8_gemm(lt, mode, d_w, d_ws, d_xq, d_xs, n_tok, n_in, n_out, d_y, beta,
                                    &err);
    TM_CHECK_MSG(rc == TM_OK, "%s", err.msg);
    TM_ASSERT(cudaStreamSynchronize(g_stream) == cudaSuccess);
    to_host(y, d_y, ny * 4);
    int bad = 0;
    double worst = 0;
    char first[200] = "";
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t o = 0; o < n_out; o++) {
            double acc = 0, mag = 0;
            for (uint32_t k = 0; k < n_in; k++) {
                const double sw = mode == TM_LT_FP8_BLOCK ? ws[(o / 128) * (n_in / 128) + k / 128]
                                                          : ws[o];
                const double sx = group == 128 ? xs[(size_t)(k / 128) * n_pad + t] : xs[t];
                const double p = tm_e4m3_to_f32(w[(size_t)o * n_in + k]) * sw *
                                 tm_e4m3_to_f32(xq[(size_t)t * n_in + k]) * sx;
                acc += p, mag += fabs(p);
            }
            const double ref = acc + (beta != 0.0f ? (double)y0[(size_t)t * n_out + o] : 0.0);
            const double got = y[(size_t)t * n_out + o], e = fabs(got - ref);
            const double m = mag + (beta != 0.0f ? fabs(y0[(size_t)t * n_out + o]) : 0.0);
            if (m > 0 && e / m > worst)
                worst = e / m;
            if (!(e <= TOL_REL * m + 1e-30)) {
                if (!bad)
                    snprintf(first, sizeof(first), "token %u row %u: gpu %.9g ref %.9g", t, o, got,
                             ref);
                bad++;
            }
        }
    printf("  lt %s %u tok x %u -> %u, beta %g: worst |err| / sum|wx| %.3g\n",
           mode == TM_LT_FP8_BLOCK ? "block" : "rowwise", n_tok, n_in, n_out, (double)beta, worst);
    TM_CHECK_MSG(bad == 0, "lt %s %u x %u -> %u beta %g: %d bad outputs, first %s",
                 mode == TM_LT_FP8_BLOCK ? "block" : "rowwise", n_tok, n_in, n_out, (double)beta,
                 bad, first);
    cudaFree(d_w), cudaFree(d_xq), cudaFree(d_ws), cudaFree(d_xs), cudaFree(d_y);
    free(x), free(xq), free(w), free(xs), free(ws), free(y0), free(y);
}

static void test_act_quant(void) {
    quant_case(1, 128, 128);
    quant_case(37, 4096, 128);
    quant_case(300, 1536, 128);
    quant_case(5, 4096, 4096);
    quant_case(64, 2000, 2000);
}

static void test_gemm(void) {
    tm_err err = {0};
    tm_lt_fp8 *lt = NULL;
    TM_ASSERT(tm_lt_fp8_create(g_stream, g_ws, g_ws_bytes, &lt, &err) == TM_OK);
    for (int m = 0; m < 2; m++) {
        const tm_lt_fp8_mode mode = (tm_lt_fp8_mode)m;
        if (!tm_lt_fp8_probe(lt, mode, 64, 512, 384, &err)) {
            printf("  lt %s: no cuBLASLt algorithm (%s): skipped\n",
                   m == TM_LT_FP8_BLOCK ? "block" : "rowwise", err.msg);
            continue;
        }
        gemm_case(lt, mode, 17, 512, 384, 0.0f);
        gemm_case(lt, mode, 64, 512, 384, 1.0f);
        gemm_case(lt, mode, 300, 1024, 256, 0.0f);
        gemm_case(lt, mode, 129, 4096, 128, 1.0f);
        gemm_case(lt, mode, 132, 2048, 1024, 0.0f);
    }
    tm_lt_fp8_destroy(lt);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    TM_ASSERT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess);
    TM_ASSERT(cudaMalloc(&g_ws, g_ws_bytes) == cudaSuccess);
    g_rng = 0x5eed1f8aull;
    TM_RUN(test_act_quant);
    TM_RUN(test_gemm);
    cudaFree(g_ws);
    cudaStreamDestroy(g_stream);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
