/* runner/sched/sample.c - greedy and temperature/top-k/top-p/min-p sampling (see sample.h).
 *
 * Candidate order is always (logit descending, token id ascending), so ties resolve to the lowest
 * id everywhere (greedy, top_k = 1, the nucleus cut). Cost for a vocab of n: one O(n) scan; top_k
 * uses an O(n) partial selection and sorts only the k survivors; top_p without top_k sorts only
 * the tokens above a probability threshold whose mass already reaches top_p (the threshold is
 * lowered until it does, ending at a bound that is guaranteed to). The draw uses a counter-based
 * uniform from (seed, step), so nothing depends on batch composition or call order. */
#include "runner/sched/sample.h"

#include <math.h>

#include "base/alloc.h"
#include "base/hash.h"

#define SMALL_SORT 16
#define SORT_NUCLEUS_MAX 4096 /* larger nuclei are selected by mass, not sorted */

// splitmix64's output for state z. Sampled tokens depend on every bit of it: never change it.
static uint64_t mix64(uint64_t z) { return tm_hash_mix64(z + TM_HASH_GOLDEN64); }

double tm_sample_uniform(uint64_t seed, uint64_t step) {
    uint64_t r = mix64(seed ^ mix64(step ^ 0x5851f42d4c957f2dull));
    return (double)(r >> 11) * 0x1p-53;
}

uint64_t tm_sample_seed_of(uint64_t seed, uint32_t i) {
    return i == 0 ? seed : mix64(seed ^ mix64(0xd1b54a32d192ed03ull * i));
}

tm_rc tm_sample_logprobs(const float *logits, uint32_t n_vocab, uint32_t id, uint32_t k,
                         float *lp_id, uint32_t *top_ids, float *top_lp, uint32_t *argmax,
                         tm_err *err) {
    TM_ASSERT(n_vocab > 0 && k <= n_vocab);
    if (id >= n_vocab) // a prompt token the model's vocabulary does not have
        return TM_ERR(err, TM_E_INVAL, "logprobs: token %u is beyond the model's %u ids", id,
                      n_vocab);
    float mx = logits[0];
    uint32_t am = 0;
    uint32_t n_top = 0;
    // One pass: max, argmax and the k best (insertion into a sorted list of at most k; k <= 20).
    for (uint32_t i = 0; i < n_vocab; i++) { // hot loop: the whole vocabulary
        float x = logits[i];
        if (!isfinite(x))
            return TM_ERR(err, TM_E_INVAL, "logprobs: logit of token %u is not finite", i);
        if (x > mx)
            mx = x, am = i;
        if (k == 0 || (n_top == k && !(x > logits[top_ids[k - 1]])))
            continue;
        uint32_t j = n_top < k ? n_top++ : k - 1;
        while (j > 0 && x > logits[top_ids[j - 1]]) {
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_ids[j] = i;
    }
    double sum = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - (double)mx);
    double lse = (double)mx + log(sum);
    *lp_id = (float)((double)logits[id] - lse);
    for (uint32_t j = 0; j < k; j++)
        top_lp[j] = (float)((double)logits[top_ids[j]] - lse);
    *argmax = am;
    return TM_OK;
}

tm_rc tm_sample_scratch_init(tm_sample_scratch *s, uint32_t n_vocab, tm_err *err) {
    s->prob = tm_malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof(float));
    s->idx = tm_malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof(uint32_t));
    s->n_vocab = n_vocab;
    if (!s->prob || !s->idx) {
        tm_sample_scratch_fini(s);
        return TM_ERR(err, TM_E_NOMEM, "sample scratch for %u tokens", n_vocab);
    }
    return TM_OK;
}

void tm_sample_scratch_fini(tm_sample_scratch *s) {
    tm_free(s->prob);
    tm_free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
    s->n_vocab = 0;
}

/* ---- ordering of (value, id) pairs: value descending, id ascending ---- */

static inline int before(const float *v, const uint32_t *ix, size_t a, size_t b) {
    return v[a] > v[b] || (v[a] == v[b] && ix[a] < ix[b]);
}

static inline void swap2(float *v, uint32_t *ix, size_t a, size_t b) {
    float tv = v[a];
    v[a] = v[b];
    v[b] = tv;
    uint32_t ti = ix[a];
    ix[a] = ix[b];
    ix[b] = ti;
}

// Lomuto partition of [lo, hi] around the median of lo, mid, hi; returns the pivot's final slot.
static size_t partition(float *v, uint32_t *ix, size_t lo, size_t hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (before(v, ix, mid, lo))
        swap2(v, ix, mid, lo);
    if (before(v, ix, hi, lo))
        swap2(v, ix, hi, lo);
    if (before(v, ix, mid, hi))
        swap2(v, ix, mid, hi); // now hi holds the median
    size_t store = lo;
    for (size_t i = lo; i < hi; i++)
        if (before(v, ix, i, hi))
            swap2(v, ix, i, store++);
    swap2(v, ix, store, hi);
    return store;
}

static void insertion_sort(float *v, uint32_t *ix, size_t lo, size_t hi_excl) {
    for (size_t i = lo + 1; i < hi_excl; i++)
        for (size_t j = i; j > lo && before(v, ix, j, j - 1); j--)
            swap2(v, ix, j, j - 1);
}

static void sort_pairs(float *v, uint32_t *ix, size_t n) {
    size_t lo = 0, hi_excl = n;
    // Recurse into the smaller side, loop on the larger: O(log n) stack.
    while (hi_excl - lo > SMALL_SORT) {
        size_t p = partition(v, ix, lo, hi_excl - 1);
        if (p - lo < hi_excl - p - 1) {
            sort_pairs(v + lo, ix + lo, p - lo);
            lo = p + 1;
        } else {
            sort_pairs(v + p + 1, ix + p + 1, hi_excl - p - 1);
            hi_excl = p;
        }
    }
    insertion_sort(v, ix, lo, hi_excl);
}

// Rearrange so that [0, k) holds the k first pairs in order (in no particular order), 0 < k < n.
static void select_first(float *v, uint32_t *ix, size_t n, size_t k) {
    size_t lo = 0, hi = n - 1;
    while (lo < hi) {
        size_t p = partition(v, ix, lo, hi);
        if (p == k || p + 1 == k)
            return;
        if (p < k)
            lo = p + 1;
        else
            hi = p - 1;
    }
}

// Move pairs with v >= thr to the front (order not kept); returns how many.
static size_t split_at(float *v, uint32_t *ix, size_t n, float thr) {
    size_t store = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] >= thr)
            swap2(v, ix, i, store++);
    return store;
}

// The nucleus: rearrange so that [0, k) holds the smallest set of first pairs (value descending,
// id ascending) whose values sum to at least need, in no particular order; returns k. Quickselect
// by mass: partition, then keep only the side that holds the cut.
static size_t select_mass(float *v, uint32_t *ix, size_t n, double need) {
    size_t lo = 0, hi = n; // the cut lies in [lo, hi); everything before lo is kept
    while (hi - lo > 1) {
        size_t p = partition(v, ix, lo, hi - 1);
        double upper = 0.0;
        for (size_t i = lo; i < p; i++)
            upper += v[i];
        if (upper >= need) {
            hi = p; // the cut is among the pairs before the pivot
        } else if (upper + v[p] >= need) {
            return p + 1;
        } else {
            need -= upper + v[p];
            lo = p + 1;
        }
    }
    return hi;
}

int tm_sample_is_greedy(const tm_sample_params *p, uint32_t n_vocab) {
    return !(p->temperature > 0.0f) || p->top_k == 1 || n_vocab == 1;
}

tm_rc tm_sample_token(const float *logits, uint32_t n_vocab, const tm_sample_params *p,
                      uint64_t step, tm_sample_scratch *s, uint32_t *out, tm_err *err) {
    if (n_vocab == 0 || n_vocab > s->n_vocab)
        return TM_ERR(err, TM_E_INVAL, "sample: n_vocab %u (scratch for %u)", n_vocab, s->n_vocab);
    uint32_t arg = 0;
    float mx = logits[0];
    for (uint32_t i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (!isfinite(l))
            return TM_ERR(err, TM_E_INVAL, "sample: logit %u is %s", i, isnan(l) ? "NaN" : "inf");
        if (l > mx) {
            mx = l;
            arg = i;
        }
    }
    if (tm_sample_is_greedy(p, n_vocab)) {
        *out = arg;
        return TM_OK;
    }
    if (!isfinite(p->temperature) || isnan(p->top_p) || isnan(p->min_p))
        return TM_ERR(err, TM_E_INVAL, "sample: bad parameters (temperature %g top_p %g min_p %g)",
                      (double)p->temperature, (double)p->top_p, (double)p->min_p);

    float *v = s->prob;
    uint32_t *ix = s->idx;
    size_t n = n_vocab;
    int sorted = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = logits[i];
        ix[i] = (uint32_t)i;
    }
    if (p->top_k > 0 && (size_t)p->top_k < n) {
        select_first(v, ix, n, (size_t)p->top_k);
        n = (size_t)p->top_k;
        sort_pairs(v, ix, n);
        sorted = 1;
    }

    // Unnormalised probabilities relative to the best token (which is always kept: exp(0) = 1).
    const float inv_t = 1.0f / p->temperature;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        v[i] = expf((v[i] - mx) * inv_t);
        sum += v[i];
    }

    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        const double need = (double)p->top_p * sum;
        if (!sorted) {
            // Sort only the tokens above a threshold whose mass already reaches top_p. Below
            // thr_safe the excluded mass is < n * thr_safe <= (1 - top_p) * sum, so that one
            // always works; try much higher thresholds first.
            const float thr_safe = (float)((1.0 - (double)p->top_p) * sum / (double)n);
            float thr = 0x1p-6f;
            size_t m = n;
            for (;;) {
                if (thr <= thr_safe)
                    thr = thr_safe;
                m = split_at(v, ix, n, thr);
                double mass = 0.0;
                for (size_t i = 0; i < m; i++)
                    mass += v[i];
                if (mass >= need || thr == thr_safe)
                    break;
                thr *= 0x1p-6f;
            }
            if (m > SORT_NUCLEUS_MAX) {
                // A flat distribution (a random model, a high temperature): the nucleus holds
                // most of the vocabulary, and sorting it would dominate the step. Select it by
                // mass instead, in expected O(m); it stays in a fixed (unsorted) order.
                n = select_mass(v, ix, m, need);
                goto nucleus_done;
            }
            sort_pairs(v, ix, m);
            n = m; // the cut below stays inside the sorted prefix
            sorted = 1;
        }
        double cum = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; i++) {
            cum += v[i];
            if (cum >= need) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
nucleus_done:

    if (p->min_p > 0.0f) {
        const float thr = p->min_p; // p_max is 1 in these units
        if (sorted) {
            size_t keep = 1;
            while (keep < n && v[keep] >= thr)
                keep++;
            n = keep;
        } else {
            // Keep id order: deterministic and no sort needed.
            size_t w = 0;
            for (size_t i = 0; i < n; i++) {
                if (v[i] >= thr) {
                    v[w] = v[i];
                    ix[w] = ix[i];
                    w++;
                }
            }
            n = w; // the best token has v = 1 >= min_p for any min_p <= 1
            if (n == 0) {
                *out = arg;
                return TM_OK;
            }
        }
    }

    double total = 0.0;
    for (size_t i = 0; i < n; i++)
        total += v[i];
    const double u = tm_sample_uniform(p->seed, step) * total;
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += v[i];
        if (u < cum) {
            *out = ix[i];
            return TM_OK;
        }
    }
    *out = ix[n - 1]; // rounding: u landed on the very top of the total
    return TM_OK;
}
