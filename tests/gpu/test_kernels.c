/* tests/gpu/test_kernels.c - every CUDA launcher of kernels/ against its host reference
 * (runner/engine/cpu/ops.h, or a plain loop here where the op has no engine op), on fresh random
 * inputs and edge shapes (0, 1, non-multiples of the block and tile sizes, large positions).
 * Outputs are poisoned (bf16 NaN / float NaN) before each launch, so an element the kernel fails
 * to write shows up as NaN. Skipped (77) without a GPU or in a build without CUDA.
 *
 * Tolerances, per output dtype:
 *   bf16 outputs: |gpu - ref| <= 2^-8 * |ref| + abs_tol: one bf16 ulp (the output rounding is
 *     half an ulp; fp32 reduction order, FMA contraction and sincosf/expf ulps take the rest),
 *     abs_tol 1e-6 for element-wise ops and 1e-3 * max|V| for attention (fp32 sums of products);
 *   fp32 outputs of gathers and argmax ids: exact. */
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

#include "kernels/act.h"
#include "kernels/attn_paged.h"
#include "kernels/embed.h"
#include "kernels/fill.h"
#include "kernels/gemm_skinny.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sample.h"
#include "kernels/tp.h"
#include "runner/engine/cpu/ops.h"
#include "runner/engine/engine.h"
#include "runner/model/tensor.h"
#include "tm_gpu_test.h"

/* 1: rope_case and attn_case run with an fp8 (e4m3) KV cache (kv_fp8). */
static int g_kv_fp8;
static uint64_t g_fp8_n, g_fp8_exact; /* fp8 K/V elements written, equal to the host's */

/* Compare bf16 gpu values with fp32 references; returns the number of failures and prints the
 * first. */
static int cmp_bf16(const char *what, const uint16_t *gpu, const float *ref, size_t n,
                    float abs_tol) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float g = bf(gpu[i]), r = ref[i];
        if (!(fabsf(g - r) <= 0x1p-8f * fabsf(r) + abs_tol)) {
            if (!bad)
                fprintf(stderr, "%s: element %zu: gpu %.8g ref %.8g\n", what, i, g, r);
            bad++;
        }
    }
    return bad;
}

/* n_part split-K partials of v[n] for a consumer that sums them in order: part 0 = v, the
 * others small random values; v becomes the in-order fp32 sum the consumer must compute.
 * Returns [n_part][n] (malloc'd). */
static float *make_parts(float *v, size_t n, uint32_t n_part) {
    float *p = xmalloc((size_t)n_part * n * 4);
    memcpy(p, v, n * 4);
    for (uint32_t k = 1; k < n_part; k++)
        for (size_t i = 0; i < n; i++) {
            p[k * n + i] = 0.25f * frand();
            v[i] += p[k * n + i];
        }
    return p;
}

/* ---- embed ---- */

static void embed_case(uint32_t n_vocab, uint32_t n_embd, uint32_t n_tok) {
    tm_err err = {0};
    uint16_t *tab = xmalloc((size_t)n_vocab * n_embd * 2);
    uint32_t *tok = xmalloc(n_tok * 4);
    for (size_t i = 0; i < (size_t)n_vocab * n_embd; i++)
        tab[i] = to_bf(frand());
    for (uint32_t t = 0; t < n_tok; t++)
        tok[t] = urand(n_vocab);
    if (n_tok)
        tok[n_tok - 1] = n_vocab - 1;
    uint16_t *d_tab = dup_to_dev(tab, (size_t)n_vocab * n_embd * 2);
    uint32_t *d_tok = dup_to_dev(tok, n_tok * 4);
    float *d_x = dalloc((size_t)n_tok * n_embd * 4, 0xff);
    tm_k_embed_bf16_args a = {
        .x = d_x, .table = d_tab, .tokens = d_tok, .n_tok = n_tok, .n_embd = n_embd};
    TM_CHECK_OK(tm_k_embed_bf16(&a, g_stream, &err), &err);
    float *x = xmalloc((size_t)n_tok * n_embd * 4), *ref = xmalloc(n_embd * 4);
    to_host(x, d_x, (size_t)n_tok * n_embd * 4);
    int bad = 0;
    for (uint32_t t = 0; t < n_tok; t++) {
        tm_dtype_to_f32(tab, TM_DTYPE_BF16, (size_t)tok[t] * n_embd, n_embd, ref);
        bad += memcmp(ref, x + (size_t)t * n_embd, n_embd * 4) != 0;
    }
    TM_CHECK_MSG(bad == 0, "embed %u x %u, %u tokens: %d rows differ", n_vocab, n_embd, n_tok, bad);
    cudaFree(d_tab), cudaFree(d_tok), cudaFree(d_x);
    free(tab), free(tok), free(x), free(ref);
}

static void test_embed(void) {
    embed_case(1, 1, 1);
    embed_case(7, 5, 0);
    embed_case(100, 64, 13);
    embed_case(1000, 4099, 3);
}

/* ---- rmsnorm ---- */

static void rmsnorm_case(uint32_t n_x, uint32_t n_row, uint32_t n_col, int gather, uint32_t n_add) {
    tm_err err = {0};
    float *x = xmalloc((size_t)n_x * n_col * 4), *w = xmalloc(n_col * 4);
    uint32_t *rows = xmalloc(n_row * 4);
    for (size_t i = 0; i < (size_t)n_x * n_col; i++)
        x[i] = 3.0f * frand();
    for (uint32_t c = 0; c < n_col; c++)
        w[c] = 1.0f + 0.3f * frand();
    for (uint32_t r = 0; r < n_row; r++)
        rows[r] = gather ? urand(n_x) : r;
    // With n_add: x on the device is the base, the partials are added by the kernel; x here
    // becomes the in-order sum (what x must hold afterwards, bit for bit).
    float *d_x = dup_to_dev(x, (size_t)n_x * n_col * 4), *d_w = dup_to_dev(w, n_col * 4);
    float *d_add = NULL;
    if (n_add) {
        float *xs = xmalloc((size_t)n_x * n_col * 4);
        memcpy(xs, x, (size_t)n_x * n_col * 4);
        float *parts = make_parts(xs, (size_t)n_x * n_col, n_add + 1); // part 0 = base x
        d_add = dup_to_dev(parts + (size_t)n_x * n_col, (size_t)n_add * n_x * n_col * 4);
        memcpy(x, xs, (size_t)n_x * n_col * 4);
        free(xs), free(parts);
        TM_ASSERT(!gather); // rows gathered twice would add twice
    }
    uint32_t *d_rows = dup_to_dev(rows, n_row * 4);
    uint16_t *d_out = dalloc((size_t)n_row * n_col * 2, 0xff);
    tm_k_rmsnorm_bf16_args a = {.out = d_out,
                                .x = d_x,
                                .rows = gather ? d_rows : NULL,
                                .w = d_w,
                                .n_row = n_row,
                                .n_col = n_col,
                                .eps = 1e-5f,
                                .add = d_add,
                                .add_stride = (size_t)n_x * n_col,
                                .n_add = n_add};
    TM_CHECK_OK(tm_k_rmsnorm_bf16(&a, g_stream, &err), &err);
    if (n_add) {
        float *xg = xmalloc((size_t)n_x * n_col * 4);
        to_host(xg, d_x, (size_t)n_x * n_col * 4);
        size_t differ = 0;
        for (size_t i = 0; i < (size_t)n_row * n_col; i++)
            differ += xg[i] != x[i];
        TM_CHECK_MSG(differ == 0, "rmsnorm add %u partials: %zu x values differ", n_add, differ);
        free(xg);
        cudaFree(d_add);
    }
    uint16_t *out = xmalloc((size_t)n_row * n_col * 2);
    to_host(out, d_out, (size_t)n_row * n_col * 2);
    float *ref = xmalloc((size_t)n_row * n_col * 4);
    for (uint32_t r = 0; r < n_row; r++) {
        tm_k_rmsnorm_args ra = {.out = ref + (size_t)r * n_col,
                                .x = x + (size_t)rows[r] * n_col,
                                .w = w,
                                .w_dtype = TM_DTYPE_F32,
                                .n_row = 1,
                                .n_col = n_col,
                                .eps = 1e-5f};
        tm_cpu_rmsnorm(&ra);
    }
    int bad = cmp_bf16("rmsnorm", out, ref, (size_t)n_row * n_col, 1e-6f);
    TM_CHECK_MSG(bad == 0, "rmsnorm %u rows x %u (gather %d, add %u): %d bad", n_row, n_col, gather,
                 n_add, bad);
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_rows), cudaFree(d_out);
    free(x), free(w), free(rows), free(out), free(ref);
}

static void test_rmsnorm(void) {
    rmsnorm_case(0, 0, 64, 0, 0);
    rmsnorm_case(1, 1, 1, 0, 0);
    rmsnorm_case(5, 5, 7, 0, 0);
    rmsnorm_case(33, 33, 257, 0, 0);
    rmsnorm_case(3, 2, 4096, 0, 0);
    rmsnorm_case(40, 8, 4096 + 3, 1, 0);
    rmsnorm_case(8, 8, 4096, 0, 16); // residual add of split-K partials
    rmsnorm_case(3, 3, 7, 0, 2);     // scalar path
}

/* ---- silu_mul ---- */

static void silu_case(uint32_t n_tok, uint32_t n_ff, uint32_t n_part) {
    tm_err err = {0};
    const size_t n = (size_t)n_tok * n_ff;
    float *gu = xmalloc(2 * n * 4);
    for (size_t i = 0; i < 2 * n; i++)
        gu[i] = 8.0f * frand();
    float *parts = make_parts(gu, 2 * n, TM_MAX(n_part, 1u));
    float *d_gu = dup_to_dev(parts, TM_MAX(n_part, 1u) * 2 * n * 4);
    free(parts);
    uint16_t *d_out = dalloc(n * 2, 0xff);
    tm_k_silu_mul_bf16_args a = {.out = d_out,
                                 .gu = d_gu,
                                 .n_tok = n_tok,
                                 .n_ff = n_ff,
                                 .n_part = n_part,
                                 .part_stride = 2 * n};
    TM_CHECK_OK(tm_k_silu_mul_bf16(&a, g_stream, &err), &err);
    uint16_t *out = xmalloc(n * 2);
    to_host(out, d_out, n * 2);
    float *ref = xmalloc(n * 4);
    for (uint32_t t = 0; t < n_tok; t++) {
        tm_k_silu_mul_args ra = {.out = ref + (size_t)t * n_ff,
                                 .gate = gu + (size_t)t * 2 * n_ff,
                                 .up = gu + (size_t)t * 2 * n_ff + n_ff,
                                 .n = n_ff};
        tm_cpu_silu_mul(&ra);
    }
    int bad = cmp_bf16("silu_mul", out, ref, n, 1e-6f);
    TM_CHECK_MSG(bad == 0, "silu_mul %u x %u, %u partials: %d bad", n_tok, n_ff, n_part, bad);
    cudaFree(d_gu), cudaFree(d_out);
    free(gu), free(out), free(ref);
}

static void test_silu_mul(void) {
    silu_case(0, 16, 0);
    silu_case(1, 1, 0);
    silu_case(3, 255, 0);
    silu_case(17, 14336, 0);
    silu_case(8, 14336, 3);
    silu_case(3, 255, 2);
}

/* ---- rope + KV write ---- */

static void rope_case(uint32_t n_tok, uint32_t n_head, uint32_t n_kv_head, uint32_t hd, int bias,
                      int llama3, uint32_t max_pos, uint32_t n_part) {
    tm_err err = {0};
    const uint32_t qd = n_head * hd, kvd = n_kv_head * hd, ld = qd + 2 * kvd, half = hd / 2;
    const uint32_t n_slot = n_tok + 5;
    tm_model_cfg cfg = {.head_dim = hd, .rope_theta = 500000.0f};
    if (llama3) {
        cfg.rope_type = TM_ROPE_LLAMA3;
        cfg.rope_factor = 8.0f;
        cfg.rope_low_freq_factor = 1.0f;
        cfg.rope_high_freq_factor = 4.0f;
        cfg.rope_orig_ctx = 8192;
    }
    float *inv = xmalloc(half * 4);
    tm_model_rope_inv_freq(&cfg, inv);
    float *qkv = xmalloc((size_t)n_tok * ld * 4), *b = xmalloc(ld * 4);
    uint32_t *pos = xmalloc(n_tok * 4), *slot = xmalloc(n_tok * 4);
    for (size_t i = 0; i < (size_t)n_tok * ld; i++)
        qkv[i] = 2.0f * frand();
    for (uint32_t i = 0; i < ld; i++)
        b[i] = 0.5f * frand();
    // distinct slots: a shuffled prefix of [0, n_slot)
    uint32_t *perm = shuffled(n_slot);
    for (uint32_t t = 0; t < n_tok; t++) {
        pos[t] = t == 0 ? max_pos : urand(max_pos + 1);
        slot[t] = perm[t];
    }
    float *parts = make_parts(qkv, (size_t)n_tok * ld, TM_MAX(n_part, 1u));
    float *d_qkv = dup_to_dev(parts, (size_t)TM_MAX(n_part, 1u) * n_tok * ld * 4);
    float *d_b = dup_to_dev(b, ld * 4);
    free(parts);
    float *d_inv = dup_to_dev(inv, half * 4);
    uint32_t *d_pos = dup_to_dev(pos, n_tok * 4), *d_slot = dup_to_dev(slot, n_tok * 4);
    uint16_t *d_q = dalloc((size_t)n_tok * qd * 2, 0xff);
    uint16_t *d_k = dalloc((size_t)n_slot * kvd * 2, 0xff);
    uint16_t *d_v = dalloc((size_t)n_slot * kvd * 2, 0xff);
    tm_k_rope_kv_bf16_args a = {.q = d_q,
                                .k_cache = d_k,
                                .v_cache = d_v,
                                .qkv = d_qkv,
                                .bias = bias ? d_b : NULL,
                                .pos = d_pos,
                                .slot = d_slot,
                                .inv_freq = d_inv,
                                .n_tok = n_tok,
                                .n_head = n_head,
                                .n_kv_head = n_kv_head,
                                .head_dim = hd,
                                .n_part = n_part,
                                .part_stride = (size_t)n_tok * ld,
                                .kv_fp8 = (uint32_t)g_kv_fp8};
    TM_CHECK_OK(tm_k_rope_kv_bf16(&a, g_stream, &err), &err);
    uint16_t *q = xmalloc((size_t)n_tok * qd * 2), *k = xmalloc((size_t)n_slot * kvd * 2);
    uint16_t *v = xmalloc((size_t)n_slot * kvd * 2);
    to_host(q, d_q, (size_t)n_tok * qd * 2);
    to_host(k, d_k, (size_t)n_slot * kvd * 2);
    to_host(v, d_v, (size_t)n_slot * kvd * 2);

    // reference: bias, rope tables, tm_cpu_rope on q and k
    float *rq = xmalloc((size_t)n_tok * ld * 4);
    float *cs = xmalloc((size_t)n_tok * half * 4), *sn = xmalloc((size_t)n_tok * half * 4);
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t i = 0; i < ld; i++)
            rq[(size_t)t * ld + i] = qkv[(size_t)t * ld + i] + (bias ? b[i] : 0.0f);
    tm_cpu_rope_table(pos, n_tok, inv, hd, cs, sn);
    tm_k_rope_args r1 = {.x = rq,
                         .cos = cs,
                         .sin = sn,
                         .n_tok = n_tok,
                         .n_head = n_head,
                         .head_dim = hd,
                         .ld_x = ld};
    tm_cpu_rope(&r1);
    tm_k_rope_args r2 = r1;
    r2.x = rq + qd;
    r2.n_head = n_kv_head;
    tm_cpu_rope(&r2);
    int bad = 0, unwritten_ok = 1;
    float *row = xmalloc(ld * 4);
    uint16_t *got = xmalloc(ld * 2);
    for (uint32_t t = 0; t < n_tok; t++) {
        memcpy(row, rq + (size_t)t * ld, ld * 4);
        memcpy(got, q + (size_t)t * qd, qd * 2);
        if (g_kv_fp8) { // q as bf16; K and V bytes: the host rounding of the same value
            bad += cmp_bf16("rope_kv", got, row, qd, 1e-5f);
            for (uint32_t c = 0; c < 2 * kvd; c++) {
                const uint8_t *cache = (const uint8_t *)(c < kvd ? k : v);
                const uint8_t byte = cache[(size_t)slot[t] * kvd + c % kvd];
                const float ref = row[qd + c], want = tm_kv_fp8_round(ref);
                const float gotf = tm_e4m3_to_f32(byte);
                g_fp8_n++;
                g_fp8_exact += gotf == want;
                // a neighbouring code only where sincosf's 2 ulp put ref at a rounding tie
                if (!(fabsf(gotf - ref) <= 0.0625f * fabsf(ref) + 0x1p-10f)) {
                    if (bad++ == 0)
                        fprintf(stderr, "rope_kv fp8 [%u][%u]: got %g want %g (ref %g)\n", t, c,
                                gotf, want, ref);
                }
            }
            continue;
        }
        memcpy(got + qd, k + (size_t)slot[t] * kvd, kvd * 2);
        memcpy(got + qd + kvd, v + (size_t)slot[t] * kvd, kvd * 2);
        bad += cmp_bf16("rope_kv", got, row, ld, 1e-5f);
    }
    // slots no token owns stay poisoned (0xffff; fp8: 0xff bytes)
    for (uint32_t i = n_tok; i < n_slot; i++)
        for (uint32_t c = 0; c < kvd; c++)
            unwritten_ok &= g_kv_fp8 ? ((const uint8_t *)k)[(size_t)perm[i] * kvd + c] == 0xff &&
                                           ((const uint8_t *)v)[(size_t)perm[i] * kvd + c] == 0xff
                                     : k[(size_t)perm[i] * kvd + c] == 0xffff &&
                                           v[(size_t)perm[i] * kvd + c] == 0xffff;
    TM_CHECK_MSG(bad == 0 && unwritten_ok,
                 "rope_kv %u tok, %u/%u heads, hd %u, bias %d, llama3 %d: %d bad, others "
                 "untouched %d",
                 n_tok, n_head, n_kv_head, hd, bias, llama3, bad, unwritten_ok);
    cudaFree(d_qkv), cudaFree(d_b), cudaFree(d_inv), cudaFree(d_pos), cudaFree(d_slot);
    cudaFree(d_q), cudaFree(d_k), cudaFree(d_v);
    free(inv), free(qkv), free(b), free(pos), free(slot), free(perm), free(q), free(k), free(v);
    free(rq), free(cs), free(sn), free(row), free(got);
}

static void test_rope_kv(void) {
    rope_case(0, 4, 2, 16, 0, 0, 10, 0);
    rope_case(1, 1, 1, 2, 0, 0, 0, 0);
    rope_case(7, 4, 2, 16, 1, 0, 600, 0);
    rope_case(5, 32, 8, 128, 0, 1, 131071, 0);
    rope_case(33, 28, 4, 128, 1, 0, 5000, 0);
    rope_case(3, 8, 8, 256, 0, 1, 100000, 0);
    rope_case(8, 32, 8, 128, 1, 1, 5000, 11); // q|k|v as split-K partials
}

/* ---- paged attention ---- */

typedef struct attn_seq {
    uint32_t pos0, n_tok; /* chunk: tokens at positions [pos0, pos0 + n_tok) */
} attn_seq;

static void attn_case(const attn_seq *seqs, uint32_t n_seq, uint32_t n_head, uint32_t n_kv_head,
                      uint32_t hd, uint32_t bs, uint32_t window, uint32_t n_split) {
    tm_err err = {0};
    const uint32_t qd = n_head * hd, kvd = n_kv_head * hd, ld_q = qd + 8;
    uint32_t T = 0, n_bt = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        T += seqs[i].n_tok;
        n_bt += TM_CEIL_DIV(seqs[i].pos0 + seqs[i].n_tok, bs);
    }
    const uint32_t n_block = n_bt + 3; // a few blocks nobody uses
    // shuffled block ids, handed out in order
    uint32_t *bt = xmalloc(n_bt * 4), *perm = shuffled(n_block);
    memcpy(bt, perm, n_bt * 4);
    const size_t cache_n = (size_t)n_block * bs * kvd;
    uint16_t *kc = xmalloc(cache_n * 2), *vc = xmalloc(cache_n * 2);
    float *kf = xmalloc(cache_n * 4), *vf = xmalloc(cache_n * 4);
    float vmax = 0.0f;
    uint8_t *k8 = (uint8_t *)kc, *v8 = (uint8_t *)vc; // kv_fp8: the caches as bytes
    for (size_t i = 0; i < cache_n; i++) {
        if (g_kv_fp8) { // e4m3 values, subnormals included (|v| down to 2^-9)
            const float sk = i % 7 == 0 ? 0.01f : 2.0f, sv = i % 5 == 0 ? 0.005f : 1.0f;
            k8[i] = tm_f32_to_e4m3(tm_kv_fp8_round(sk * frand()));
            v8[i] = tm_f32_to_e4m3(tm_kv_fp8_round(sv * frand()));
            kf[i] = tm_e4m3_to_f32(k8[i]);
            vf[i] = tm_e4m3_to_f32(v8[i]);
        } else {
            kc[i] = to_bf(2.0f * frand());
            vc[i] = to_bf(frand());
            kf[i] = bf(kc[i]);
            vf[i] = bf(vc[i]);
        }
        vmax = fmaxf(vmax, fabsf(vf[i]));
    }
    const size_t cache_b = cache_n * (g_kv_fp8 ? 1 : 2); // bytes of each cache
    uint16_t *q;
    float *qf;
    rand_bf16((size_t)T * ld_q, 2.0f, &q, &qf);
    uint32_t *pos = xmalloc(T * 4), *tok_seq = xmalloc(T * 4), *seq_bt = xmalloc(n_seq * 4);
    uint32_t t = 0, o = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        seq_bt[i] = o;
        o += TM_CEIL_DIV(seqs[i].pos0 + seqs[i].n_tok, bs);
        for (uint32_t k = 0; k < seqs[i].n_tok; k++, t++) {
            pos[t] = seqs[i].pos0 + k;
            tok_seq[t] = i;
        }
    }
    uint16_t *d_kc = dup_to_dev(kc, cache_b), *d_vc = dup_to_dev(vc, cache_b);
    uint16_t *d_q = dup_to_dev(q, (size_t)T * ld_q * 2);
    uint16_t *d_out = dalloc((size_t)T * ld_q * 2, 0xff);
    uint32_t *d_pos = dup_to_dev(pos, T * 4), *d_ts = dup_to_dev(tok_seq, T * 4);
    uint32_t *d_sbt = dup_to_dev(seq_bt, n_seq * 4), *d_bt = dup_to_dev(bt, n_bt * 4);
    const size_t part_n = tm_k_attn_part_floats(T, n_head, n_split, hd);
    float *d_part = dalloc(part_n * 4, 0xff);
    tm_k_attn_paged_bf16_args a = {.out = d_out,
                                   .q = d_q,
                                   .k_cache = d_kc,
                                   .v_cache = d_vc,
                                   .pos = d_pos,
                                   .tok_seq = d_ts,
                                   .seq_bt = d_sbt,
                                   .block_tables = d_bt,
                                   .part_acc = d_part,
                                   .part_ml = d_part + (size_t)T * n_head * n_split * hd,
                                   .n_tok = T,
                                   .n_head = n_head,
                                   .n_kv_head = n_kv_head,
                                   .head_dim = hd,
                                   .block_size = bs,
                                   .ld_q = ld_q,
                                   .window = window,
                                   .n_split = n_split,
                                   .scale = 1.0f / sqrtf((float)hd),
                                   .kv_fp8 = (uint32_t)g_kv_fp8};
    TM_CHECK_OK(tm_k_attn_paged_bf16(&a, g_stream, &err), &err);
    uint16_t *out = xmalloc((size_t)T * ld_q * 2);
    to_host(out, d_out, (size_t)T * ld_q * 2);

    float *ref = xmalloc((size_t)T * ld_q * 4), *scores = xmalloc((size_t)(n_bt * bs + 1) * 4);
    t = 0;
    for (uint32_t i = 0; i < n_seq; i++) {
        tm_k_attn_args ra = {.out = ref + (size_t)t * ld_q,
                             .q = qf + (size_t)t * ld_q,
                             .k_cache = kf,
                             .v_cache = vf,
                             .block_table = bt + seq_bt[i],
                             .pos0 = seqs[i].pos0,
                             .n_tok = seqs[i].n_tok,
                             .n_head = n_head,
                             .n_kv_head = n_kv_head,
                             .head_dim = hd,
                             .block_size = bs,
                             .ld_q = ld_q,
                             .window = window,
                             .scale = 1.0f / sqrtf((float)hd)};
        tm_cpu_attn(&ra, scores);
        t += seqs[i].n_tok;
    }
    int bad = 0, pad_ok = 1;
    for (t = 0; t < T; t++) {
        bad += cmp_bf16("attn", out + (size_t)t * ld_q, ref + (size_t)t * ld_q, qd, 1e-3f * vmax);
        for (uint32_t c = qd; c < ld_q; c++)
            pad_ok &= out[(size_t)t * ld_q + c] == 0xffff; // row padding untouched
    }
    TM_CHECK_MSG(bad == 0 && pad_ok,
                 "attn%s %u seqs %u tok, %u/%u heads, hd %u, bs %u, window %u, split %u: %d bad, "
                 "padding untouched %d",
                 g_kv_fp8 ? " (fp8 KV)" : "", n_seq, T, n_head, n_kv_head, hd, bs, window, n_split,
                 bad, pad_ok);
    cudaFree(d_kc), cudaFree(d_vc), cudaFree(d_q), cudaFree(d_out), cudaFree(d_pos);
    cudaFree(d_ts), cudaFree(d_sbt), cudaFree(d_bt), cudaFree(d_part);
    free(bt), free(perm), free(kc), free(vc), free(kf), free(vf), free(q), free(qf), free(pos);
    free(tok_seq), free(seq_bt), free(out), free(ref), free(scores);
}

static void test_attn(void) {
    const attn_seq one[] = {{0, 1}};
    const attn_seq mixed[] = {{0, 37}, {127, 1}, {5, 3}, {300, 1}, {128, 129}};
    const attn_seq decodes[] = {{511, 1}, {640, 1}, {0, 1}, {1000, 1}, {129, 1}, {255, 1}};
    const attn_seq prefill[] = {{0, 300}};
    const attn_seq empty[] = {{0, 0}};
    attn_case(empty, 1, 4, 2, 16, 16, 0, 1);
    attn_case(one, 1, 1, 1, 8, 1, 0, 1);
    attn_case(one, 1, 4, 2, 16, 16, 0, 7);
    attn_case(mixed, 5, 4, 2, 16, 16, 0, 1);
    attn_case(mixed, 5, 4, 2, 16, 16, 0, 3);
    attn_case(mixed, 5, 8, 2, 64, 7, 50, 1); // sliding window, odd block size
    attn_case(mixed, 5, 8, 2, 64, 7, 200, 4);
    attn_case(decodes, 6, 32, 8, 128, 16, 0, 1);
    attn_case(decodes, 6, 32, 8, 128, 16, 0, 5);
    attn_case(decodes, 6, 32, 8, 128, 16, 0, 32);
    attn_case(prefill, 1, 28, 4, 128, 32, 0, 1);
    attn_case(decodes, 6, 8, 8, 256, 16, 0, 2);
    attn_case(decodes, 6, 4, 1, 96, 16, 0, 3);    // head_dim 96: V row groups leave threads idle
    attn_case(decodes, 6, 28, 4, 128, 16, 0, 32); // group 7, unrolled kernel: a merge of 32 splits
    // the GQA kernel (head_dim 64/128, groups of 1, 2, 4, 8 query heads per KV head)
    attn_case(mixed, 5, 8, 4, 64, 7, 50, 3);     // group 2, sliding window, odd block size
    attn_case(mixed, 5, 16, 2, 128, 16, 0, 4);   // group 8
    attn_case(decodes, 6, 4, 4, 64, 16, 0, 32);  // group 1, splits without positions
    attn_case(prefill, 1, 32, 8, 128, 32, 0, 1); // group 4, one split over 300 positions
}

/* The KV write and the paged attention with an fp8 (e4m3, scale 1) cache: the same cases and
 * tolerances as bf16 (the kernels widen e4m3 exactly: the references read the same values). */
static void test_kv_fp8(void) {
    g_kv_fp8 = 1;
    g_fp8_n = g_fp8_exact = 0;
    test_rope_kv();
    fprintf(stderr, "  rope_kv fp8: %llu of %llu K/V bytes equal to the host rounding\n",
            (unsigned long long)g_fp8_exact, (unsigned long long)g_fp8_n);
    TM_CHECK(g_fp8_n > 0 && (double)g_fp8_exact >= 0.99 * (double)g_fp8_n);
    test_attn();
    g_kv_fp8 = 0;
}

/* ---- skinny GEMM (decode projections) ---- */

/* y = x @ w^T for n_tok rows through gemm_skinny (split as planned for n_sm multiprocessors,
 * or forced to n_split when nonzero) and sum_parts, against a double-precision host product of
 * the same bf16 values. Tolerance: fp32 accumulation, 1e-5 of sum |w||x| per output. */
static void skinny_case(uint32_t n_tok, uint32_t n_in, uint32_t n_out, uint32_t n_sm,
                        uint32_t force_split) {
    tm_err err = {0};
    uint16_t *w = xmalloc((size_t)n_out * n_in * 2), *x = xmalloc((size_t)n_tok * n_in * 2);
    for (size_t i = 0; i < (size_t)n_out * n_in; i++)
        w[i] = to_bf(frand());
    for (size_t i = 0; i < (size_t)n_tok * n_in; i++)
        x[i] = to_bf(2.0f * frand());
    uint32_t kps = 0, n_split = tm_k_gemm_skinny_splits(n_in, n_out, n_sm, &kps);
    if (force_split) {
        kps = (TM_CEIL_DIV(n_in, force_split) + 31) / 32 * 32;
        n_split = TM_CEIL_DIV(n_in, kps);
    }
    TM_CHECK_MSG(kps % 32 == 0 && (n_split - 1) * kps < n_in && n_split * kps >= n_in,
                 "skinny plan %u x %u: %u splits of %u", n_in, n_out, n_split, kps);
    uint16_t *d_w = dup_to_dev(w, (size_t)n_out * n_in * 2);
    uint16_t *d_x = dup_to_dev(x, (size_t)n_tok * n_in * 2);
    const size_t ny = (size_t)n_tok * n_out;
    float *d_part = dalloc((size_t)n_split * ny * 4, 0xff), *d_y = dalloc(ny * 4, 0xff);
    tm_k_gemm_skinny_args a = {.part = d_part,
                               .w = d_w,
                               .x = d_x,
                               .n_tok = n_tok,
                               .n_in = n_in,
                               .n_out = n_out,
                               .n_split = n_split,
                               .k_per_split = kps};
    TM_CHECK_OK(tm_k_gemm_skinny(&a, g_stream, &err), &err);
    tm_k_sum_parts_args sa = {
        .y = d_y, .part = d_part, .stride = ny, .n = ny, .n_part = n_split, .beta = 0.0f};
    TM_CHECK_OK(tm_k_sum_parts(&sa, g_stream, &err), &err);
    float *y = xmalloc(ny * 4);
    to_host(y, d_y, ny * 4);
    int bad = 0;
    double worst = 0.0;
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t o = 0; o < n_out; o++) {
            double ref = 0.0, mag = 0.0;
            for (uint32_t k = 0; k < n_in; k++) {
                const double p = (double)bf(w[(size_t)o * n_in + k]) * bf(x[(size_t)t * n_in + k]);
                ref += p;
                mag += fabs(p);
            }
            const double e = fabs(y[(size_t)t * n_out + o] - ref), tol = 1e-5 * mag + 1e-6;
            worst = fmax(worst, e / (mag + 1e-30));
            if (!(e <= tol)) {
                if (!bad)
                    fprintf(stderr, "skinny: token %u row %u: gpu %.9g ref %.9g\n", t, o,
                            y[(size_t)t * n_out + o], ref);
                bad++;
            }
        }
    TM_CHECK_MSG(bad == 0, "skinny %u tok x %u -> %u (%u splits of %u): %d bad, worst %.2g", n_tok,
                 n_in, n_out, n_split, kps, bad, worst);
    cudaFree(d_w), cudaFree(d_x), cudaFree(d_part), cudaFree(d_y);
    free(w), free(x), free(y);
}

/* Weight-stream rate of the skinny kernel on a decode shape (printed, not asserted). */
static void skinny_rate(uint32_t n_tok, uint32_t n_in, uint32_t n_out, uint32_t n_sm,
                        uint32_t unroll) {
    tm_err err = {0};
    uint32_t kps = 0, n_split = tm_k_gemm_skinny_splits(n_in, n_out, n_sm, &kps);
    const size_t n_w = (size_t)n_out * n_in * 8; // 8 copies: more than L2 between reps
    uint16_t *d_w = dalloc(n_w * 2, 0x3c), *d_x = dalloc((size_t)n_tok * n_in * 2, 0x3c);
    float *d_part = dalloc((size_t)n_split * n_tok * n_out * 4, 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    const int reps = 40;
    for (int r = -8; r < reps; r++) {
        if (r == 0)
            cudaEventRecord(e0, g_stream);
        tm_k_gemm_skinny_args a = {.part = d_part,
                                   .w = d_w + (size_t)((r + 8) % 8) * n_out * n_in,
                                   .x = d_x,
                                   .n_tok = n_tok,
                                   .n_in = n_in,
                                   .n_out = n_out,
                                   .n_split = n_split,
                                   .k_per_split = kps,
                                   .unroll = unroll};
        TM_CHECK_OK(tm_k_gemm_skinny(&a, g_stream, &err), &err);
    }
    cudaEventRecord(e1, g_stream);
    cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1e3 / reps, gbs = (double)n_out * n_in * 2 / (us * 1e3);
    printf("skinny rate: %2u tok x %5u -> %6u (%2u splits, unroll %2u, %4u SMs planned): %7.1f "
           "us, %6.0f GB/s weight stream\n",
           n_tok, n_in, n_out, n_split, unroll, n_sm, us, gbs);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(d_w), cudaFree(d_x), cudaFree(d_part);
}

static void test_skinny(void) {
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
    skinny_case(1, 32, 1, (uint32_t)n_sm, 0);
    skinny_case(3, 64, 17, (uint32_t)n_sm, 0);
    skinny_case(8, 96, 40, (uint32_t)n_sm, 0);
    skinny_case(9, 256, 300, (uint32_t)n_sm, 3); // second token tile, ragged rows, 3 splits
    skinny_case(16, 1024, 48, (uint32_t)n_sm, 0);
    skinny_case(5, 544, 33, 1, 7); // the last split shorter than the others
    skinny_case(8, 4096, 6144, (uint32_t)n_sm, 0);
    skinny_case(8, 14336, 512, (uint32_t)n_sm, 0);
    skinny_case(2, 4096, 8016, (uint32_t)n_sm, 0);
    // llama8b decode shapes (qkv, o, gate|up, down, lm_head)
    const uint32_t shapes[5][2] = {
        {4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}, {4096, 128256}};
    // TM_SKINNY_SWEEP=1: unroll x split-planning variants (kernel tuning), also on one TP2
    // rank's shard of those shapes; else the defaults
    const uint32_t half[5][2] = {
        {4096, 3072}, {2048, 4096}, {4096, 14336}, {7168, 4096}, {4096, 64128}};
    const int sweep = getenv("TM_SKINNY_SWEEP") != NULL;
    for (int i = 0; i < (sweep ? 10 : 5); i++) {
        const uint32_t *sh = i < 5 ? shapes[i] : half[i - 5];
        if (!sweep) {
            skinny_rate(8, sh[0], sh[1], (uint32_t)n_sm, 0);
            skinny_rate(1, sh[0], sh[1], (uint32_t)n_sm, 0);
            continue;
        }
        const uint32_t unrolls[2] = {4, 8}, sms[4] = {(uint32_t)n_sm / 2, (uint32_t)n_sm,
                                                      (uint32_t)n_sm * 2, (uint32_t)n_sm * 4};
        for (int u = 0; u < 2; u++)
            for (int m = 0; m < 4; m++)
                skinny_rate(8, sh[0], sh[1], sms[m], unrolls[u]);
        skinny_rate(16, sh[0], sh[1], (uint32_t)n_sm, 8);
    }
}

/* ---- argmax ---- */

// n_limit: only columns below it compete (0: all); bad: row 1 gets a NaN and row 2 an inf
// below the limit, and row 0 a NaN above it (ignored).
static void argmax_case(uint32_t n_row, uint32_t n_col, int ties, uint32_t n_limit, int bad_vals) {
    tm_err err = {0};
    float *lg = xmalloc((size_t)n_row * n_col * 4);
    for (size_t i = 0; i < (size_t)n_row * n_col; i++)
        lg[i] = ties ? (float)urand(4) : 10.0f * frand();
    const uint32_t lim = n_limit && n_limit < n_col ? n_limit : n_col;
    if (bad_vals) {
        TM_ASSERT(n_row >= 3 && lim >= 2);
        if (lim < n_col)
            lg[n_col - 1] = NAN;
        lg[(size_t)1 * n_col + lim / 2] = NAN;
        lg[(size_t)2 * n_col + lim - 1] = -INFINITY;
    }
    float *d_lg = dup_to_dev(lg, (size_t)n_row * n_col * 4);
    uint32_t *d_ids = dalloc(n_row * 4, 0xff), *ids = xmalloc(n_row * 4);
    tm_k_argmax_f32_args a = {
        .ids = d_ids, .logits = d_lg, .n_row = n_row, .n_col = n_col, .n_limit = n_limit};
    TM_CHECK_OK(tm_k_argmax_f32(&a, g_stream, &err), &err);
    to_host(ids, d_ids, n_row * 4);
    int bad = 0;
    for (uint32_t r = 0; r < n_row; r++) {
        uint32_t best = 0;
        for (uint32_t c = 0; c < lim && best != UINT32_MAX; c++)
            if (!isfinite(lg[(size_t)r * n_col + c]))
                best = UINT32_MAX;
            else if (lg[(size_t)r * n_col + c] > lg[(size_t)r * n_col + best])
                best = c;
        if (ids[r] != best && !bad)
            fprintf(stderr, "argmax row %u: gpu id %u (%.9g), reference %u (%.9g)\n", r, ids[r],
                    ids[r] < n_col ? lg[(size_t)r * n_col + ids[r]] : NAN, best,
                    best < n_col ? lg[(size_t)r * n_col + best] : NAN);
        bad += ids[r] != best;
    }
    TM_CHECK_MSG(bad == 0, "argmax %u x %u ties %d limit %u: %d rows differ", n_row, n_col, ties,
                 n_limit, bad);
    cudaFree(d_lg), cudaFree(d_ids);
    free(lg), free(ids);
}

// Tensor-parallel greedy on one GPU: the vocabulary split into n_rank slices of v_per columns
// (the last shorter), argmax_part on each into its block of the gathered candidates, then
// argmax_merge; the same ids as argmax_f32 with the limit over the whole row.
static void argmax_tp_case(uint32_t n_row, uint32_t V, uint32_t n_rank, int ties, uint32_t limit) {
    tm_err err = {0};
    const uint32_t v_per = (V + n_rank - 1) / n_rank;
    float *lg = xmalloc((size_t)n_row * V * 4);
    for (size_t i = 0; i < (size_t)n_row * V; i++)
        lg[i] = ties ? (float)urand(3) : 10.0f * frand();
    if (n_row >= 2)
        lg[(size_t)1 * V + V / 2] = NAN; // row 1 fails when its NaN is below the limit
    float *d_full = dup_to_dev(lg, (size_t)n_row * V * 4);
    uint32_t *d_ref = dalloc(n_row * 4, 0xff), *d_ids = dalloc(n_row * 4, 0xff);
    uint32_t *d_cand = dalloc((size_t)n_rank * n_row * 2 * 4, 0);
    tm_k_argmax_f32_args a = {
        .ids = d_ref, .logits = d_full, .n_row = n_row, .n_col = V, .n_limit = limit};
    TM_CHECK_OK(tm_k_argmax_f32(&a, g_stream, &err), &err);
    float *slice = xmalloc((size_t)n_row * v_per * 4);
    for (uint32_t k = 0; k < n_rank; k++) {
        const uint32_t v0 = k * v_per, nv = v0 + v_per <= V ? v_per : V - v0;
        for (uint32_t r = 0; r < n_row; r++)
            memcpy(slice + (size_t)r * nv, lg + (size_t)r * V + v0, nv * 4);
        float *d_slice = dup_to_dev(slice, (size_t)n_row * nv * 4);
        tm_k_argmax_part_f32_args pa = {.cand = d_cand + (size_t)k * n_row * 2,
                                        .logits = d_slice,
                                        .n_row = n_row,
                                        .n_col = nv,
                                        .id0 = v0,
                                        .id_limit = limit};
        TM_CHECK_OK(tm_k_argmax_part_f32(&pa, g_stream, &err), &err);
        cudaStreamSynchronize(g_stream);
        cudaFree(d_slice);
    }
    tm_k_argmax_merge_args ma = {.ids = d_ids, .cand = d_cand, .n_row = n_row, .n_rank = n_rank};
    TM_CHECK_OK(tm_k_argmax_merge(&ma, g_stream, &err), &err);
    uint32_t *ref = xmalloc(n_row * 4), *ids = xmalloc(n_row * 4);
    to_host(ref, d_ref, n_row * 4);
    to_host(ids, d_ids, n_row * 4);
    int bad = 0;
    for (uint32_t r = 0; r < n_row; r++)
        bad += ids[r] != ref[r];
    TM_CHECK_MSG(bad == 0, "argmax tp %u x %u / %u ranks, limit %u: %d rows differ", n_row, V,
                 n_rank, limit, bad);
    if (n_row >= 2)
        TM_CHECK((limit == 0 || V / 2 < limit) == (ids[1] == UINT32_MAX));
    cudaFree(d_full), cudaFree(d_ref), cudaFree(d_ids), cudaFree(d_cand);
    free(lg), free(slice), free(ref), free(ids);
}

static void test_argmax(void) {
    argmax_case(0, 5, 0, 0, 0);
    argmax_case(1, 1, 0, 0, 0);
    argmax_case(3, 1025, 1, 0, 0);
    argmax_case(8, 128256, 0, 0, 0);
    argmax_case(5, 128256, 1, 0, 0);
    argmax_case(4, 129280, 0, 128815, 1); // DeepSeek V3: the tokenizer's ids below the padding
    argmax_case(4, 3000, 1, 5000, 1);     // a limit past the row: all columns
    argmax_case(3, 1025, 1, 3, 1);        // fewer columns than threads
    argmax_tp_case(4, 129280, 4, 0, 0);
    argmax_tp_case(4, 129280, 4, 0, 128815); // the last rank's slice is cut by the limit
    argmax_tp_case(4, 1000, 3, 1, 600);      // ties across ranks; rank 2 lies past the limit
    argmax_tp_case(3, 1000, 3, 1, 400);      // row 1's NaN (id 500) lies past the limit
}

/* ---- fill ---- */

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void test_fill(void) {
    tm_err err = {0};
    const size_t n = 1000003;
    uint16_t *d = dalloc(n * 2, 0xff), *h = xmalloc(n * 2);
    tm_k_fill_bf16_args a = {.p = d, .n = n, .seed = 42, .scale = 0.5f, .offset = 1.0f};
    TM_CHECK_OK(tm_k_fill_bf16(&a, g_stream, &err), &err);
    to_host(h, d, n * 2);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t z = mix64(42 ^ (i * 0xd1342543de82ef95ull));
        float u = (float)(z >> 40) * 0x1p-23f - 1.0f;
        bad += h[i] != to_bf(1.0f + 0.5f * u);
    }
    TM_CHECK_MSG(bad == 0, "fill: %zu of %zu differ", bad, n);
    cudaFree(d);
    free(h);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
        tm_test_skip("no CUDA device");
    TM_ASSERT(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) == cudaSuccess);
    TM_RUN(test_embed);
    TM_RUN(test_rmsnorm);
    TM_RUN(test_silu_mul);
    TM_RUN(test_rope_kv);
    TM_RUN(test_attn);
    TM_RUN(test_kv_fp8);
    TM_RUN(test_skinny);
    TM_RUN(test_argmax);
    TM_RUN(test_fill);
    cudaStreamDestroy(g_stream);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
