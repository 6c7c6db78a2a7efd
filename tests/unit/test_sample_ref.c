/* tests/unit/test_sample_ref.c - tm_sample_token against a small reference written from
 * docs/sampling.md (full sort in the canonical order, the kept set as the shortest prefix of the
 * order whose mass reaches top_p, the walk in id order): logits processing (logit_bias,
 * repetition / frequency / presence penalties, the min_tokens mask), top-k / top-p / min-p with
 * many ties, greedy with processing, and the stated outputs of the canonical order. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tm_test.h"
#include "runner/sched/sample.h"

#define NV_MAX 3000

static tm_sample_scratch g_s;

/* ---- the reference ---- */

// Processing, written from the definition with a quadratic scan for distinct ids.
static void ref_process(const float *x, uint32_t n, const tm_sample_params *p, float *l) {
    for (uint32_t i = 0; i < n; i++)
        l[i] = x[i];
    for (uint32_t j = 0; j < p->n_bias; j++)
        l[p->bias_ids[j]] += p->bias[j];
    for (uint32_t id = 0; id < n; id++) {
        int seen = 0;
        uint32_t c = 0;
        for (uint32_t j = 0; j < p->n_hist; j++)
            if (p->hist[j] == id) {
                seen = 1;
                c += j >= p->n_hist_prompt;
            }
        if (!seen)
            continue;
        float r = p->repetition_penalty;
        if (r > 0 && r != 1)
            l[id] = l[id] > 0 ? l[id] / r : l[id] * r;
        if (c) {
            float t = p->frequency_penalty * (float)c;
            l[id] = l[id] - t;
            l[id] = l[id] - p->presence_penalty;
        }
    }
    for (uint32_t j = 0; j < p->n_mask; j++)
        l[p->mask_ids[j]] = -INFINITY;
}

static const float *g_key;
static int by_key(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    if (g_key[i] != g_key[j])
        return g_key[i] > g_key[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

static uint32_t ref_sample(const float *x, uint32_t n, const tm_sample_params *p, uint64_t step) {
    static float l[NV_MAX], w[NV_MAX];
    static uint32_t ord[NV_MAX];
    static int kept[NV_MAX];
    ref_process(x, n, p, l);
    uint32_t am = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[am])
            am = i;
    if (!(p->temperature > 0) || p->top_k == 1 || n == 1)
        return am;
    for (uint32_t i = 0; i < n; i++)
        ord[i] = i;
    g_key = l;
    qsort(ord, n, sizeof(ord[0]), by_key);
    uint32_t nk = p->top_k > 0 && (uint32_t)p->top_k < n ? (uint32_t)p->top_k : n;
    float inv_t = 1.0f / p->temperature;
    double T = 0;
    for (uint32_t i = 0; i < n; i++) {
        w[i] = expf((l[i] - l[am]) * inv_t);
        kept[i] = 0;
    }
    for (uint32_t r = 0; r < nk; r++)
        T += w[ord[r]];
    double before = 0;
    for (uint32_t r = 0; r < nk; r++) {
        uint32_t i = ord[r];
        int in_p = !(p->top_p > 0 && p->top_p < 1) || before < (double)p->top_p * T || r == 0;
        kept[i] = in_p && w[i] > 0 && !(p->min_p > 0 && w[i] < p->min_p);
        before += w[i];
    }
    double S = 0;
    for (uint32_t i = 0; i < n; i++)
        if (kept[i])
            S += w[i];
    double u = tm_sample_uniform(p->seed, step) * S, cum = 0;
    uint32_t last = am;
    for (uint32_t i = 0; i < n; i++)
        if (kept[i]) {
            cum += w[i];
            last = i;
            if (u < cum)
                return i;
        }
    return last;
}

static uint32_t sample(const float *lg, uint32_t n, const tm_sample_params *p, uint64_t step) {
    tm_err err = {0};
    uint32_t tok = UINT32_MAX;
    TM_CHECK_OK(tm_sample_token(lg, n, p, step, &g_s, &tok, &err), &err);
    TM_CHECK(tok < n);
    return tok;
}

static uint64_t g_rng = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

// Random logits with many ties (coarse grid) or fine values.
static void fill(float *x, uint32_t n, int coarse) {
    for (uint32_t i = 0; i < n; i++)
        x[i] = coarse ? (float)rnd(40) * 0.25f - 5.0f : (float)rnd(1 << 20) * 1e-5f - 5.0f;
}

/* ---- tests ---- */

// The sampler equals the reference on random rows, sampling parameters and processing.
static void test_vs_reference(void) {
    static float x[NV_MAX];
    uint32_t hist[64], bias_ids[8], mask[3];
    float bias[8];
    int n_diff = 0, n_trial = 0;
    for (int trial = 0; trial < 3000; trial++) {
        uint32_t n = 1 + rnd(trial % 3 == 0 ? 2500 : 60);
        fill(x, n, trial % 2);
        tm_sample_params p = {.temperature = trial % 7 == 0 ? 0.0f : 0.3f + (float)rnd(20) * 0.1f,
                              .seed = (uint64_t)trial * 77};
        if (rnd(2))
            p.top_k = (int32_t)rnd(n + 2);
        if (rnd(2))
            p.top_p = 0.05f + (float)rnd(95) * 0.01f;
        if (rnd(3) == 0)
            p.min_p = (float)rnd(30) * 0.01f;
        if (rnd(2)) {
            p.n_hist = 1 + rnd(64);
            p.n_hist_prompt = rnd(p.n_hist + 1);
            for (uint32_t j = 0; j < p.n_hist; j++)
                hist[j] = rnd(TM_MIN(n, 30u)); // repeats
            p.hist = hist;
            p.repetition_penalty = rnd(2) ? 0.5f + (float)rnd(20) * 0.1f : 0.0f;
            p.frequency_penalty = rnd(2) ? (float)rnd(40) * 0.1f - 2.0f : 0.0f;
            p.presence_penalty = rnd(2) ? (float)rnd(40) * 0.1f - 2.0f : 0.0f;
        }
        if (rnd(3) == 0) {
            p.n_bias = 1 + rnd(TM_MIN(n, 8u));
            for (uint32_t j = 0; j < p.n_bias; j++) {
                bias_ids[j] = (j * 7919u + (uint32_t)trial) % n;
                for (uint32_t k = 0; k < j; k++)
                    if (bias_ids[k] == bias_ids[j])
                        bias_ids[j] = UINT32_MAX;
                bias[j] = (float)rnd(2001) * 0.1f - 100.0f;
            }
            uint32_t w = 0; // keep distinct ids only
            for (uint32_t j = 0; j < p.n_bias; j++)
                if (bias_ids[j] != UINT32_MAX)
                    bias[w] = bias[j], bias_ids[w++] = bias_ids[j];
            p.n_bias = w;
            p.bias_ids = bias_ids, p.bias = bias;
        }
        if (n > 3 && rnd(3) == 0) {
            mask[0] = 0, mask[1] = n - 1, mask[2] = rnd(n);
            p.mask_ids = mask, p.n_mask = 3;
        }
        for (uint64_t st = 0; st < 4; st++) {
            n_trial++;
            n_diff += sample(x, n, &p, st) != ref_sample(x, n, &p, st);
        }
    }
    TM_CHECK(n_diff == 0);
    if (n_diff)
        fprintf(stderr, "%d of %d draws differ from the reference\n", n_diff, n_trial);
}

// Processing alone, as stated: bias, then repetition, then frequency and presence, then mask.
static void test_process_stated(void) {
    const float x[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
    const uint32_t hist[] = {1, 3, 3, 2, 1, 1}; // prompt {1, 3}; generated 3, 2, 1, 1
    const uint32_t bid[] = {4, 2};
    const float bv[] = {10.0f, -0.25f};
    const uint32_t mk[] = {5};
    tm_sample_params p = {.repetition_penalty = 2.0f,
                          .frequency_penalty = 0.5f,
                          .presence_penalty = 0.25f,
                          .bias_ids = bid,
                          .bias = bv,
                          .n_bias = 2,
                          .mask_ids = mk,
                          .n_mask = 1,
                          .hist = hist,
                          .n_hist = 6,
                          .n_hist_prompt = 2};
    float out[6];
    tm_err err = {0};
    TM_CHECK_OK(tm_sample_process(x, 6, &p, &g_s, out, &err), &err);
    TM_CHECK(out[0] == 2.0f);                         // untouched
    TM_CHECK(out[1] == -1.0f * 2 - 0.5f * 2 - 0.25f); // rep (x < 0: times), 2 generated
    TM_CHECK(out[2] == 0.25f / 2 - 0.5f - 0.25f);     // bias, rep (x > 0: divided), 1 generated
    TM_CHECK(out[3] == 1.5f - 0.5f - 0.25f);          // prompt and generated once
    TM_CHECK(out[4] == 8.0f);                         // bias only
    TM_CHECK(out[5] == -INFINITY);                    // masked
    for (uint32_t i = 0; i < 6; i++)
        TM_CHECK(g_s.cnt[i] == 0); // scratch counts left clean
    // greedy with processing: the argmax of the processed row (4), not of the raw one (3)
    p.temperature = 0.0f;
    TM_CHECK(sample(x, 6, &p, 0) == 4);
    TM_CHECK(tm_sample_has_proc(&p) && !tm_sample_has_proc(&(tm_sample_params){.top_k = 3}));
    // out-of-range bias ids are refused
    const uint32_t bad[] = {6};
    p.bias_ids = bad, p.n_bias = 1;
    TM_CHECK(tm_sample_process(x, 6, &p, &g_s, out, &err) == TM_E_INVAL);
    // every id masked
    const uint32_t all[] = {0, 1};
    tm_sample_params q = {.temperature = 1.0f, .mask_ids = all, .n_mask = 2};
    uint32_t tok;
    TM_CHECK(tm_sample_token(x, 2, &q, 0, &g_s, &tok, &err) == TM_E_INVAL);
}

// The canonical order's outputs, stated: equal logits are drawn in id order by u, so with two
// tied tokens the lower id takes u < 1/2; a top-p cut inside a tie keeps the lower ids.
static void test_canonical_stated(void) {
    const float x[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    tm_sample_params p = {.temperature = 1.0f, .top_k = 2};
    for (uint64_t st = 0; st < 64; st++) {
        p.seed = st;
        double u = tm_sample_uniform(st, 3);
        TM_CHECK(sample(x, 4, &p, 3) == (u < 0.5 ? 0u : 1u)); // top-k 2 of a tie: ids 0 and 1
    }
    p = (tm_sample_params){.temperature = 1.0f, .top_p = 0.5f};
    for (uint64_t st = 0; st < 64; st++) {
        p.seed = st;
        // mass before id 0, 1, 2: 0, 1, 2 of 4; need 2: ids 0 and 1 kept
        TM_CHECK(sample(x, 4, &p, 0) == (tm_sample_uniform(st, 0) < 0.5 ? 0u : 1u));
    }
    // top_p just above 1/2: id 2 joins (mass before it, 2, is below 2.04)
    p.top_p = 0.51f;
    int saw2 = 0;
    for (uint64_t st = 0; st < 200; st++) {
        p.seed = st;
        uint32_t t = sample(x, 4, &p, 0);
        TM_CHECK(t <= 2);
        saw2 |= t == 2;
    }
    TM_CHECK(saw2);
}

int main(void) {
    tm_err err = {0};
    TM_CHECK_OK(tm_sample_scratch_init(&g_s, NV_MAX, &err), &err);
    TM_RUN(test_process_stated);
    TM_RUN(test_canonical_stated);
    TM_RUN(test_vs_reference);
    tm_sample_scratch_fini(&g_s);
    return tm_test_report();
}
