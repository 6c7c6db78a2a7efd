/* tests/unit/test_dsv4_kv8.c - the fp8 KV cache of the DeepSeek-V4 CPU engine
 * (engine.kv_cache_dtype "fp8"; docs/deepseek_v4.md "fp8 KV cache"): the rotated KV rows, the
 * compressed rows (CSA, HCA) and the indexer's compressed rows are stored as DeepSeek's fp8 cache
 * holds them (e4m3 tiles of 64 / 128 values with one power-of-two scale each, the rope slice of a
 * KV row in bf16), the compressor inputs stay fp32.
 *
 * On small mkmodel models (layer 0 CSA, HCA or sliding; all three kinds in each; 2 and 3
 * streams; bf16 and f32), each in a tie-free variant (hash-routed MoE, the indexer keeps every
 * entry) and one with discrete choices (top-k MoE, an indexer top-k below the entry count), the
 * schedule of tests/gpu/tm_gpu_compare.h (four sequences, prompts of 37, 100, 5 and 64 tokens over
 * 16-token blocks, prefill chunks mixed with decodes, 72 decode steps), every engine fed the
 * auto engine's greedy tokens (teacher forcing):
 * (a) fp8 against auto KV: tie-free, each logit row's max error / max |logit| within TF_MAX_BOUND
 *     and the relative RMS error within TF_RMS_BOUND; with discrete choices (a rounding flips an
 *     expert or entry choice, which later tokens read) the RMS error within DC_RMS_BOUND (bounds
 *     about twice the worst measured, bench/RESULTS.md); in both a greedy token may differ only
 *     at a near tie (the auto row's top-2 margin <= 2 x the row's error; each flip printed);
 * (b) the fp8 engine's rows are bit-identical to those of a fresh fp8 engine (1 thread instead of
 *     2) that runs each sequence alone, its prompt in chunks of 7;
 * (c) a sequence that shares sequence 1's first three blocks and gets 5 tokens of its fourth by
 *     kv_copy, then prefills the rest, gives the same bits as sequence 1's own row (the prefix
 *     cache's path; a preempted sequence recomputes as (b) does);
 * (d) TP=2 with fp8 KV against TP=1 with fp8 KV: greedy tokens equal, rows within 1e-4 of the
 *     row's max |logit| (test_dsv4_tp's bound) on the tie-free models, 1e-3 with discrete
 *     choices: the replicated state is computed from inputs that differ in the last bits, so a
 *     few stored values land on the other side of an e4m3 rounding tie (their count printed);
 * (e) every stored KV, compressed and indexer compressed value of every used block and layer is
 *     fp8-representable under the rule (its tile's power-of-two scale from the tile's amax; the
 *     rope slice a bf16 value), and layer 0's rows, whose inputs are the same in both engines,
 *     are exactly the test's own rounding of the auto engine's rows (its compressor inputs the
 *     same bits); the MTP layer's state too (test_mtp). With the rounding skipped (e) fails.
 * Also the rule on crafted rows (test_rule: where the scale matters), and bf16 and fp8-head KV
 * stay refused for DeepSeek-V4. Without mkmodel the test is skipped. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tm_test.h"

#include "gpu/tm_gpu_compare.h"
#include "base/alloc.h"
#include "runner/engine/cpu/dsv4.h"
#include "runner/engine/engine.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv4.h"
#include "runner/model/tensor.h"

/* fp8 vs auto KV, about twice the worst measured (bench/RESULTS.md): tie-free models, max |err| /
 * max |logit| of a row and the relative RMS error; with discrete choices the RMS error only */
#define TF_MAX_BOUND 0.5
#define TF_RMS_BOUND 0.12
#define DC_RMS_BOUND 0.4
#define TP_BOUND 1e-4    /* TP=2 vs TP=1, both fp8: test_dsv4_tp's bound (tie-free models) */
#define TP_DC_BOUND 1e-3 /* the same with discrete choices (see (d) in the top comment) */
#define SPARE_BLOCKS 8   /* blocks past SEQ_BLOCKS for the prefix-shared sequence */
#define SOLO_CHUNK 7     /* prompt chunk of (b)'s one-sequence runs */
#define MAX_V 512

/* logits rows of one engine over the schedule, by (sequence, position) */
typedef struct rows {
    float *l; /* [N_SEQ][MAX_TOK][V] */
    uint8_t have[N_SEQ][MAX_TOK];
} rows;

static float *row_at(rows *r, uint32_t s, uint32_t p, uint32_t V) {
    return r->l + ((size_t)s * MAX_TOK + p) * V;
}

static tm_engine *make(const tm_model *m, tm_kv_dtype kvt, uint32_t tp, uint32_t n_threads) {
    tm_engine_opts eo = {.n_threads = n_threads,
                         .block_size = BLOCK,
                         .n_kv_block = SEQ_BLOCKS + SPARE_BLOCKS,
                         .max_seqs = N_SEQ,
                         .max_batched_tokens = 128,
                         .kv_dtype = kvt,
                         .tp_size = tp};
    tm_engine *e = NULL;
    tm_err err = {0};
    TM_CHECK_OK(tm_engine_cpu_tp_create(m, &eo, &e, &err), &err);
    return e;
}

/* The schedule on n_eng engines (engs[0] the reference, whose greedy tokens are appended); each
 * engine's rows into R[e]. S starts with the prompts and ends with every token fed. */
static int run_schedule(tm_engine **engs, int n_eng, seq *S, uint32_t V, rows *R) {
    float *lg = tm_malloc((size_t)N_SEQ * V * sizeof(float));
    tm_err err = {0};
    int ok = lg != NULL;
    for (uint32_t k = 0; ok && k < N_STEP; k++) {
        uint32_t which[N_SEQ], n_tok[N_SEQ], want_seq[N_SEQ];
        tm_batch_seq bs[N_SEQ];
        const uint32_t n_chunk = sched_step(k, which, n_tok);
        const uint32_t n_want = step_batch(S, which, n_tok, n_chunk, bs, want_seq);
        tm_batch b = {.seqs = bs, .n_seq = n_chunk};
        uint32_t ref_tok[N_SEQ] = {0};
        for (int e = 0; ok && e < n_eng; e++) {
            CHECK_CALL(ok, tm_engine_forward(engs[e], &b, lg, &err), &err);
            for (uint32_t r = 0; ok && r < n_want; r++) {
                const seq *s = &S[want_seq[r]];
                memcpy(row_at(&R[e], want_seq[r], s->n - 1, V), lg + (size_t)r * V,
                       V * sizeof(float));
                R[e].have[want_seq[r]][s->n - 1] = 1;
                if (e == 0)
                    ref_tok[r] = argmax(lg + (size_t)r * V, V);
            }
        }
        for (uint32_t r = 0; ok && r < n_want; r++)
            seq_append(&S[want_seq[r]], ref_tok[r]);
        step_done(S, which, n_tok, n_chunk);
    }
    tm_free(lg);
    return ok;
}

/* Compares got's rows with ref's over every row both have, into st (compare_row: the max
 * relative error, greedy flips and whether each is near a tie). Returns the relative RMS error. */
static double compare_rows(rows *ref, rows *got, uint32_t V, const char *rn, const char *gn,
                           stats *st) {
    double se = 0, sr = 0;
    for (uint32_t s = 0; s < N_SEQ; s++)
        for (uint32_t p = 0; p < MAX_TOK; p++) {
            if (!ref->have[s][p] || !got->have[s][p])
                continue;
            const float *a = row_at(ref, s, p, V), *b = row_at(got, s, p, V);
            compare_row(st, rn, a, argmax(a, V), gn, b, argmax(b, V), V);
            for (uint32_t v = 0; v < V; v++) {
                se += ((double)b[v] - a[v]) * ((double)b[v] - a[v]);
                sr += (double)a[v] * a[v];
            }
        }
    return sr > 0 ? sqrt(se / sr) : 0;
}

/* ---- (e) the stored values ---- */

static float bf16r(float x) { return tm_bf16_to_f32(tm_f32_to_bf16(x)); }

/* The least k with a <= 448 * 2^k (a > 0), by search: independent of the engine's frexpf. */
static int pow2_exp(double a) {
    int k = -60;
    while (ldexp(448.0, k) < a)
        k++;
    return k;
}

/* The test's own rounding of a tile (the rule of the top comment) into out. */
static void round_tile(const float *x, uint32_t n, float *out) {
    double amax = 1e-4;
    for (uint32_t i = 0; i < n; i++)
        amax = fmax(amax, fabs((double)bf16r(x[i])));
    const int k = pow2_exp(amax);
    for (uint32_t i = 0; i < n; i++)
        out[i] = (float)ldexp((double)tm_kv_fp8_round((float)ldexp(bf16r(x[i]), -k)), k);
}

/* Values of a stored tile that are not e4m3 times the power-of-two scale of the tile's own amax. */
static uint32_t bad_tile(const float *x, uint32_t n) {
    double amax = 1e-4;
    for (uint32_t i = 0; i < n; i++)
        amax = fmax(amax, fabs((double)x[i]));
    const int k = pow2_exp(amax);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        const double q = ldexp((double)x[i], -k); // exact
        bad += !(fabs(q) <= 448.0 && (double)tm_kv_fp8_round((float)q) == q);
    }
    return bad;
}

/* kind 0: a KV / compressed row of hd (tiles of 64 over hd - rd, then rd bf16 values); kind 1:
 * an indexer row of hd (tiles of 128). */
static uint32_t bad_row(const float *row, uint32_t hd, uint32_t rd, int kind) {
    const uint32_t tile = kind ? 128 : 64, nq = kind ? hd : hd - rd;
    uint32_t bad = 0;
    for (uint32_t t = 0; t < nq; t += tile)
        bad += bad_tile(row + t, TM_MIN(tile, nq - t));
    for (uint32_t i = nq; i < hd; i++)
        bad += bf16r(row[i]) != row[i];
    return bad;
}

static void round_row(const float *row, uint32_t hd, uint32_t rd, int kind, float *out) {
    const uint32_t tile = kind ? 128 : 64, nq = kind ? hd : hd - rd;
    for (uint32_t t = 0; t < nq; t += tile)
        round_tile(row + t, TM_MIN(tile, nq - t), out + t);
    for (uint32_t i = nq; i < hd; i++)
        out[i] = bf16r(row[i]);
}

/* The rule itself (tm_dsv4_fp8_kv_row / _index_row) against the test's own on rows that a scale
 * matters for: values over 22 binades and past 448, a tile at the scale boundaries, a tiny tile
 * (the 1e-4 clamp), short tiles, the rope slice; NaN and infinity. On the engine's O(1) rows the
 * scale rarely matters (e4m3 is a float: a power-of-two scale moves only the subnormal and the
 * saturation edges), so these rows are what pins it. */
static void test_rule(void) {
    enum { HD = 144 + 16, RD = 16, DI = 160 };
    float x[HD], a[HD], b[HD];
    for (int i = 0; i < 64; i++) // tile 0: 2^-18 .. 2^4, both signs
        x[i] = (i & 1 ? -1.0f : 1.0f) *
               ldexpf(1.0f + 0.37f * (float)((i * 5) % 7) / 7.0f, -18 + (int)(0.35f * (float)i));
    for (int i = 0; i < 64; i++) // tile 1: past 448 (scale 8), and small ones
        x[64 + i] = (i % 3 ? 1.0f : -1.0f) *
                    (i < 8 ? 3000.0f - 100.0f * (float)i : 0.013f * (float)i);
    for (int i = 0; i < 16; i++) // tile 2 (short: 144 - 128 = 16 values): tiny, the 1e-4 clamp
        x[128 + i] = 1e-6f * (float)(i + 1) / 3.0f;
    for (int i = 0; i < RD; i++) // the rope slice: many mantissa bits, rounded to bf16 only
        x[144 + i] = (float)(i + 1) / 3.0f * (i & 1 ? -1000.0f : 1e-3f);
    memcpy(a, x, sizeof(x));
    tm_dsv4_fp8_kv_row(a, HD, RD);
    round_row(x, HD, RD, 0, b);
    TM_CHECK(!memcmp(a, b, sizeof(a)));
    TM_CHECK(bad_row(a, HD, RD, 0) == 0);
    int n_scale1 = 0, n_changed = 0; // where the Llama rule (e4m3 at scale 1) would differ
    for (int i = 0; i < HD; i++) {
        n_scale1 += tm_kv_fp8_round(x[i]) != a[i];
        n_changed += x[i] != a[i];
    }
    fprintf(stderr, "  rule: %d of %d values rounded; scale 1.0 would store %d otherwise\n",
            n_changed, HD, n_scale1);
    TM_CHECK(n_scale1 > 40 && n_changed > 100);
    // -3000: bf16 -3008, scale 2^3, 376 -> 384 (e4m3 steps of 32 above 256): 3072, not saturated
    TM_CHECK_MSG(a[64] == -3072.0f, "%g", (double)a[64]);
    // scale boundaries: amax 448 -> k 0; 480 (a bf16 value) -> k 1; 224 -> k -1. At 2^k the amax
    // is kept and 2^(k-9) (the least subnormal there) too; 2^(k+1) would round 2^(k-9) to 0,
    // 2^(k-1) would saturate the amax
    const float amax[3] = {448.0f, 480.0f, 224.0f};
    const int want_k[3] = {0, 1, -1};
    for (int c = 0; c < 3; c++) {
        float t[64], r[64];
        for (int i = 0; i < 64; i++)
            t[i] = i == 5 ? amax[c] : 1.0f + (float)i / 64.0f;
        t[7] = ldexpf(1.0f, want_k[c] - 9);
        t[9] = ldexpf(3.0f, want_k[c] - 11); // 0.75 x that subnormal: rounds up to it
        round_tile(t, 64, r);
        tm_dsv4_fp8_kv_row(t, 64, 0);
        TM_CHECK(!memcmp(t, r, sizeof(t)));
        TM_CHECK_MSG(t[5] == amax[c] && t[7] == ldexpf(1.0f, want_k[c] - 9) && t[9] == t[7],
                     "amax %g: %g %g %g", (double)amax[c], (double)t[5], (double)t[7],
                     (double)t[9]);
    }
    // the indexer row: tiles of 128 and 32
    float y[DI], ya[DI], yb[DI];
    for (int i = 0; i < DI; i++)
        y[i] = (i % 5 ? 1.0f : -1.0f) * ldexpf(1.0f + (float)i / 300.0f, -12 + i / 10);
    memcpy(ya, y, sizeof(y));
    tm_dsv4_fp8_index_row(ya, DI);
    round_row(y, DI, 0, 1, yb);
    TM_CHECK(!memcmp(ya, yb, sizeof(ya)));
    TM_CHECK(bad_row(ya, DI, 0, 1) == 0);
    // NaN stays NaN and does not change its tile's scale; an infinity saturates (scale 1)
    float n1[64], n2[64];
    for (int i = 0; i < 64; i++)
        n1[i] = n2[i] = 0.001f * (float)(i + 1);
    n2[3] = NAN;
    tm_dsv4_fp8_kv_row(n1, 64, 0);
    tm_dsv4_fp8_kv_row(n2, 64, 0);
    TM_CHECK(isnan(n2[3]) && n2[10] == n1[10] && n2[63] == n1[63]);
    n2[3] = INFINITY;
    n2[4] = 1000.0f;
    tm_dsv4_fp8_kv_row(n2, 64, 0);
    TM_CHECK(n2[3] == 448.0f && n2[4] == 448.0f && n2[10] == tm_kv_fp8_round(n1[10]));
}

typedef struct state_check {
    uint64_t n_checked, n_nonzero, n_bad; /* values of the fp8 rows of every layer */
    uint64_t n_exact, n_exact_bad;        /* layer 0's rows against the rounded auto ones */
    uint64_t n_in, n_in_bad;              /* layer 0's compressor / indexer inputs (fp32) */
} state_check;

/* The parts of layer il in the blocks, checked (fp8 engine f8; auto engine au when exact: layer
 * il's rows must be its rows rounded, the inputs the same bits). */
static void check_layer(tm_engine *f8, tm_engine *au, uint32_t il, const uint32_t *blocks,
                        uint32_t n_blocks, uint32_t rd, state_check *c) {
    static const tm_dsv4_part rowp[3] = {TM_DSV4_PART_KV, TM_DSV4_PART_COMP, TM_DSV4_PART_ICOMP};
    static const tm_dsv4_part inp[2] = {TM_DSV4_PART_CIN, TM_DSV4_PART_IIN};
    float tmp[1024];
    for (uint32_t bi = 0; bi < n_blocks; bi++) {
        for (int pi = 0; pi < 3; pi++) {
            uint32_t nr, w, nr2, w2;
            const float *x = tm_dsv4_state(f8, il, rowp[pi], blocks[bi], &nr, &w);
            if (!x)
                continue;
            TM_ASSERT(w <= 1024);
            const float *y = au ? tm_dsv4_state(au, il, rowp[pi], blocks[bi], &nr2, &w2) : NULL;
            for (uint32_t r = 0; r < nr; r++) {
                const float *row = x + (size_t)r * w;
                c->n_bad += bad_row(row, w, rd, pi == 2);
                c->n_checked += w;
                for (uint32_t i = 0; i < w; i++)
                    c->n_nonzero += row[i] != 0.0f;
                if (y) {
                    round_row(y + (size_t)r * w, w, rd, pi == 2, tmp);
                    c->n_exact += w;
                    c->n_exact_bad += memcmp(tmp, row, w * sizeof(float)) != 0;
                }
            }
        }
        for (int pi = 0; au && pi < 2; pi++) {
            uint32_t nr, w, nr2, w2;
            const float *x = tm_dsv4_state(f8, il, inp[pi], blocks[bi], &nr, &w);
            const float *y = tm_dsv4_state(au, il, inp[pi], blocks[bi], &nr2, &w2);
            TM_CHECK((x == NULL) == (y == NULL));
            if (!x || !y)
                continue;
            c->n_in += (uint64_t)nr * w;
            c->n_in_bad += memcmp(x, y, (size_t)nr * w * sizeof(float)) != 0;
        }
    }
}

/* ---- (b), (c) ---- */

/* Each sequence alone on a fresh engine, its prompt in chunks of SOLO_CHUNK, then one token per
 * step: every row must be the bits of R's. Returns the rows compared. */
static uint32_t solo_runs(const tm_model *m, const seq *S, const uint32_t *plen, uint32_t V,
                          rows *R, uint32_t *n_diff) {
    tm_engine *e = make(m, TM_KV_DTYPE_FP8, 1, 1);
    float *lg = tm_malloc(V * sizeof(float));
    tm_err err = {0};
    uint32_t n = 0;
    int ok = e && lg;
    for (uint32_t s = 0; ok && s < N_SEQ; s++) {
        for (uint32_t pos = 0; ok && pos < S[s].done;) {
            const uint32_t end = pos < plen[s] ? TM_MIN(pos + SOLO_CHUNK, plen[s]) : pos + 1;
            tm_batch_seq sq = {.tokens = S[s].tok + pos,
                               .n_tok = end - pos,
                               .pos = pos,
                               .block_table = S[s].bt,
                               .n_block = MAX_TOK / BLOCK,
                               .want_logits = R->have[s][end - 1]};
            tm_batch b = {.seqs = &sq, .n_seq = 1};
            CHECK_CALL(ok, tm_engine_forward(e, &b, lg, &err), &err);
            if (ok && sq.want_logits) {
                n++;
                *n_diff += memcmp(lg, row_at(R, s, end - 1, V), V * sizeof(float)) != 0;
            }
            pos = end;
        }
    }
    TM_CHECK(ok);
    tm_free(lg);
    tm_engine_destroy(e);
    return n;
}

/* Sequence 1's prompt again on eng (after the schedule): its first 3 blocks shared, 5 tokens of
 * its 4th copied by kv_copy into a spare block, the rest prefilled; 1 when its last row has the
 * bits of sequence 1's own. */
static int prefix_shared(tm_engine *eng, const seq *S, uint32_t plen1, uint32_t V, rows *R) {
    const uint32_t n_shared = 3, part = 5, p0 = n_shared * BLOCK + part;
    uint32_t bt[MAX_TOK / BLOCK];
    for (uint32_t k = 0; k < MAX_TOK / BLOCK; k++)
        bt[k] = k < n_shared ? S[1].bt[k] : SEQ_BLOCKS + TM_MIN(k - n_shared, SPARE_BLOCKS - 1);
    tm_err err = {0};
    int ok = 1;
    CHECK_CALL(ok, eng->ops->kv_copy(eng, S[1].bt[n_shared], bt[n_shared], part, &err), &err);
    float *lg = tm_malloc(V * sizeof(float));
    tm_batch_seq sq = {.tokens = S[1].tok + p0,
                       .n_tok = plen1 - p0,
                       .pos = p0,
                       .block_table = bt,
                       .n_block = MAX_TOK / BLOCK,
                       .want_logits = 1};
    tm_batch b = {.seqs = &sq, .n_seq = 1};
    if (ok && lg)
        CHECK_CALL(ok, tm_engine_forward(eng, &b, lg, &err), &err);
    ok = ok && lg && R->have[1][plen1 - 1] &&
         !memcmp(lg, row_at(R, 1, plen1 - 1, V), V * sizeof(float));
    tm_free(lg);
    return ok;
}

/* ---- one model ---- */

static void check_model(const char *name, const char *args, int tie_free) {
    char dir[] = "/tmp/tm_dsv4_kv8_XXXXXX", cmd[1024];
    if (mkmodel(dir, args, cmd, sizeof(cmd)) != 0) {
        fprintf(stderr, "%s: mkmodel failed: %s\n", name, cmd);
        TM_CHECK(0);
        return;
    }
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    if (!m) {
        rmdir_all(dir);
        return;
    }
    const uint32_t V = m->cfg.n_vocab, rd = tm_model_dsv4(m)->cfg.rope_dim;
    TM_ASSERT(V <= MAX_V);
    enum { AU, F8, TP2, N_ENG };
    tm_engine *engs[N_ENG] = {make(m, TM_KV_DTYPE_AUTO, 1, 2), make(m, TM_KV_DTYPE_FP8, 1, 2),
                              make(m, TM_KV_DTYPE_FP8, 2, 2)};
    rows R[N_ENG];
    memset(R, 0, sizeof(R));
    int ok = 1;
    for (int e = 0; e < N_ENG; e++) {
        R[e].l = tm_calloc((size_t)N_SEQ * MAX_TOK * V, sizeof(float));
        ok &= engs[e] != NULL && R[e].l != NULL;
    }
    static seq S[N_SEQ];
    g_rng = 4242;
    seqs_init(S, V);
    uint32_t plen[N_SEQ];
    for (uint32_t s = 0; s < N_SEQ; s++)
        plen[s] = S[s].n;
    ok = ok && run_schedule(engs, N_ENG, S, V, R);
    TM_CHECK(ok);
    if (ok) {
        // (a) fp8 against auto
        stats a = {0};
        const double rms = compare_rows(&R[AU], &R[F8], V, "auto", "fp8", &a);
        fprintf(stderr,
                "  %s (%s): fp8 vs auto KV: %d rows, max err / max|logit| %.4f, rel RMS %.4f, max "
                "abs err %.4g; greedy %d/%d equal, %d not near a tie\n",
                name, tie_free ? "tie-free" : "with discrete choices", a.n_rows, a.max_rel, rms,
                a.max_abs, a.n_greedy - a.n_greedy_diff, a.n_greedy, a.n_clear_flip);
        TM_CHECK(a.n_rows >= 3 * N_DECODE);
        if (tie_free) {
            TM_CHECK_MSG(a.max_rel <= TF_MAX_BOUND, "%s: max err / max|logit| %.4f", name,
                         a.max_rel);
            TM_CHECK_MSG(rms <= TF_RMS_BOUND, "%s: rel RMS %.4f", name, rms);
        } else {
            TM_CHECK_MSG(rms <= DC_RMS_BOUND, "%s: rel RMS %.4f", name, rms);
        }
        TM_CHECK_MSG(a.n_clear_flip == 0, "%s: %d greedy flips not near a tie", name,
                     a.n_clear_flip);
        // (d) TP=2 fp8 against TP=1 fp8
        stats t = {0};
        compare_rows(&R[F8], &R[TP2], V, "tp1", "tp2", &t);
        // fp8 values TP=2 stored otherwise (upstream last-bit differences across a rounding tie)
        static const tm_dsv4_part rounded[3] = {TM_DSV4_PART_KV, TM_DSV4_PART_COMP,
                                                TM_DSV4_PART_ICOMP};
        uint64_t n_tp_vals = 0, n_tp_diff = 0;
        for (uint32_t il = 0; il < m->cfg.n_layer; il++)
            for (uint32_t s = 0; s < N_SEQ; s++)
                for (uint32_t k = 0; k * BLOCK < S[s].done; k++)
                    for (int pi = 0; pi < 3; pi++) {
                        uint32_t nr, w, nr2, w2;
                        const float *x = tm_dsv4_state(engs[F8], il, rounded[pi], S[s].bt[k], &nr,
                                                       &w);
                        const float *y = tm_dsv4_state(engs[TP2], il, rounded[pi], S[s].bt[k], &nr2,
                                                       &w2);
                        for (size_t i = 0; x && y && i < (size_t)nr * w; i++) {
                            n_tp_vals++;
                            n_tp_diff += x[i] != y[i];
                        }
                    }
        fprintf(stderr,
                "  %s: fp8 TP=2 vs TP=1: max err / max|logit| %.3g, greedy %d/%d equal; fp8 "
                "values stored otherwise %llu of %llu\n",
                name, t.max_rel, t.n_greedy - t.n_greedy_diff, t.n_greedy,
                (unsigned long long)n_tp_diff, (unsigned long long)n_tp_vals);
        TM_CHECK_MSG(t.max_rel < (tie_free ? TP_BOUND : TP_DC_BOUND), "%s: TP=2 %.3g", name,
                     t.max_rel);
        TM_CHECK(t.n_greedy_diff == 0 && t.n_rows == a.n_rows);
        // (e) the stored values, every layer, every block the sequences used
        uint32_t blocks[SEQ_BLOCKS], n_blocks = 0;
        for (uint32_t s = 0; s < N_SEQ; s++)
            for (uint32_t k = 0; k * BLOCK < S[s].done; k++)
                blocks[n_blocks++] = S[s].bt[k];
        state_check c = {0};
        for (uint32_t il = 0; il < m->cfg.n_layer; il++)
            check_layer(engs[F8], il == 0 ? engs[AU] : NULL, il, blocks, n_blocks, rd, &c);
        state_check c2 = {0}; // the TP engine's (rank 0's) state obeys the rule too
        for (uint32_t il = 0; il < m->cfg.n_layer; il++)
            check_layer(engs[TP2], NULL, il, blocks, n_blocks, rd, &c2);
        fprintf(stderr,
                "  %s: stored rows: %llu values (%llu non-zero) in %u blocks, %llu not "
                "fp8-representable (TP=2: %llu); layer 0: %llu values, %llu rows differ from the "
                "rounded auto rows; compressor inputs %llu values, %llu blocks differ\n",
                name, (unsigned long long)c.n_checked, (unsigned long long)c.n_nonzero, n_blocks,
                (unsigned long long)c.n_bad, (unsigned long long)c2.n_bad,
                (unsigned long long)c.n_exact, (unsigned long long)c.n_exact_bad,
                (unsigned long long)c.n_in, (unsigned long long)c.n_in_bad);
        TM_CHECK(c.n_nonzero > c.n_checked / 4);
        TM_CHECK(c.n_bad == 0 && c2.n_bad == 0);
        TM_CHECK(c.n_exact > 0 && c.n_exact_bad == 0);
        TM_CHECK(c.n_in_bad == 0);
        // (c) the prefix cache's path on the fp8 engine (after (e): it writes spare blocks only)
        const int shared = prefix_shared(engs[F8], S, plen[1], V, &R[F8]);
        // (b) one sequence at a time, other chunks, one thread
        uint32_t n_diff = 0;
        const uint32_t n_solo = solo_runs(m, S, plen, V, &R[F8], &n_diff);
        fprintf(stderr,
                "  %s: fp8 alone / chunks of %d / 1 thread: %u of %u rows differ; prefix-shared + "
                "kv_copy row: %s\n",
                name, SOLO_CHUNK, n_diff, n_solo, shared ? "same bits" : "DIFFERS");
        TM_CHECK(n_solo == (uint32_t)a.n_rows && n_diff == 0);
        TM_CHECK(shared);
    }
    for (int e = 0; e < N_ENG; e++) {
        tm_engine_destroy(engs[e]);
        tm_free(R[e].l);
    }
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

#define COMMON "--arch deepseek_v4 --vocab 256 --ctx 1024 --hca-ratio 16 "
/* tie-free: hash-routed MoE only, the indexer keeps every entry; else top-k MoE and indexer */
#define TIE_FREE "--dsv4-mlp hhh --index-topk 512 "

// layer 0 CSA (its KV, compressed and indexer rows checked exactly), non-rope slice of 2 tiles
#define CSA_FIRST                                                                                  \
    COMMON "--seed 41 --layers 3 --dsv4-layers csh --hidden 64 --heads 2 --head-dim 144 "          \
           "--rope-dim 16 --q-lora 32 --o-groups 2 --o-lora 16 --ff 32 --window 16 "               \
           "--index-heads 16 --index-dim 16 --hc 2 --experts 4 --experts-used 2 --dtype bf16 "
static void test_csa_first(void) {
    check_model("csh bf16 hd144", CSA_FIRST TIE_FREE, 1);
    check_model("csh bf16 hd144", CSA_FIRST "--dsv4-mlp hmm --index-topk 8", 0);
}

// layer 0 HCA (ratio 8), a short tile (48 values), 3 streams, f32, yarn
#define HCA_FIRST                                                                                  \
    COMMON "--seed 42 --layers 3 --dsv4-layers hsc --hidden 48 --heads 4 --head-dim 64 "           \
           "--rope-dim 16 --q-lora 24 --o-groups 2 --o-lora 12 --ff 24 --window 32 "               \
           "--index-heads 16 --index-dim 32 --hc 3 --experts 6 --experts-used 3 --hca-ratio 8 "    \
           "--dtype f32 --yarn 1 "
static void test_hca_first(void) {
    check_model("hsc f32 hd64", HCA_FIRST TIE_FREE, 1);
    check_model("hsc f32 hd64", HCA_FIRST "--dsv4-mlp hmm --index-topk 4", 0);
}

// layer 0 sliding, indexer rows of 2 tiles (128 + 32), tied head
#define SLIDING_FIRST                                                                              \
    COMMON "--seed 43 --layers 3 --dsv4-layers sch --hidden 32 --heads 4 --head-dim 32 "           \
           "--rope-dim 8 --q-lora 16 --o-groups 4 --o-lora 8 --ff 16 --window 8 "                  \
           "--index-heads 4 --index-dim 160 --hc 2 --experts 4 --experts-used 2 --tied 1 "         \
           "--dtype bf16 "
static void test_sliding_first(void) {
    check_model("sch bf16 di160", SLIDING_FIRST TIE_FREE, 1);
    check_model("sch bf16 di160", SLIDING_FIRST "--dsv4-mlp mhm --index-topk 3", 0);
}

/* The MTP layer (a CSA one) keeps its state in the blocks like a main layer: after an MTP forward
 * over a prefill's rows, its KV, compressed and indexer rows obey the rule too. */
static void test_mtp(void) {
    char dir[] = "/tmp/tm_dsv4_kv8_XXXXXX", cmd[1024];
    if (mkmodel(dir,
                COMMON "--seed 44 --layers 2 --dsv4-layers sh --dsv4-mlp hm --dsv4-mtp cm "
                       "--hidden 32 --heads 4 --head-dim 32 --rope-dim 8 --q-lora 16 --o-groups 2 "
                       "--o-lora 8 --ff 16 --window 8 --index-heads 4 --index-dim 16 "
                       "--index-topk 3 --hc 2 --experts 4 --experts-used 2 --dtype bf16",
                cmd, sizeof(cmd)) != 0) {
        fprintf(stderr, "mkmodel failed: %s\n", cmd);
        TM_CHECK(0);
        return;
    }
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    tm_engine *e = m ? make(m, TM_KV_DTYPE_FP8, 1, 2) : NULL;
    if (e) {
        const uint32_t V = m->cfg.n_vocab, n = 40, nb = 3;
        uint32_t tok[41], next[40], bt[4] = {5, 2, 7, 1};
        for (uint32_t i = 0; i < 41; i++)
            tok[i] = (i * 37 + 11) % V;
        float *lg = tm_malloc(V * sizeof(float));
        tm_batch_seq sq = {
            .tokens = tok, .n_tok = n, .pos = 0, .block_table = bt, .n_block = 4, .want_logits = 1};
        tm_batch b = {.seqs = &sq, .n_seq = 1};
        int ok = 1;
        CHECK_CALL(ok, tm_engine_forward(e, &b, lg, &err), &err);
        uint32_t n_hid = 0;
        const float *hid = ok ? tm_dsv4_hidden(e, &n_hid) : NULL;
        TM_CHECK(hid && n_hid == n);
        for (uint32_t i = 0; i < n; i++)
            next[i] = tok[i + 1];
        tm_dsv4_mtp_seq ms = {.hidden = hid,
                              .next = next,
                              .n_tok = n,
                              .pos = 0,
                              .block_table = bt,
                              .n_block = 4,
                              .want_logits = 1};
        if (hid)
            CHECK_CALL(ok, tm_dsv4_mtp_forward(e, &ms, 1, lg, NULL, &err), &err);
        state_check c = {0};
        if (ok)
            check_layer(e, NULL, m->cfg.n_layer, bt, nb, tm_model_dsv4(m)->cfg.rope_dim, &c);
        uint32_t nr, w;
        TM_CHECK(tm_dsv4_state(e, m->cfg.n_layer, TM_DSV4_PART_ICOMP, bt[0], &nr, &w) != NULL);
        TM_CHECK(tm_dsv4_state(e, m->cfg.n_layer + 1, TM_DSV4_PART_KV, bt[0], &nr, &w) == NULL);
        fprintf(stderr,
                "  MTP layer (CSA): %llu values (%llu non-zero), %llu not fp8-representable\n",
                (unsigned long long)c.n_checked, (unsigned long long)c.n_nonzero,
                (unsigned long long)c.n_bad);
        TM_CHECK(ok && c.n_nonzero > c.n_checked / 4 && c.n_bad == 0);
        tm_free(lg);
    }
    tm_engine_destroy(e);
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

// DeepSeek-V4 takes auto and fp8 KV only.
static void test_refusals(void) {
    char dir[] = "/tmp/tm_dsv4_kv8_XXXXXX", cmd[1024];
    TM_CHECK(mkmodel(dir,
                     COMMON "--layers 1 --dsv4-layers s --dsv4-mlp m --hidden 32 --heads 2 "
                            "--head-dim 16 --rope-dim 4 --q-lora 16 --o-groups 2 --o-lora 8 "
                            "--ff 16 --window 8 --experts 4 --experts-used 2 --hc 2",
                     cmd, sizeof(cmd)) == 0);
    tm_err err = {0};
    tm_model *m = NULL;
    TM_CHECK_OK(tm_model_load(dir, &m, &err), &err);
    const tm_kv_dtype no[2] = {TM_KV_DTYPE_BF16, TM_KV_DTYPE_FP8_HEAD};
    for (int i = 0; m && i < 2; i++) {
        tm_engine_opts eo = {.n_threads = 1,
                             .block_size = BLOCK,
                             .n_kv_block = 4,
                             .max_seqs = 1,
                             .max_batched_tokens = 16,
                             .kv_dtype = no[i]};
        tm_engine *e = NULL;
        TM_CHECK(tm_engine_cpu_create(m, &eo, &e, &err) == TM_E_INVAL && !e);
        TM_CHECK_MSG(strstr(err.msg, tm_kv_dtype_name(no[i])) != NULL, "%s", err.msg);
        TM_CHECK(tm_dsv4_engine_create(m, &eo, &e, &err) == TM_E_INVAL && !e);
        eo.kv_dtype = TM_KV_DTYPE_FP8;
        TM_CHECK_OK(tm_engine_cpu_create(m, &eo, &e, &err), &err);
        tm_engine_destroy(e);
    }
    tm_model_destroy(m);
    TM_CHECK(rmdir_all(dir) == 0);
}

int main(void) {
    const char *build = getenv("TM_BUILD");
    char mk[1024];
    snprintf(mk, sizeof(mk), "%s/mkmodel", build ? build : "build");
    if (access(mk, X_OK) != 0) {
        fprintf(stderr, "skipped: no mkmodel at %s\n", mk);
        return 77;
    }
    TM_RUN(test_rule);
    TM_RUN(test_refusals);
    TM_RUN(test_csa_first);
    TM_RUN(test_hca_first);
    TM_RUN(test_sliding_first);
    TM_RUN(test_mtp);
    return tm_test_report();
}
