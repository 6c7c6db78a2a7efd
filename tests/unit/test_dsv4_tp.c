/* tests/unit/test_dsv4_tp.c - DeepSeek-V4 tensor parallel on the CPU (docs/deepseek_v4.md
 * "Tensor parallel"): TP=2 and TP=4 shard engines in one process (tm_engine_cpu_tp_create, an
 * in-process all-reduce standing in for NCCL) against TP=1 on small mkmodel DeepSeek-V4 models.
 * Three sequences (prompts of 9, 40 and 70 tokens, prefilled in chunks of at most 24 that end off
 * the compression windows, the blocks of the sequences interleaved) then 32 greedy decode steps
 * of all three together, then a fourth sequence that shares the third's first block and gets
 * part of its second by kv_copy (the prefix cache's path). Required: the greedy tokens equal over
 * every step, and each logits row within 1e-4 of TP=1's, relative to the row's largest magnitude
 * (the all-reduced sums of o_b and the down projections add in another order, so logits differ in
 * the last bits; routing and the indexer's top-k are replicated math on the same inputs). Shapes
 * cover sliding, CSA and HCA layers, hash and top-k MoE, 2 and 3 hyper-connection streams, tied and
 * untied heads, a vocabulary that does not divide by the ranks, bf16/f32 and FP8 + MXFP4 weights; a
 * model with an MTP layer, run after every step over the step's rows, whose draft logits must match
 * TP=1's the same way (and its greedy drafts be equal); every allocation of a TP=2 engine create
 * failing in turn, cleanly; and a shape that does not split is refused with a clear message.
 * Without mkmodel the test is skipped. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/engine/cpu/dsv4.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv4.h"
#include "tm_test.h"

#define N_SEQ 3
#define N_STEP 32
#define BS 16
#define MAX_POS 128
#define CHUNK 24
#define SHARED_BLOCKS 5 /* spare blocks of the prefix-shared sequence (it needs 5) */
#define SHARED_PART 5   /* tokens of a partly filled block copied by kv_copy */

typedef struct run_out {
    uint32_t tokens[N_SEQ][N_STEP];
    float *logits;                  /* [N_STEP][N_SEQ][n_vocab] */
    uint32_t drafts[N_SEQ][N_STEP]; /* with an MTP layer: its greedy draft tokens */
    float *mtp;                     /* [N_STEP][N_SEQ][n_vocab] its logits, or NULL */
    float *shared;                  /* [n_vocab] last logits of the prefix-shared sequence */
    int ok;
} run_out;

static uint32_t argmax(const float *l, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t v = 1; v < n; v++)
        if (l[v] > l[best])
            best = v;
    return best;
}

// After a main step: the MTP layer over the same rows (the step's hidden streams, each row's
// next token), draft logits into out.
static int run_mtp(tm_engine *eng, size_t width, const tm_batch_seq *bs,
                   uint32_t ids[N_SEQ][MAX_POS], float *out, tm_err *err) {
    uint32_t n_tok = 0, next[3 * CHUNK];
    const float *hid = tm_dsv4_hidden(eng, &n_tok);
    TM_CHECK(hid != NULL);
    if (!hid)
        return 0;
    tm_dsv4_mtp_seq ms[N_SEQ];
    uint32_t t0 = 0;
    for (uint32_t s = 0; s < N_SEQ; s++) {
        for (uint32_t i = 0; i < bs[s].n_tok; i++)
            next[t0 + i] = ids[s][bs[s].pos + i + 1];
        ms[s] = (tm_dsv4_mtp_seq){.hidden = hid + (size_t)t0 * width, // stacked in batch order
                                  .next = next + t0,
                                  .n_tok = bs[s].n_tok,
                                  .pos = bs[s].pos,
                                  .block_table = bs[s].block_table,
                                  .n_block = bs[s].n_block,
                                  .want_logits = bs[s].want_logits};
        t0 += bs[s].n_tok;
    }
    TM_CHECK(t0 == n_tok);
    // Through the engine's drafter ops (engine.h), as the runner calls them, TP or not.
    const tm_engine_draft_info di = tm_engine_drafter(eng);
    TM_CHECK(di.kind == TM_DRAFT_MTP && di.width == width && di.n_src_layer == 1 && di.n_out == 1);
    uint32_t n_tok2 = 0;
    TM_CHECK(eng->ops->hidden(eng, &n_tok2) == hid && n_tok2 == n_tok);
    tm_rc rc = eng->ops->draft(eng, ms, N_SEQ, out, NULL, err);
    TM_CHECK_OK(rc, err);
    return rc == TM_OK;
}

static void run(const tm_model *m, uint32_t tp, run_out *o) {
    tm_err err = {0};
    tm_engine *eng = NULL;
    tm_engine_opts eo = {.n_threads = tp,
                         .block_size = BS,
                         .n_kv_block = N_SEQ * MAX_POS / BS + SHARED_BLOCKS,
                         .max_seqs = N_SEQ,
                         .max_batched_tokens = 3 * CHUNK,
                         .tp_size = tp};
    TM_CHECK_OK(tm_engine_cpu_tp_create(m, &eo, &eng, &err), &err);
    if (!eng)
        return;
    const uint32_t V = m->cfg.n_vocab;
    uint32_t ids[N_SEQ][MAX_POS], len[N_SEQ] = {9, 40, 70}, done[N_SEQ] = {0};
    uint32_t table[N_SEQ][MAX_POS / BS];
    for (uint32_t s = 0; s < N_SEQ; s++) {
        for (uint32_t i = 0; i < len[s]; i++)
            ids[s][i] = (s * 131 + i * 17 + 3) % V;
        for (uint32_t k = 0; k < MAX_POS / BS; k++)
            table[s][k] = k * N_SEQ + (N_SEQ - 1 - s); // interleaved blocks
    }
    float *logits = tm_calloc((size_t)N_SEQ * V, sizeof(float));
    float *mlog = tm_calloc((size_t)N_SEQ * V, sizeof(float));
    o->logits = tm_calloc((size_t)N_STEP * N_SEQ * V, sizeof(float));
    const int mtp = tm_dsv4_has_mtp(m);
    const size_t width = (size_t)tm_model_dsv4(m)->cfg.hc_mult * m->cfg.n_embd;
    if (mtp)
        o->mtp = tm_calloc((size_t)N_STEP * N_SEQ * V, sizeof(float));
    int ok = 1;
    for (uint32_t step = 0; ok && step < N_STEP; step++) {
        // Prompts in chunks of up to CHUNK tokens; a step counts once every sequence has logits.
        int all_logits = 1;
        tm_batch_seq bs[N_SEQ];
        for (uint32_t s = 0; s < N_SEQ; s++) {
            uint32_t n = len[s] - done[s];
            if (n > CHUNK)
                n = CHUNK, all_logits = 0;
            bs[s] = (tm_batch_seq){.tokens = ids[s] + done[s],
                                   .n_tok = n,
                                   .pos = done[s],
                                   .block_table = table[s],
                                   .n_block = MAX_POS / BS,
                                   .want_logits = done[s] + n == len[s]};
        }
        tm_batch b = {.seqs = bs, .n_seq = N_SEQ};
        tm_rc rc = tm_engine_forward(eng, &b, logits, &err);
        TM_CHECK_OK(rc, &err);
        ok = rc == TM_OK;
        uint32_t row = 0;
        for (uint32_t s = 0; ok && s < N_SEQ; s++) {
            done[s] += bs[s].n_tok;
            if (!bs[s].want_logits)
                continue;
            ids[s][len[s]++] = argmax(logits + (size_t)row++ * V, V);
        }
        if (ok && mtp) // every chunk, so the MTP layer's state covers every position
            ok = run_mtp(eng, width, bs, ids, mlog, &err);
        if (!all_logits) { // a chunked prompt needs another pass before this step counts
            step--;
            continue;
        }
        for (uint32_t s = 0; ok && s < N_SEQ; s++) {
            o->tokens[s][step] = ids[s][len[s] - 1];
            memcpy(o->logits + ((size_t)step * N_SEQ + s) * V, logits + (size_t)s * V,
                   V * sizeof(float));
            if (mtp) {
                o->drafts[s][step] = argmax(mlog + (size_t)s * V, V);
                memcpy(o->mtp + ((size_t)step * N_SEQ + s) * V, mlog + (size_t)s * V,
                       V * sizeof(float));
            }
        }
    }
    // The prefix cache's way: a fourth sequence with the third's prompt reuses its first block,
    // gets the first SHARED_PART tokens of its second block by kv_copy, and prefills the rest.
    o->shared = tm_calloc(V, sizeof(float));
    if (ok && o->shared) {
        uint32_t t4[MAX_POS / BS];
        for (uint32_t k = 0; k < MAX_POS / BS; k++)
            t4[k] = N_SEQ * MAX_POS / BS + TM_MIN(k, SHARED_BLOCKS - 1u);
        t4[0] = table[2][0];
        tm_rc rc = eng->ops->kv_copy(eng, table[2][1], t4[1], SHARED_PART, &err);
        TM_CHECK_OK(rc, &err);
        const uint32_t p0 = BS + SHARED_PART, n = 70 - p0; // the third prompt is 70 tokens
        tm_batch_seq sq = {.tokens = ids[2] + p0,
                           .n_tok = n,
                           .pos = p0,
                           .block_table = t4,
                           .n_block = 70 / BS + 1,
                           .want_logits = 1};
        tm_batch b = {.seqs = &sq, .n_seq = 1};
        if (rc == TM_OK)
            rc = tm_engine_forward(eng, &b, o->shared, &err);
        TM_CHECK_OK(rc, &err);
        ok = rc == TM_OK;
    }
    o->ok = ok;
    tm_free(logits);
    tm_free(mlog);
    tm_engine_destroy(eng);
}

// max |a - b| / max |a| over a row
static double rel_err(const float *a, const float *b, uint32_t n) {
    double max_d = 0, max_a = 0;
    for (uint32_t v = 0; v < n; v++) {
        max_d = fmax(max_d, fabs((double)a[v] - b[v]));
        max_a = fmax(max_a, fabs((double)a[v]));
    }
    return max_a > 0 ? max_d / max_a : max_d;
}

static void compare(const char *name, const tm_model *m, const run_out *ref, uint32_t tp) {
    run_out got = {0};
    run(m, tp, &got);
    if (!ref->ok || !got.ok) {
        TM_CHECK(!"run failed");
        tm_free(got.logits);
        tm_free(got.mtp);
        tm_free(got.shared);
        return;
    }
    const uint32_t V = m->cfg.n_vocab;
    double worst = 0, worst_mtp = 0;
    uint32_t n_equal = 0;
    int tokens_equal = 1, drafts_equal = 1;
    for (uint32_t step = 0; tokens_equal && step < N_STEP; step++) {
        for (uint32_t s = 0; s < N_SEQ; s++) {
            const size_t at = ((size_t)step * N_SEQ + s) * V;
            worst = fmax(worst, rel_err(ref->logits + at, got.logits + at, V));
            tokens_equal &= ref->tokens[s][step] == got.tokens[s][step];
            if (ref->mtp && got.mtp) {
                worst_mtp = fmax(worst_mtp, rel_err(ref->mtp + at, got.mtp + at, V));
                drafts_equal &= ref->drafts[s][step] == got.drafts[s][step];
            }
        }
        n_equal += tokens_equal; // later steps would compare different continuations
    }
    fprintf(stderr,
            "  %s tp=%u: max relative logit error %.2e, greedy tokens equal for %u/%u steps\n",
            name, tp, worst, n_equal, N_STEP);
    TM_CHECK(worst < 1e-4);
    TM_CHECK(tokens_equal);
    // The shared sequence recomputes the third prompt's last row: within its own engine the same
    // bits as the third sequence's first step (chunking and batch do not change a row's sums).
    double worst_shared = rel_err(ref->shared, got.shared, V);
    const size_t third = 2 * (size_t)V; // step 0, sequence 2
    int same_bits = !memcmp(got.shared, got.logits + third, V * sizeof(float)) &&
                    !memcmp(ref->shared, ref->logits + third, V * sizeof(float));
    fprintf(stderr,
            "    prefix-shared sequence (first block shared, kv_copy of %u): %.2e; the unshared "
            "row's bits: %s\n",
            SHARED_PART, worst_shared, same_bits ? "yes" : "NO");
    TM_CHECK(worst_shared < 1e-4);
    TM_CHECK(same_bits);
    if (ref->mtp) {
        fprintf(stderr, "    MTP draft logits: max relative error %.2e, draft tokens %s\n",
                worst_mtp, drafts_equal ? "equal" : "DIFFER");
        TM_CHECK(got.mtp != NULL);
        TM_CHECK(worst_mtp < 1e-4);
        TM_CHECK(drafts_equal);
    }
    tm_free(got.logits);
    tm_free(got.mtp);
    tm_free(got.shared);
}

static int make_model(const char *args, char *dir) {
    const char *build = getenv("TM_BUILD");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s/mkmodel' --out '%s' --arch deepseek_v4 %s >/dev/null",
             build ? build : ".", dir, args);
    return system(cmd);
}

static void check_shape(const char *name, const char *args, const uint32_t *tps, int n_tp) {
    char dir[] = "/tmp/tm_dsv4_tp_XXXXXX", cmd[256];
    TM_ASSERT(mkdtemp(dir));
    TM_CHECK(make_model(args, dir) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    if (m) {
        run_out ref = {0};
        run(m, 1, &ref);
        for (int i = 0; i < n_tp; i++)
            compare(name, m, &ref, tps[i]);
        tm_free(ref.logits);
        tm_free(ref.mtp);
        tm_free(ref.shared);
    }
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

// Common small shape: 4 heads x 16 in 4 output groups, expert width 16, 4 experts top-2, window 8,
// HCA ratio 16 (so 16-token blocks), 4 indexer heads keeping 3 entries.
#define SMALL                                                                                      \
    "--hidden 32 --heads 4 --head-dim 16 --o-groups 4 --o-lora 8 --q-lora 16 --ctx 1024 "          \
    "--window 8 --index-heads 4 --index-dim 8 --index-topk 3 --rope-dim 4 --hca-ratio 16 "         \
    "--experts 4 --experts-used 2 "

static void test_sch_bf16(void) { // every layer kind, hash then top-k MoE, odd vocabulary
    check_shape("sch/hmm bf16",
                SMALL "--seed 21 --layers 3 --dsv4-layers sch --dsv4-mlp hmm --ff 16 --vocab 67 "
                      "--hc 2 --tied 0 --dtype bf16",
                (uint32_t[]){2, 4}, 2);
}

static void test_hcs_f32_tied(void) { // other order, 3 streams, tied head, yarn
    check_shape("hcs/mhm f32 tied",
                SMALL "--seed 22 --layers 3 --dsv4-layers hcs --dsv4-mlp mhm --ff 16 --vocab 64 "
                      "--hc 3 --tied 1 --dtype f32 --yarn 1",
                (uint32_t[]){2, 4}, 2);
}

static void test_quantized(void) { // FP8 block-scaled dense linears, MXFP4 routed experts
    check_shape("cs/mh fp8+mxfp4",
                SMALL "--seed 23 --layers 2 --dsv4-layers cs --dsv4-mlp mh --ff 32 --vocab 67 "
                      "--hc 2 --dtype bf16 --quant fp8-block --quant-block 16 --expert-dtype fp4",
                (uint32_t[]){2}, 1);
}

/* The quantized configs of tests/gpu/test_dsv4_tp_cuda.c (the CUDA engine's TP of FP8 / MXFP4
 * checkpoints): 8 heads x 64 in 4 output groups of o_lora 128, expert width 512, 128 x 128 FP8
 * blocks, so a TP4 rank's slices are whole blocks there. */
#define QCUDA                                                                                      \
    "--hidden 128 --heads 8 --head-dim 64 --rope-dim 16 --q-lora 64 --o-groups 4 --o-lora 128 "    \
    "--ctx 1024 --window 32 --index-heads 16 --index-dim 32 --ff 512 "

static void test_quantized_cuda_shapes(void) {
    check_shape("schc/hhhh fp8+mxfp4 (cuda test)",
                QCUDA "--index-topk 512 --layers 4 --dsv4-layers schc --hc 4 --experts 8 "
                      "--experts-used 2 --hca-ratio 16 --vocab 512 --dsv4-mlp hhhh --dtype bf16 "
                      "--quant fp8-block --expert-dtype fp4 --seed 41",
                (uint32_t[]){2, 4}, 2);
    check_shape("hcs/hmm fp8-ue8m0 + fp8 experts (cuda test)",
                QCUDA "--index-topk 8 --layers 3 --dsv4-layers hcs --hc 2 --experts 6 "
                      "--experts-used 3 --hca-ratio 8 --tied 1 --yarn 0 --vocab 509 --dsv4-mlp hmm "
                      "--dtype bf16 --quant fp8-block-ue8m0 --expert-dtype fp8 --seed 42",
                (uint32_t[]){2, 4}, 2);
}

static void test_mtp(void) { // the MTP layer split like a main one, its draft logits gathered
    check_shape("sc/hm + MTP cm",
                SMALL "--seed 24 --layers 2 --dsv4-layers sc --dsv4-mlp hm --dsv4-mtp cm --ff 16 "
                      "--vocab 67 --hc 2 --dtype bf16",
                (uint32_t[]){2, 4}, 2);
}

static void test_alloc_failures(void) { // every allocation of a TP=2 + MTP create failing in turn
    char dir[] = "/tmp/tm_dsv4_tp_XXXXXX", cmd[256];
    TM_ASSERT(mkdtemp(dir));
    TM_CHECK(make_model(SMALL "--seed 25 --layers 2 --dsv4-layers hc --dsv4-mlp hm --dsv4-mtp sm "
                              "--ff 16 --vocab 67 --hc 2 --dtype bf16",
                        dir) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = BS,
                         .n_kv_block = 8,
                         .max_seqs = 2,
                         .max_batched_tokens = 32,
                         .tp_size = 2};
    int n_fail = 0, ok = 0;
    const long live0 = tm_alloc_live();
    for (long k = 1; m && k < 1000; k++) {
        tm_engine *e = NULL;
        tm_fault_set(TM_FAULT_ALLOC, k);
        tm_rc rc = tm_engine_cpu_tp_create(m, &eo, &e, &err);
        tm_fault_set(TM_FAULT_ALLOC, 0);
        if (rc == TM_OK) {
            tm_engine_destroy(e);
            ok = 1;
            break;
        }
        TM_CHECK_MSG(rc == TM_E_NOMEM, "allocation %ld: rc %d (%s)", k, (int)rc, err.msg);
        TM_CHECK(tm_alloc_live() == live0);
        n_fail++;
    }
    fprintf(stderr, "  %d allocations failed in turn, each cleanly\n", n_fail);
    TM_CHECK(ok && n_fail > 50);
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

static void test_bad_split(void) { // 3 output groups do not split 2 ways
    char dir[] = "/tmp/tm_dsv4_tp_XXXXXX", cmd[256];
    TM_ASSERT(mkdtemp(dir));
    TM_CHECK(make_model("--layers 1 --dsv4-layers s --dsv4-mlp m --hidden 32 --heads 6 "
                        "--head-dim 16 --o-groups 3 --o-lora 8 --q-lora 16 --ff 16 --vocab 64 "
                        "--window 8 --rope-dim 4 --experts 4 --experts-used 2 --hc 2",
                        dir) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    tm_engine *eng = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tm_engine_opts eo = {.n_threads = 2,
                         .block_size = 16,
                         .n_kv_block = 4,
                         .max_seqs = 1,
                         .max_batched_tokens = 16,
                         .tp_size = 2};
    if (m) {
        TM_CHECK(tm_engine_cpu_tp_create(m, &eo, &eng, &err) == TM_E_INVAL);
        TM_CHECK_MSG(strstr(err.msg, "3 output groups") && strstr(err.msg, "divide by tp 2"),
                     "message: %s", err.msg);
        eo.tp_size = 1; // the same model runs unsplit
        TM_CHECK_OK(tm_engine_cpu_tp_create(m, &eo, &eng, &err), &err);
        tm_engine_destroy(eng);
    }
    tm_model_destroy(m);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    TM_CHECK(system(cmd) == 0);
}

int main(void) {
    tm_test_need_build_tool("mkmodel");
    TM_RUN(test_sch_bf16);
    TM_RUN(test_hcs_f32_tied);
    TM_RUN(test_quantized);
    TM_RUN(test_quantized_cuda_shapes);
    TM_RUN(test_mtp);
    TM_RUN(test_alloc_failures);
    TM_RUN(test_bad_split);
    return tm_test_report();
}
