/* tests/unit/test_sample.c - the sampler: greedy ties, top_k = 1 equals greedy, the sampled
 * distribution matches softmax(logits / T) (chi-square over many seeds), top-k / top-p / min-p
 * never return what they should exclude, (seed, step) determinism, NaN/inf refusal, and the
 * threshold path of top-p on a large vocab agrees with an exact reference nucleus. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tm_test.h"
#include "runner/sched/sample.h"

static tm_sample_scratch g_s;

static uint32_t sample(const float *lg, uint32_t n, tm_sample_params p, uint64_t step) {
    tm_err err = {0};
    uint32_t tok = UINT32_MAX;
    TM_CHECK_OK(tm_sample_token(lg, n, &p, step, &g_s, &tok, &err), &err);
    TM_CHECK(tok < n);
    return tok;
}

static void test_greedy_ties(void) {
    float lg[6] = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f, 1.0f};
    tm_sample_params p = {.temperature = 0.0f};
    TM_CHECK(sample(lg, 6, p, 0) == 1);
    p.temperature = -1.0f;
    TM_CHECK(sample(lg, 6, p, 3) == 1);
    // top_k = 1 with a temperature is greedy too, lowest id on ties
    p = (tm_sample_params){.temperature = 1.0f, .top_k = 1, .seed = 5};
    for (uint64_t st = 0; st < 50; st++)
        TM_CHECK(sample(lg, 6, p, st) == 1);
    float one = 3.0f;
    p.top_k = 0;
    TM_CHECK(sample(&one, 1, p, 0) == 0);
}

static void test_top_k1_equals_greedy_random(void) {
    float lg[300];
    uint64_t s = 1;
    for (int trial = 0; trial < 50; trial++) {
        for (int i = 0; i < 300; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            lg[i] = (float)((s >> 40) % 50) * 0.1f; // many ties
        }
        tm_sample_params g = {.temperature = 0.0f};
        tm_sample_params k = {.temperature = 0.7f, .top_k = 1, .seed = (uint64_t)trial};
        TM_CHECK(sample(lg, 300, g, 0) == sample(lg, 300, k, (uint64_t)trial));
    }
}

/* Chi-square of counts against expected probabilities; returns the statistic. */
static double chi2(const long *count, const double *prob, int n, long total) {
    double x = 0.0;
    for (int i = 0; i < n; i++) {
        double e = prob[i] * (double)total;
        if (e > 0)
            x += (count[i] - e) * (count[i] - e) / e;
        else
            TM_CHECK(count[i] == 0);
    }
    return x;
}

static void test_distribution(void) {
    const float lg[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -2.0f, 0.7f};
    const float temps[2] = {1.0f, 0.6f};
    for (int ti = 0; ti < 2; ti++) {
        double prob[8], sum = 0.0;
        for (int i = 0; i < 8; i++)
            sum += prob[i] = exp(lg[i] / temps[ti]);
        for (int i = 0; i < 8; i++)
            prob[i] /= sum;
        long count[8] = {0};
        const long N = 200000;
        // over seeds at a fixed step, and over steps at a fixed seed
        for (long k = 0; k < N; k++) {
            tm_sample_params p = {.temperature = temps[ti], .seed = (uint64_t)k};
            count[sample(lg, 8, p, k % 2 ? 7 : (uint64_t)k)]++;
        }
        double x = chi2(count, prob, 8, N);
        // 7 degrees of freedom: P(chi2 > 29.9) = 1e-4
        TM_CHECK_MSG(x < 29.9, "T=%g chi2 %g", (double)temps[ti], x);
        fprintf(stderr, "  T=%.1f: chi2 %.2f over %ld draws (7 dof)\n", (double)temps[ti], x, N);
    }
}

static void test_top_k_top_p_min_p(void) {
    // probabilities at T=1 proportional to exp(logit)
    const float lg[6] = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f};
    double e[6];
    for (int i = 0; i < 6; i++)
        e[i] = exp(lg[i]);
    long count[6] = {0};
    const long N = 60000;
    // top_k = 3: only 0..2, distributed as the renormalised softmax
    for (long k = 0; k < N; k++)
        count[sample(lg, 6, (tm_sample_params){.temperature = 1.0f, .top_k = 3, .seed = 1}, k)]++;
    double p3[6] = {0}, s3 = e[0] + e[1] + e[2];
    for (int i = 0; i < 3; i++)
        p3[i] = e[i] / s3;
    TM_CHECK(count[3] == 0 && count[4] == 0 && count[5] == 0);
    TM_CHECK_MSG(chi2(count, p3, 6, N) < 18.4, "top_k chi2"); // 2 dof, 1e-4

    // top_p: p0 = 0.636, p0+p1 = 0.870, +p2 = 0.957. top_p 0.8 keeps {0, 1}.
    memset(count, 0, sizeof(count));
    for (long k = 0; k < N; k++)
        count[sample(lg, 6, (tm_sample_params){.temperature = 1.0f, .top_p = 0.8f, .seed = 2},
                     k)]++;
    TM_CHECK(count[0] > 0 && count[1] > 0);
    TM_CHECK(count[2] == 0 && count[3] == 0 && count[4] == 0 && count[5] == 0);
    double p2[6] = {e[0] / (e[0] + e[1]), e[1] / (e[0] + e[1])};
    TM_CHECK_MSG(chi2(count, p2, 6, N) < 15.2, "top_p chi2"); // 1 dof
    // top_p 0.5 keeps the best only; top_p 0.9 keeps 0..2
    for (long k = 0; k < 200; k++) {
        TM_CHECK(sample(lg, 6, (tm_sample_params){.temperature = 1.0f, .top_p = 0.5f}, k) == 0);
        TM_CHECK(sample(lg, 6, (tm_sample_params){.temperature = 1.0f, .top_p = 0.9f}, k) <= 2);
    }

    // min_p = 0.1: drop p < 0.1 * p_max, i.e. logit < 3 - ln 10 = 0.697: keeps {0, 1, 2}
    memset(count, 0, sizeof(count));
    for (long k = 0; k < N; k++)
        count[sample(lg, 6, (tm_sample_params){.temperature = 1.0f, .min_p = 0.1f, .seed = 3},
                     k)]++;
    TM_CHECK(count[3] == 0 && count[4] == 0 && count[5] == 0);
    TM_CHECK_MSG(chi2(count, p3, 6, N) < 18.4, "min_p chi2");
    // combined: top_k 5, top_p 0.95 (on the top-5 renormalised: 0.64, 0.87, 0.96 -> {0,1,2}),
    // min_p 0.2 (logit >= 3 - ln 5 = 1.39 -> {0, 1})
    for (long k = 0; k < 2000; k++) {
        tm_sample_params p = {.temperature = 1.0f, .top_k = 5, .top_p = 0.95f, .min_p = 0.2f};
        TM_CHECK(sample(lg, 6, p, k) <= 1);
        p.min_p = 0.0f;
        TM_CHECK(sample(lg, 6, p, k) <= 2);
    }
}

static void test_determinism(void) {
    enum { N = 5000 };
    float *lg = malloc(N * sizeof(float));
    uint64_t s = 9;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        lg[i] = (float)((double)(s >> 11) * 0x1p-53 * 8.0);
    }
    int n_diff_seed = 0;
    for (uint64_t st = 0; st < 100; st++) {
        tm_sample_params p = {.temperature = 0.9f, .top_k = 50, .seed = 1234};
        uint32_t a = sample(lg, N, p, st);
        // other draws in between must not matter (no hidden stream state)
        p.seed = 99;
        uint32_t other = sample(lg, N, p, st);
        p.seed = 1234;
        TM_CHECK(sample(lg, N, p, st) == a);
        n_diff_seed += other != a;
        TM_CHECK(tm_sample_uniform(1234, st) == tm_sample_uniform(1234, st));
        TM_CHECK(tm_sample_uniform(1234, st) >= 0.0 && tm_sample_uniform(1234, st) < 1.0);
    }
    TM_CHECK(n_diff_seed > 50);
    free(lg);
}

static void test_bad_logits(void) {
    float lg[4] = {0.0f, 1.0f, NAN, 2.0f};
    tm_err err = {0};
    uint32_t tok;
    tm_sample_params p = {.temperature = 1.0f};
    TM_CHECK(tm_sample_token(lg, 4, &p, 0, &g_s, &tok, &err) == TM_E_INVAL);
    p.temperature = 0.0f;
    TM_CHECK(tm_sample_token(lg, 4, &p, 0, &g_s, &tok, &err) == TM_E_INVAL);
    lg[2] = INFINITY;
    TM_CHECK(tm_sample_token(lg, 4, &p, 0, &g_s, &tok, &err) == TM_E_INVAL);
    lg[2] = -INFINITY;
    TM_CHECK(tm_sample_token(lg, 4, &p, 0, &g_s, &tok, &err) == TM_E_INVAL);
    lg[2] = 0.0f;
    TM_CHECK(tm_sample_token(lg, g_s.n_vocab + 1, &p, 0, &g_s, &tok, &err) == TM_E_INVAL);
}

/* The top-p threshold shortcut on a big vocab (flat and peaked) against an exact nucleus found by
 * a full sort: the sampled token is always inside the exact nucleus, and every nucleus member is
 * reachable (distribution over many steps lands only inside). */
static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_top_p_large_vocab(void) {
    const uint32_t N = 32768;
    float *lg = malloc(N * sizeof(float)), *sorted = malloc(N * sizeof(float));
    for (int shape = 0; shape < 3; shape++) {
        uint64_t s = 100 + (uint64_t)shape;
        for (uint32_t i = 0; i < N; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(s >> 11) * 0x1p-53;
            // 0: nearly flat, 1: peaked (a few large logits), 2: heavy tail
            lg[i] = shape == 0   ? (float)(u * 0.5)
                    : shape == 1 ? (float)(u * 20.0)
                                 : (float)(-log(u + 1e-12));
        }
        const float top_p = 0.9f;
        // exact nucleus threshold: the smallest logit inside the nucleus
        double mx = -1e30, sum = 0.0;
        for (uint32_t i = 0; i < N; i++)
            mx = fmax(mx, lg[i]);
        for (uint32_t i = 0; i < N; i++)
            sum += exp(lg[i] - mx);
        memcpy(sorted, lg, N * sizeof(float));
        qsort(sorted, N, sizeof(float), cmp_desc);
        double cum = 0.0;
        float cut = sorted[0];
        uint32_t n_nuc = 0;
        for (uint32_t i = 0; i < N; i++) {
            cum += exp(sorted[i] - mx);
            cut = sorted[i];
            n_nuc++;
            if (cum >= top_p * sum)
                break;
        }
        uint32_t outside = 0;
        for (uint64_t st = 0; st < 300; st++) {
            uint32_t t = sample(
                lg, N, (tm_sample_params){.temperature = 1.0f, .top_p = top_p, .seed = 7}, st);
            outside += lg[t] < cut;
        }
        TM_CHECK_MSG(outside == 0, "shape %d: %u draws outside the nucleus of %u", shape, outside,
                     n_nuc);
    }
    free(lg);
    free(sorted);
}

int main(void) {
    tm_err err = {0};
    TM_CHECK_OK(tm_sample_scratch_init(&g_s, 40000, &err), &err);
    TM_RUN(test_greedy_ties);
    TM_RUN(test_top_k1_equals_greedy_random);
    TM_RUN(test_distribution);
    TM_RUN(test_top_k_top_p_min_p);
    TM_RUN(test_determinism);
    TM_RUN(test_bad_logits);
    TM_RUN(test_top_p_large_vocab);
    tm_sample_scratch_fini(&g_s);
    tm_sample_scratch_fini(&g_s); // twice is harmless
    return tm_test_report();
}
