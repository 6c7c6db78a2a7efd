/* tests/unit/test_shard_quant.c - one rank's slice of quantized weights in their stored form
 * (runner/tp/shard_quant.h, what the CUDA DeepSeek-V4 engine uploads at tp > 1): on small mkmodel
 * DeepSeek-V4 checkpoints (FP8 128 x 128 blocks with fp32 or e8m0 scales, MXFP4 routed experts),
 * every rank's slice at tp 2 and 4 of q_b (rows of its heads), o_b (columns of its groups), the
 * shared expert (gate and up rows into one fused matrix, down columns) and the routed experts
 * (gate/up rows, down columns with their 32-value scale groups), written by the put function into
 * host buffers, is read back as a quantized tensor of its own (tm_tensor_row_f32) and must equal
 * the full tensor's values at the same rows and columns bit for bit. The second model has widths
 * that end in part blocks (192 = 128 + 64) and the copies go through a staging buffer that holds
 * a few rows, not a whole slice. Without mkmodel the test is skipped. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv4.h"
#include "runner/tp/shard_quant.h"
#include "tm_test.h"

static tm_rc put_host(void *dst, const void *src, size_t n, tm_err *err) {
    (void)err;
    memcpy(dst, src, n);
    return TM_OK;
}

/* The values of rows [r0, r0 + nr) x columns [c0, c0 + nc) of t against rows [s0, s0 + nr) of
 * the slice s (all of its columns); returns the count that differ (bits). */
static size_t diff(const tm_tensor *t, size_t r0, size_t nr, size_t c0, size_t nc,
                   const tm_tensor *s, size_t s0) {
    float *a = tm_malloc(t->shape[t->n_dim - 1] * 4), *b = tm_malloc(nc * 4);
    TM_ASSERT(a && b && s->shape[s->n_dim - 1] == nc);
    size_t bad = 0;
    for (size_t i = 0; i < nr; i++) {
        tm_tensor_row_f32(t, r0 + i, a);
        tm_tensor_row_f32(s, s0 + i, b);
        for (size_t j = 0; j < nc; j++)
            bad += memcmp(&a[c0 + j], &b[j], 4) != 0;
    }
    tm_free(a);
    tm_free(b);
    return bad;
}

/* A fused FP8 matrix of n_out x n_in (codes and scales zeroed) and its view as a tensor. */
typedef struct q8buf {
    uint8_t *w;
    void *scale;
    tm_tensor v;
} q8buf;

static void q8_init(q8buf *q, const tm_tensor *like, size_t n_out, size_t n_in) {
    const int e8 = like->scale_dtype == TM_DTYPE_F8_E8M0;
    q->w = tm_calloc(n_out * n_in, 1);
    q->scale = tm_calloc(TM_CEIL_DIV(n_out, 128) * TM_CEIL_DIV(n_in, 128), 4);
    TM_ASSERT(q->w && q->scale);
    q->v = (tm_tensor){.data = q->w,
                       .dtype = TM_DTYPE_F8_E4M3,
                       .n_dim = 2,
                       .shape = {n_out, n_in},
                       .scale = q->scale,
                       .quant = TM_QUANT_FP8_BLOCK,
                       .scale_dtype = e8 ? TM_DTYPE_F8_E8M0 : TM_DTYPE_F32,
                       .qblock = {128, 128}};
}

static void q8_fini(q8buf *q) {
    tm_free(q->w);
    tm_free(q->scale);
}

/* Every rank's slices at tp 2 and 4 of the model in dir, staged through stage bytes. */
static void check_model(const char *name, const char *dir, size_t stage) {
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    if (!m)
        return;
    const tm_dsv4 *w = tm_model_dsv4(m);
    const size_t D = m->cfg.n_embd, hd = m->cfg.head_dim, H = m->cfg.n_head, I = m->cfg.n_ff;
    const size_t G = w->cfg.o_groups, olr = w->cfg.o_lora_rank, qr = w->cfg.q_lora_rank;
    const size_t E = w->cfg.n_expert;
    uint8_t *hb = tm_malloc(stage);
    float *fb = tm_malloc(stage * 4);
    TM_ASSERT(hb && fb);
    size_t n_cmp = 0;
    for (uint32_t tp = 2; tp <= 4; tp *= 2)
        for (uint32_t r = 0; r < tp; r++)
            for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
                const tm_dsv4_layer *W = &w->layers[l];
                const size_t nq = H / tp * hd, no = G / tp * olr, n = I / tp;
                const int e8 = W->q_b.scale_dtype == TM_DTYPE_F8_E8M0;
                TM_ASSERT(W->q_b.quant == TM_QUANT_FP8_BLOCK && W->gate_up.quant == TM_QUANT_MXFP4);
                TM_ASSERT(nq % 128 == 0 && no % 128 == 0 && n % 128 == 0);
                q8buf q;
                // q_b: the rank's heads' rows
                q8_init(&q, &W->q_b, nq, qr);
                TM_CHECK_OK(tm_shard_fp8_block_put(put_host, q.w, q.scale, e8, 0, &W->q_b, r * nq,
                                                   nq, 0, qr, hb, fb, stage, &err),
                            &err);
                size_t bad = diff(&W->q_b, r * nq, nq, 0, qr, &q.v, 0);
                TM_CHECK_MSG(bad == 0, "%s tp %u rank %u layer %u q_b: %zu values differ", name, tp,
                             r, l, bad);
                q8_fini(&q);
                // o_b: the rank's groups' columns
                q8_init(&q, &W->o_b, D, no);
                TM_CHECK_OK(tm_shard_fp8_block_put(put_host, q.w, q.scale, e8, 0, &W->o_b, 0, D,
                                                   r * no, no, hb, fb, stage, &err),
                            &err);
                bad = diff(&W->o_b, 0, D, r * no, no, &q.v, 0);
                TM_CHECK_MSG(bad == 0, "%s tp %u rank %u layer %u o_b: %zu values differ", name, tp,
                             r, l, bad);
                q8_fini(&q);
                // the shared expert: gate rows then up rows in one matrix; down columns
                q8_init(&q, &W->sh_gate, 2 * n, D);
                TM_CHECK_OK(tm_shard_fp8_block_put(put_host, q.w, q.scale, e8, 0, &W->sh_gate,
                                                   r * n, n, 0, D, hb, fb, stage, &err),
                            &err);
                TM_CHECK_OK(tm_shard_fp8_block_put(put_host, q.w, q.scale, e8, n, &W->sh_up, r * n,
                                                   n, 0, D, hb, fb, stage, &err),
                            &err);
                bad = diff(&W->sh_gate, r * n, n, 0, D, &q.v, 0) +
                      diff(&W->sh_up, r * n, n, 0, D, &q.v, n);
                TM_CHECK_MSG(bad == 0, "%s tp %u rank %u layer %u shared gate/up: %zu differ", name,
                             tp, r, l, bad);
                q8_fini(&q);
                q8_init(&q, &W->sh_down, D, n);
                TM_CHECK_OK(tm_shard_fp8_block_put(put_host, q.w, q.scale, e8, 0, &W->sh_down, 0, D,
                                                   r * n, n, hb, fb, stage, &err),
                            &err);
                bad = diff(&W->sh_down, 0, D, r * n, n, &q.v, 0);
                TM_CHECK_MSG(bad == 0, "%s tp %u rank %u layer %u shared down: %zu differ", name,
                             tp, r, l, bad);
                q8_fini(&q);
                // the MXFP4 routed experts
                uint8_t *gw = tm_calloc(E * 2 * n * D / 2, 1),
                        *gs = tm_calloc(E * 2 * n * D / 32, 1);
                uint8_t *dw = tm_calloc(E * D * n / 2, 1), *ds = tm_calloc(E * D * n / 32, 1);
                TM_ASSERT(gw && gs && dw && ds);
                TM_CHECK_OK(tm_shard_mxfp4_experts_put(put_host, gw, gs, dw, ds, &W->gate_up,
                                                       &W->down, r * n, n, hb, stage, &err),
                            &err);
                tm_tensor gu = W->gate_up, dn = W->down;
                gu.data = gw, gu.scale = gs, gu.shape[1] = 2 * n;
                dn.data = dw, dn.scale = ds, dn.shape[2] = n;
                bad = 0;
                for (size_t e = 0; e < E; e++)
                    bad += diff(&W->gate_up, e * 2 * I + r * n, n, 0, D, &gu, e * 2 * n) +
                           diff(&W->gate_up, e * 2 * I + I + r * n, n, 0, D, &gu, e * 2 * n + n) +
                           diff(&W->down, e * D, D, r * n, n, &dn, e * D);
                TM_CHECK_MSG(bad == 0, "%s tp %u rank %u layer %u MXFP4 experts: %zu differ", name,
                             tp, r, l, bad);
                tm_free(gw), tm_free(gs), tm_free(dw), tm_free(ds);
                n_cmp += 5;
            }
    fprintf(stderr, "  %s: %zu slices equal the full tensors' values (staging %zu bytes)\n", name,
            n_cmp, stage);
    tm_free(hb);
    tm_free(fb);
    tm_model_destroy(m);
}

static void check_args(const char *name, const char *args, size_t stage) {
    char dir[] = "/tmp/tm_shard_quant_XXXXXX", cmd[2048];
    TM_ASSERT(mkdtemp(dir));
    const char *build = getenv("TM_BUILD");
    snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s' --arch deepseek_v4 %s >/dev/null",
             build ? build : ".", dir, args);
    TM_CHECK_MSG(system(cmd) == 0, "%s: %s", name, cmd);
    check_model(name, dir, stage);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

// 8 heads x 64 in 4 groups of o_lora 128, expert width 512: a TP4 rank's slices are one block
#define SHAPE                                                                                      \
    "--heads 8 --head-dim 64 --rope-dim 16 --o-groups 4 --o-lora 128 --ff 512 --ctx 256 "          \
    "--window 16 --experts 4 --experts-used 2 --hc 2 --vocab 64 --layers 2 --dsv4-layers ss "      \
    "--dsv4-mlp mm --dtype bf16 --expert-dtype fp4 "

static void test_fp8_f32_scales(void) {
    check_args("fp8 (fp32 scales) + mxfp4",
               SHAPE "--hidden 256 --q-lora 256 --quant fp8-block --seed 51", (size_t)1 << 20);
}

static void test_fp8_e8m0_part_blocks(void) { // 192 = 128 + 64: part blocks; a small staging
    check_args("fp8 (e8m0 scales) + mxfp4, part blocks",
               SHAPE "--hidden 192 --q-lora 192 --quant fp8-block-ue8m0 --seed 52", 1000);
}

int main(void) {
    tm_test_need_build_tool("mkmodel");
    TM_RUN(test_fp8_f32_scales);
    TM_RUN(test_fp8_e8m0_part_blocks);
    return tm_test_report();
}
