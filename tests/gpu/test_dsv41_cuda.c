/* tests/gpu/test_dsv41_cuda.c - DeepSeek-V4.1 on the CUDA engine (runner/engine/cuda/dsv41.c)
 * against the CPU engine (runner/engine/cpu/dsv41.c, the oracle, itself matched to the NumPy
 * transliteration of DeepSeek's reference) on small random models that tools/mkmodel writes
 * ($TM_BUILD/mkmodel --arch deepseek_v41: FP8 32x32 ue8m0 dense linears, MXFP4 routed experts,
 * Engram tables on disk).
 *
 * The configs go from simple to full, so that the first failing one names the feature at fault:
 * sliding window only; the same with Engram; one ratio-1 kv + index source; a ratio-2 source with
 * a consumer layer; then the five configs of the CPU engine's
 * oracle fixtures (tests/fixtures/v41: Engram on 1-2 layers with 3- and 4-grams, compress ratios
 * 0/1/2/4, kv sources with consumer layers, index-only sources reading another layer's keys,
 * candidate-block selection at ratio 1 and 2, hc 2-4, windows 8-32). Each runs the schedule of
 * tm_gpu_compare.h on both engines with the same block tables (16-token blocks): four sequences,
 * prompts of 37, 100, 5 and 64 tokens, chunked prefill with and without logits, prefills mixed
 * with decodes, 72 decode steps at batch 4 then 3, both engines fed the CPU's greedy tokens;
 * sequences reach 173 tokens, past every window and through many compressed groups. A second
 * CUDA engine driven through tm_engine_cuda_forward_greedy must give the argmax of the first one's
 * logits. Then kv_copy: a sequence continuing from a copied partial block (window rows,
 * compressor inputs, compressed rows, index keys and Engram ids travel with the slots) equals one
 * that computed everything. Then graphs: decode steps replayed from the engine's CUDA graphs must
 * give bitwise the logits of the same steps launched eagerly (graphs_case).
 *
 * Bounds (those of test_dsv4_cuda's tie-free cases): every logit row within LOGIT_TOL (3%) of the
 * row's max |logit|, and a greedy token may differ only at a near tie (CPU top-2 margin <= 2 x the
 * row's error). The CUDA engine does the CPU engine's arithmetic (fp32 values, double sums, the
 * same quantizers), so the max |d logit| printed per config is expected near 1e-5.
 *
 * Diagnostics (the log alone should be enough to fix a failure): per config its mkmodel command,
 * max |d logit|, rows over the bound and the first failing step (step, sequence, position, the
 * step's chunks); every engine error with its message (the CUDA engine names the failing kernel).
 * TM_DSV41_ONLY=name runs one config; TM_DSV41_CUDA_SYNC (read by the engine, set to 1 here unless
 * given) synchronizes after every op and names op and layer of an asynchronous fault;
 * TM_DSV41_VERBOSE=1 prints every step's max |d logit|. Skipped (77) without a GPU, without CUDA,
 * or without mkmodel (TM_BUILD). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tm_test.h"

#ifndef TM_HAVE_CUDA
int main(void) { tm_test_skip("built without CUDA"); }
#else

#include <cuda_runtime_api.h>

#include "base/alloc.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engine/engine.h"
#include "runner/engram_map.h"
#include "runner/model/model.h"
#include "runner/text/tokenizer.h"
#include "tm_gpu_compare.h"
#include "tm_v41_model.h"

static tm_engine_opts opts_of(const v41 *v, uint32_t n_block, uint32_t max_seqs, uint32_t T) {
    tm_engine_opts o = {0};
    o.block_size = BLOCK;
    o.n_kv_block = n_block;
    o.max_seqs = max_seqs;
    o.max_batched_tokens = T;
    o.token_map = v->map;
    o.n_token_map = v->n_map;
    o.engram_cache_mb = 1; // the tables are read through the row cache (engram_table.h)
    return o;
}

static int verbose(void) {
    const char *s = getenv("TM_DSV41_VERBOSE");
    return s && strcmp(s, "0") != 0;
}

/* Where the first row over the bound was seen. */
typedef struct first_bad {
    int seen;
    uint32_t step, seq, pos;
    double err, row_max;
} first_bad;

/* Step k of the schedule on cpu and gpu (and gpu2's device greedy), rows compared into st.
 * Returns 0 on engine failure (printed with the step). */
static int step(const char *name, uint32_t k, tm_engine *cpu, tm_engine *gpu, tm_engine *gpu2,
                seq *S, uint32_t V, stats *st, first_bad *fb) {
    uint32_t which[N_SEQ], n_tok[N_SEQ], want_seq[N_SEQ], ids[N_SEQ];
    const uint32_t n_chunk = sched_step(k, which, n_tok);
    tm_batch_seq bs[N_SEQ];
    const uint32_t n_want = step_batch(S, which, n_tok, n_chunk, bs, want_seq);
    tm_batch b = {.seqs = bs, .n_seq = n_chunk};
    float *lc = malloc((size_t)N_SEQ * V * 4), *lg = malloc((size_t)N_SEQ * V * 4);
    TM_ASSERT(lc && lg);
    tm_err err = {0};
    int ok = 1;
    const char *who = "cpu";
    tm_rc rc = tm_engine_forward(cpu, &b, lc, &err);
    if (!rc) {
        who = "cuda";
        rc = tm_engine_forward(gpu, &b, lg, &err);
    }
    if (!rc) {
        who = "cuda (forward_greedy)";
        rc = tm_engine_cuda_forward_greedy(gpu2, &b, ids, &err);
    }
    if (rc) {
        fprintf(stderr, "%s: step %u: %s engine failed: %s (%s:%d)\n", name, k, who, err.msg,
                err.file ? err.file : "?", err.line);
        TM_CHECK(0);
        ok = 0;
    }
    double step_max = 0.0;
    for (uint32_t r = 0; ok && r < n_want; r++) {
        const float *c = lc + (size_t)r * V, *g = lg + (size_t)r * V;
        const uint32_t tc = argmax(c, V), tg = argmax(g, V);
        const int bad0 = st->n_bad_rows;
        double mx = 0.0, md = 0.0;
        for (uint32_t v = 0; v < V; v++) {
            mx = fmax(mx, fabs(c[v]));
            md = fmax(md, isnan(g[v]) ? INFINITY : fabs((double)g[v] - c[v]));
        }
        step_max = fmax(step_max, md);
        compare_row(st, "cpu", c, tc, "cuda", g, tg, V);
        st->n_dev_diff += ids[r] != tg;
        if (st->n_bad_rows > bad0 && !fb->seen) {
            const seq *s = &S[want_seq[r]];
            *fb = (first_bad){1, k, want_seq[r], s->n - 1, md, mx};
        }
        seq_append(&S[want_seq[r]], tc);
    }
    if (ok && verbose()) {
        fprintf(stderr, "  %s step %u (", name, k);
        for (uint32_t i = 0; i < n_chunk; i++)
            fprintf(stderr, "%sseq %u: %u tok at %u", i ? ", " : "", which[i], n_tok[i],
                    S[which[i]].done);
        fprintf(stderr, "): max |d logit| %.3g\n", step_max);
    }
    step_done(S, which, n_tok, n_chunk);
    free(lc);
    free(lg);
    return ok;
}

static int selected(const char *name) {
    const char *only = getenv("TM_DSV41_ONLY");
    return !only || !strcmp(only, name);
}

static void run_case(const char *name, const char *args) {
    if (!selected(name))
        return;
    char dir[] = "/tmp/tm_dsv41_cuda_XXXXXX", cmd[1024];
    if (mkmodel(dir, args, cmd, sizeof(cmd)) != 0) {
        fprintf(stderr, "%s: mkmodel failed: %s\n", name, cmd);
        TM_CHECK(0);
        rmdir_all(dir);
        return;
    }
    fprintf(stderr, "%s: %s\n", name, cmd);
    v41 v;
    tm_engine *cpu = NULL, *gpu = NULL, *gpu2 = NULL;
    if (open_v41(dir, &v))
        goto done;
    const uint32_t V = v.m->cfg.n_vocab;
    tm_engine_opts o = opts_of(&v, SEQ_BLOCKS, N_SEQ, 256);
    tm_err err = {0};
    TM_CHECK_OK(tm_engine_cpu_create(v.m, &o, &cpu, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(v.m, &o, &gpu, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(v.m, &o, &gpu2, &err), &err);
    if (!cpu || !gpu || !gpu2) {
        fprintf(stderr, "%s: engine create failed: %s\n", name, err.msg);
        goto done;
    }
    static seq S[N_SEQ];
    g_rng = 91;
    seqs_init(S, V);
    stats st = {0};
    first_bad fb = {0};
    int ok = 1;
    uint32_t k = 0;
    for (; ok && k < N_STEP; k++)
        ok = step(name, k, cpu, gpu, gpu2, S, V, &st, &fb);
    fprintf(stderr,
            "%s: %d logit rows over %u steps, max |d logit| %.4g, max |d logit| / row max|logit| "
            "%.4g (tol %.2g), %d rows over; greedy %d/%d equal (%d not near a tie); device greedy "
            "vs host argmax: %d differ\n",
            name, st.n_rows, k, st.max_abs, st.max_rel, LOGIT_TOL, st.n_bad_rows,
            st.n_greedy - st.n_greedy_diff, st.n_greedy, st.n_clear_flip, st.n_dev_diff);
    if (fb.seen)
        fprintf(stderr,
                "%s: FIRST BAD ROW at step %u (%s), sequence %u, position %u: max |d logit| %.4g "
                "of row max %.4g (TM_DSV41_VERBOSE=1 TM_DSV41_ONLY=%s prints every step)\n",
                name, fb.step, fb.step < 4 ? "prefill" : "decode", fb.seq, fb.pos, fb.err,
                fb.row_max, name);
    TM_CHECK(ok);
    TM_CHECK(st.n_rows >= N_DECODE * 3);
    TM_CHECK_MSG(st.n_bad_rows == 0, "%s: %d rows beyond %.2g of the row's max |logit|", name,
                 st.n_bad_rows, LOGIT_TOL);
    TM_CHECK_MSG(st.n_clear_flip == 0, "%s: %d greedy tokens differ (%d not near a tie)", name,
                 st.n_greedy_diff, st.n_clear_flip);
    TM_CHECK_MSG(st.n_dev_diff == 0, "%s: device greedy differs from the logits' argmax %d times",
                 name, st.n_dev_diff);
done:
    tm_engine_destroy(gpu2);
    tm_engine_destroy(gpu);
    tm_engine_destroy(cpu);
    close_v41(&v);
    if (rmdir_all(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

#define A "--arch deepseek_v41 "

// the ladder: each adds features to the one before
static void test_swa_only(void) {
    run_case("swa-only", A "--seed 40 --layers 2 --compress-ratios 0,0 --kv-sources none "
                           "--index-sources none --engram-layers none --window 8");
}
static void test_engram_swa(void) {
    run_case("engram-swa", A "--seed 47 --layers 2 --compress-ratios 0,0 --kv-sources none "
                             "--index-sources none --engram-layers 0 --window 8");
}
static void test_ratio1(void) {
    run_case("ratio1", A "--seed 44 --layers 2 --compress-ratios 0,1 --kv-sources 1 "
                         "--index-sources 1 --engram-layers none --index-heads 4 --index-topk 4 "
                         "--window 8");
}
static void test_ratio2(void) {
    run_case("ratio2", A "--seed 49 --layers 3 --compress-ratios 0,2,2 --kv-sources 1 "
                         "--index-sources 1 --engram-layers none --index-heads 4 --index-topk 4 "
                         "--window 8");
}
// the CPU engine's oracle fixtures (tests/fixtures/v41/*.json, mkmodel_args)
static void test_tiny(void) {
    run_case("v41_tiny", A "--seed 41 --layers 3 --compress-ratios 0,2,1 --kv-sources 1,2 "
                           "--index-sources 1,2 --engram-layers 0 --index-heads 16 --index-topk 4 "
                           "--window 8");
}
static void test_r4_swa(void) {
    run_case("v41_r4_swa", A "--seed 48 --layers 4 --compress-ratios 0,4,4,0 --kv-sources 1 "
                             "--index-sources 1 --engram-layers none --index-heads 16 "
                             "--index-topk 6 --original-seq-len 0 --experts 6 --topk 3 --window 8");
}
static void test_engram_r012(void) {
    run_case("v41_engram_r012", A "--seed 42 --layers 5 --compress-ratios 0,2,2,1,1 "
                                  "--kv-sources 1,3 --index-sources 1,3 --engram-layers 0,2 "
                                  "--index-heads 16 --index-topk 8 --window 16");
}
static void test_cand_r1(void) {
    run_case("v41_cand_r1", A "--seed 43 --layers 6 --compress-ratios 0,2,1,1,1,0 --kv-sources 1,2 "
                              "--index-sources 1,2,4 --candidate-source 2 "
                              "--candidate-topk-blocks 4 --candidate-block-size 8 "
                              "--index-heads 16 --index-topk 16 --engram-layers 3 "
                              "--engram-ngram 4 --engram-heads 3 --hc 3 --window 32");
}
static void test_cand_r2(void) {
    run_case("v41_cand_r2", A "--seed 46 --layers 4 --compress-ratios 1,2,2,2 --kv-sources 0,1 "
                              "--index-sources 0,1,3 --candidate-source 1 "
                              "--candidate-topk-blocks 3 --candidate-block-size 4 "
                              "--index-heads 16 --index-topk 8 --engram-layers 1,3 --hc 2 "
                              "--swiglu-limit 0 --window 16");
}

// kv_copy: B shares A's first 20 tokens (block 0 whole, the 4 computed slots of A's block 1
// copied), then computes 3 more; its logits must match C, which computed all 23 itself.
static void test_kv_copy(void) {
    if (!selected("kv-copy"))
        return;
    char dir[] = "/tmp/tm_dsv41_cuda_XXXXXX", cmd[1024];
    TM_CHECK(mkmodel(dir,
                     A "--seed 45 --layers 4 --compress-ratios 0,2,2,1 --kv-sources 1,3 "
                       "--index-sources 1,3 --engram-layers 0,2 --index-heads 16 --index-topk 4 "
                       "--window 8",
                     cmd, sizeof(cmd)) == 0);
    v41 v;
    tm_engine *gpu = NULL;
    tm_err err = {0};
    if (open_v41(dir, &v) == 0) {
        tm_engine_opts o = opts_of(&v, 16, 2, 64);
        TM_CHECK_OK(tm_engine_cuda_create(v.m, &o, &gpu, &err), &err);
    }
    if (gpu) {
        const uint32_t V = v.m->cfg.n_vocab;
        double max_c = 0;
        int same = 0;
        const double max_d = kv_copy_diff(gpu, V, &max_c, &same);
        fprintf(stderr, "kv-copy: max |logit B - logit C| %.3g (row max %.3g)\n", max_d, max_c);
        // the same kernels on the same state: only the step shapes differ (none of the kernels
        // depends on them), so equal up to the last bits
        TM_CHECK_MSG(max_d <= 1e-4 * fmax(max_c, 1.0), "kv-copy: %.3g", max_d);
        TM_CHECK(same);
    }
    tm_engine_destroy(gpu);
    close_v41(&v);
    TM_CHECK(rmdir_all(dir) == 0);
}

/* Decode steps as CUDA graphs (the engine's own, one per stretch between Engram layers) against
 * the same steps launched eagerly: two CUDA engines of the same model and config, one with graphs
 * (the default) and one with tm_engine_cuda_set_graphs(0), fed the same batches. Both run the same
 * kernels with the same arguments, so every logit must be BITWISE equal; a graph replaying stale
 * arguments (a host value baked in at capture, rows not staged before a segment) breaks that at
 * once. One prefill of all four prompts, then GR_STEPS decode steps of batch sizes 4, 3, 2 and 1 in
 * turn over rotating sequences (every size's graphs replayed with other sequences, positions and
 * block tables; sequence 2 grows from 5 tokens across two block boundaries), with a kv_copy of a
 * sequence's partial last block into a fresh block in the middle (as a preemption or a prefix-cache
 * fork would), after which the copy's block serves the decodes. TM_DSV41_CUDA_SYNC forces eager
 * steps, so these engines are created with it off; each case runs with TM_DSV41_CUDA_EXACT 0 and 1
 * (the fast and the plain linears where the engine has both modes). */
#define GR_STEPS 48
#define GR_BLOCKS (SEQ_BLOCKS + 4) /* blocks SEQ_BLOCKS.. receive the kv_copy */

/* One mode of the engine (TM_DSV41_CUDA_EXACT, read at create: "0" the fast linears, "1" the
 * plain kernels; a build without the switch runs the same engine twice). */
static void graphs_run(const char *case_name, const char *mode, const v41 *v) {
    char name[128];
    snprintf(name, sizeof(name), "%s (TM_DSV41_CUDA_EXACT=%s)", case_name, mode);
    tm_engine *eg = NULL, *ee = NULL; // graphs, eager
    float *lg = NULL, *le = NULL;
    const uint32_t V = v->m->cfg.n_vocab;
    tm_engine_opts o = opts_of(v, GR_BLOCKS, N_SEQ, 256);
    tm_err err = {0};
    const char *sy = getenv("TM_DSV41_CUDA_SYNC");
    char *sync_was = sy ? strdup(sy) : NULL;
    setenv("TM_DSV41_CUDA_SYNC", "0", 1);
    setenv("TM_DSV41_CUDA_EXACT", mode, 1);
    TM_CHECK_OK(tm_engine_cuda_create(v->m, &o, &eg, &err), &err);
    TM_CHECK_OK(tm_engine_cuda_create(v->m, &o, &ee, &err), &err);
    unsetenv("TM_DSV41_CUDA_EXACT");
    if (sync_was)
        setenv("TM_DSV41_CUDA_SYNC", sync_was, 1);
    free(sync_was);
    if (!eg || !ee)
        goto done;
    tm_engine_cuda_set_graphs(eg, 1);
    tm_engine_cuda_set_graphs(ee, 0);
    lg = malloc((size_t)N_SEQ * V * 4), le = malloc((size_t)N_SEQ * V * 4);
    TM_ASSERT(lg && le);
    static seq S[N_SEQ];
    g_rng = 93;
    seqs_init(S, V);
    static const uint32_t sizes[4] = {4, 3, 2, 1};
    uint32_t n_rows = 0, n_diff_rows = 0, n_copy = 0, size_steps[5] = {0};
    int ok = 1, first = 1;
    for (uint32_t k = 0; ok && k <= GR_STEPS; k++) {
        uint32_t which[N_SEQ], n_tok[N_SEQ], want_seq[N_SEQ], n_chunk;
        if (k == 0) { // every prompt at once (eager on both)
            n_chunk = N_SEQ;
            for (uint32_t i = 0; i < N_SEQ; i++)
                which[i] = i, n_tok[i] = S[i].n;
        } else {
            n_chunk = sizes[(k - 1) % 4];
            for (uint32_t i = 0; i < n_chunk; i++)
                which[i] = (k + k / 4 + i) % N_SEQ, n_tok[i] = 1; // every size sees every seq
            size_steps[n_chunk]++;
        }
        if (k == GR_STEPS / 2) { // sequence 1's partial last block into a fresh block, both engines
            seq *s = &S[1];
            const uint32_t last = (s->done - 1) / BLOCK, used = s->done - last * BLOCK;
            const uint32_t dst = SEQ_BLOCKS + 1;
            TM_CHECK_OK(ee->ops->kv_copy(ee, s->bt[last], dst, used, &err), &err);
            TM_CHECK_OK(eg->ops->kv_copy(eg, s->bt[last], dst, used, &err), &err);
            fprintf(stderr, "%s: step %u: kv_copy of sequence 1's block %u (%u slots) into %u\n",
                    name, k, s->bt[last], used, dst);
            s->bt[last] = dst;
            n_copy++;
        }
        tm_batch_seq bs[N_SEQ];
        const uint32_t n_want = step_batch(S, which, n_tok, n_chunk, bs, want_seq);
        tm_batch b = {.seqs = bs, .n_seq = n_chunk};
        tm_rc rc = tm_engine_forward(ee, &b, le, &err);
        if (rc)
            fprintf(stderr, "%s: step %u: eager engine failed: %s\n", name, k, err.msg);
        if (!rc && (rc = tm_engine_forward(eg, &b, lg, &err)) != TM_OK)
            fprintf(stderr, "%s: step %u: graphs engine failed: %s\n", name, k, err.msg);
        if (rc) {
            TM_CHECK(0);
            ok = 0;
            break;
        }
        for (uint32_t r = 0; r < n_want; r++) {
            const float *a = le + (size_t)r * V, *g = lg + (size_t)r * V;
            n_rows++;
            if (memcmp(a, g, (size_t)V * 4) != 0) {
                uint32_t n_v = 0, v0 = V;
                double md = 0;
                for (uint32_t x = 0; x < V; x++)
                    if (memcmp(&a[x], &g[x], 4) != 0) {
                        n_v++;
                        v0 = v0 < V ? v0 : x;
                        md = fmax(md, fabs((double)a[x] - g[x]));
                    }
                n_diff_rows++;
                if (first)
                    fprintf(stderr,
                            "%s: FIRST DIFFERENCE at step %u (%s, batch %u), sequence %u, position "
                            "%u: %u of %u logits differ (first at %u: eager %.9g graphs %.9g), "
                            "max |d| %.3g\n",
                            name, k, k ? "decode" : "prefill", n_chunk, want_seq[r],
                            S[want_seq[r]].n - 1, n_v, V, v0, (double)a[v0], (double)g[v0], md);
                first = 0;
            }
            seq_append(&S[want_seq[r]], argmax(a, V));
        }
        step_done(S, which, n_tok, n_chunk);
    }
    fprintf(
        stderr,
        "%s: graphs vs eager: %u logit rows, %u not bitwise equal; decode steps of batch 4/3/2/1: "
        "%u/%u/%u/%u; %u kv_copy; sequence lengths %u %u %u %u\n",
        name, n_rows, n_diff_rows, size_steps[4], size_steps[3], size_steps[2], size_steps[1],
        n_copy, S[0].done, S[1].done, S[2].done, S[3].done);
    TM_CHECK(ok);
    TM_CHECK(n_rows >= N_SEQ + GR_STEPS * 2);
    TM_CHECK(S[2].done > 2 * BLOCK); // from 5 tokens across two block boundaries
    TM_CHECK_MSG(n_diff_rows == 0, "%s: %u logit rows differ between graph and eager decode steps",
                 name, n_diff_rows);
done:
    free(lg);
    free(le);
    tm_engine_destroy(eg);
    tm_engine_destroy(ee);
}

static void graphs_case(const char *name, const char *args) {
    if (!selected(name))
        return;
    char dir[] = "/tmp/tm_dsv41_cuda_XXXXXX", cmd[1024];
    if (mkmodel(dir, args, cmd, sizeof(cmd)) != 0) {
        fprintf(stderr, "%s: mkmodel failed: %s\n", name, cmd);
        TM_CHECK(0);
        rmdir_all(dir);
        return;
    }
    fprintf(stderr, "%s: %s\n", name, cmd);
    v41 v;
    if (open_v41(dir, &v) == 0) {
        graphs_run(name, "0", &v);
        graphs_run(name, "1", &v);
    }
    close_v41(&v);
    if (rmdir_all(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

// Engram on layers 0 and 2 (segment 0 is the embedding alone), 1 and 3 (hc 2), none
static void test_graphs_engram02(void) {
    graphs_case("graphs-engram02", A "--seed 42 --layers 5 --compress-ratios 0,2,2,1,1 "
                                     "--kv-sources 1,3 --index-sources 1,3 --engram-layers 0,2 "
                                     "--index-heads 16 --index-topk 8 --window 16");
}
static void test_graphs_engram13(void) {
    graphs_case("graphs-engram13", A "--seed 46 --layers 4 --compress-ratios 1,2,2,2 "
                                     "--kv-sources 0,1 --index-sources 0,1,3 --candidate-source 1 "
                                     "--candidate-topk-blocks 3 --candidate-block-size 4 "
                                     "--index-heads 16 --index-topk 8 --engram-layers 1,3 --hc 2 "
                                     "--swiglu-limit 0 --window 16");
}
static void test_graphs_no_engram(void) {
    graphs_case("graphs-no-engram", A "--seed 49 --layers 3 --compress-ratios 0,2,2 "
                                      "--kv-sources 1 --index-sources 1 --engram-layers none "
                                      "--index-heads 4 --index-topk 4 --window 8");
}

int main(void) {
    g_rng = 91;
    need_gpu_and_mkmodel();
    // the engine synchronizes after every op, so that an asynchronous fault names its op and
    // layer (a sticky CUDA error also fails every later config of this process: the first
    // failing config is the one to read); TM_DSV41_CUDA_SYNC=0 turns it off
    setenv("TM_DSV41_CUDA_SYNC", "1", 0);
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        fprintf(stderr, "device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    TM_RUN(test_swa_only);
    TM_RUN(test_engram_swa);
    TM_RUN(test_ratio1);
    TM_RUN(test_ratio2);
    TM_RUN(test_tiny);
    TM_RUN(test_r4_swa);
    TM_RUN(test_engram_r012);
    TM_RUN(test_cand_r1);
    TM_RUN(test_cand_r2);
    TM_RUN(test_kv_copy);
    TM_RUN(test_graphs_engram02);
    TM_RUN(test_graphs_engram13);
    TM_RUN(test_graphs_no_engram);
    return tm_test_report();
}

#endif /* TM_HAVE_CUDA */
