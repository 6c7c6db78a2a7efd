/* runner/sched/sample.c - logits processing, greedy and temperature/top-k/top-p/min-p sampling
 * (see sample.h; the definition is docs/sampling.md).
 *
 * Canonical order: the kept set is defined by a cut in the order (processed logit descending,
 * token id ascending) plus the min-p weight threshold, and the draw walks the kept set in id
 * order with one uniform from (seed, step). The CUDA sampler (kernels/sample.cu) finds the same
 * cut by radix selects, walks the same order, so both draw the same token up to float rounding of
 * the sums and of expf. Finding the cut here: top_k uses an O(n) partial selection; top_p sorts
 * only the tokens above a weight threshold whose mass already reaches top_p (the threshold is
 * lowered until it does), or selects the nucleus by mass when it is large; the cut's level is
 * then recomputed as the device computes it (mass strictly above it, then ties by id). */
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
    const size_t n = n_vocab ? n_vocab : 1;
    s->prob = tm_malloc(n * sizeof(float));
    s->idx = tm_malloc(n * sizeof(uint32_t));
    s->l = tm_malloc(n * sizeof(float));
    s->w = tm_malloc(n * sizeof(float));
    s->cnt = tm_calloc(n, sizeof(uint32_t));
    s->n_vocab = n_vocab;
    if (!s->prob || !s->idx || !s->l || !s->w || !s->cnt) {
        tm_sample_scratch_fini(s);
        return TM_ERR(err, TM_E_NOMEM, "sample scratch for %u tokens", n_vocab);
    }
    return TM_OK;
}

void tm_sample_scratch_fini(tm_sample_scratch *s) {
    tm_free(s->prob);
    tm_free(s->idx);
    tm_free(s->l);
    tm_free(s->w);
    tm_free(s->cnt);
    *s = (tm_sample_scratch){0};
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

// Move the pairs whose weight w[id] >= thr to the front (order not kept); returns how many.
static size_t split_at(float *v, uint32_t *ix, const float *w, size_t n, float thr) {
    size_t store = 0;
    for (size_t i = 0; i < n; i++)
        if (w[ix[i]] >= thr)
            swap2(v, ix, i, store++);
    return store;
}

// The nucleus: rearrange so that [0, k) holds the smallest set of first pairs (value descending,
// id ascending) whose weights w[id] sum to at least need, in no particular order; returns k.
// Quickselect by mass: partition, then keep only the side that holds the cut.
static size_t select_mass(float *v, uint32_t *ix, const float *w, size_t n, double need) {
    size_t lo = 0, hi = n; // the cut lies in [lo, hi); everything before lo is kept
    while (hi - lo > 1) {
        size_t p = partition(v, ix, lo, hi - 1);
        double upper = 0.0;
        for (size_t i = lo; i < p; i++)
            upper += w[ix[i]];
        if (upper >= need) {
            hi = p; // the cut is among the pairs before the pivot
        } else if (upper + w[ix[p]] >= need) {
            return p + 1;
        } else {
            need -= upper + w[ix[p]];
            lo = p + 1;
        }
    }
    return hi;
}

// The slot of the last pair (in the order) among [0, n), n >= 1.
static size_t last_of(const float *v, const uint32_t *ix, size_t n) {
    size_t j0 = 0;
    for (size_t j = 1; j < n; j++)
        if (before(v, ix, j0, j))
            j0 = j;
    return j0;
}

int tm_sample_is_greedy(const tm_sample_params *p, uint32_t n_vocab) {
    return !(p->temperature > 0.0f) || p->top_k == 1 || n_vocab == 1;
}

int tm_sample_has_proc(const tm_sample_params *p) {
    const int rep = p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f;
    const int pen = rep || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    return (pen && p->n_hist > 0) || p->n_bias > 0 || p->n_mask > 0 || p->allow != NULL;
}

tm_rc tm_sample_process(const float *logits, uint32_t n_vocab, const tm_sample_params *p,
                        tm_sample_scratch *s, float *out, tm_err *err) {
    if (n_vocab > s->n_vocab)
        return TM_ERR(err, TM_E_INVAL, "sample: n_vocab %u (scratch for %u)", n_vocab, s->n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++)
        out[i] = logits[i];
    // 1. logit_bias
    for (uint32_t j = 0; j < p->n_bias; j++) {
        if (p->bias_ids[j] >= n_vocab)
            return TM_ERR(err, TM_E_INVAL, "logit_bias: token %u is beyond the model's %u ids",
                          p->bias_ids[j], n_vocab);
        out[p->bias_ids[j]] = out[p->bias_ids[j]] + p->bias[j];
    }
    // 2. penalties over the history, once per distinct id. cnt[id]: bit 31 = seen (prompt or
    // output), bits 0-30 = count in the output. Ids beyond n_vocab have no logit: skipped.
    const float rp = p->repetition_penalty, fp = p->frequency_penalty, pp = p->presence_penalty;
    const int rep = rp > 0.0f && rp != 1.0f;
    if (rep || fp != 0.0f || pp != 0.0f) {
        uint32_t *cnt = s->cnt;
        for (uint32_t j = 0; j < p->n_hist; j++) {
            uint32_t id = p->hist[j];
            if (id < n_vocab)
                cnt[id] = (cnt[id] | 0x80000000u) + (j >= p->n_hist_prompt);
        }
        for (uint32_t j = 0; j < p->n_hist; j++) {
            uint32_t id = p->hist[j];
            if (id >= n_vocab || cnt[id] == 0)
                continue;
            const uint32_t n_out = cnt[id] & 0x7fffffffu;
            cnt[id] = 0; // the first occurrence applies the penalty, and leaves cnt all 0
            float x = out[id];
            if (rep)
                x = x > 0.0f ? x / rp : x * rp;
            if (n_out) {
                x = x - fp * (float)n_out; // two roundings (no FMA: ISO C, docs/sampling.md)
                x = x - pp;
            }
            out[id] = x;
        }
    }
    // 3. the mask (min_tokens: EOS and stop_token_ids)
    for (uint32_t j = 0; j < p->n_mask; j++) {
        if (p->mask_ids[j] >= n_vocab)
            continue; // an EOS id the tokenizer cannot decode is never picked anyway
        out[p->mask_ids[j]] = -INFINITY;
    }
    // 4. the allowed ids (structured output): a disallowed id is masked like the ids above
    if (p->allow)
        for (uint32_t i = 0; i < n_vocab; i++)
            if (!((p->allow[i >> 5] >> (i & 31)) & 1u))
                out[i] = -INFINITY;
    return TM_OK;
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
    const float *l = logits;
    if (tm_sample_has_proc(p)) {
        tm_rc rc = tm_sample_process(logits, n_vocab, p, s, s->l, err);
        if (rc)
            return rc;
        l = s->l;
        arg = 0;
        mx = l[0];
        for (uint32_t i = 0; i < n_vocab; i++) {
            if (isnan(l[i]) || l[i] == INFINITY)
                return TM_ERR(err, TM_E_INVAL, "sample: processed logit %u is not finite", i);
            if (l[i] > mx) {
                mx = l[i];
                arg = i;
            }
        }
        if (mx == -INFINITY)
            return TM_ERR(err, TM_E_INVAL, "sample: every token is masked (min_tokens)");
    }
    if (tm_sample_is_greedy(p, n_vocab)) {
        *out = arg;
        return TM_OK;
    }
    if (!isfinite(p->temperature) || isnan(p->top_p) || isnan(p->min_p))
        return TM_ERR(err, TM_E_INVAL, "sample: bad parameters (temperature %g top_p %g min_p %g)",
                      (double)p->temperature, (double)p->top_p, (double)p->min_p);

    float *v = s->prob, *w = s->w;
    uint32_t *ix = s->idx;
    const size_t n = n_vocab;
    // The cut: id i is kept iff !has_cut, or l[i] > cut_l, or l[i] == cut_l and i <= cut_id.
    int has_cut = 0;
    float cut_l = 0.0f;
    uint32_t cut_id = 0;
    if (p->top_k > 0 && (size_t)p->top_k < n) {
        for (size_t i = 0; i < n; i++) {
            v[i] = l[i];
            ix[i] = (uint32_t)i;
        }
        const size_t k = (size_t)p->top_k;
        select_first(v, ix, n, k);
        const size_t j = last_of(v, ix, k); // the k-th in the order
        has_cut = 1, cut_l = v[j], cut_id = ix[j];
    }
    // Weights relative to the best token (which is always kept: exp(0) = 1), by id.
    const float inv_t = 1.0f / p->temperature;
    double sum = 0.0;
    size_t m0 = 0;
    for (size_t i = 0; i < n; i++) {
        const int kept = !has_cut || l[i] > cut_l || (l[i] == cut_l && i <= cut_id);
        w[i] = kept ? expf((l[i] - mx) * inv_t) : 0.0f;
        sum += w[i];
        if (w[i] > 0.0f) {
            v[m0] = l[i];
            ix[m0++] = (uint32_t)i;
        }
    }

    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        const double need = (double)p->top_p * sum;
        // Find an element c of the cut's level: sort only the pairs above a weight threshold
        // whose mass already reaches top_p. Below thr_safe the excluded mass is < m0 * thr_safe
        // <= (1 - top_p) * sum, so that one always works; try much higher thresholds first.
        const float thr_safe = (float)((1.0 - (double)p->top_p) * sum / (double)m0);
        float thr = 0x1p-6f;
        size_t m = m0, c = 0;
        for (;;) {
            if (thr <= thr_safe)
                thr = thr_safe;
            m = split_at(v, ix, w, m0, thr);
            double mass = 0.0;
            for (size_t i = 0; i < m; i++)
                mass += w[ix[i]];
            if (mass >= need || thr == thr_safe)
                break;
            thr *= 0x1p-6f;
        }
        if (m > SORT_NUCLEUS_MAX) {
            // A flat distribution (a random model, a high temperature): select the nucleus by
            // mass in expected O(m) instead of sorting it, then take its last pair.
            const size_t k = select_mass(v, ix, w, m, need);
            c = last_of(v, ix, k);
        } else {
            sort_pairs(v, ix, m);
            double cum = 0.0;
            c = m - 1;
            for (size_t i = 0; i < m; i++) {
                cum += w[ix[i]];
                if (cum >= need) {
                    c = i;
                    break;
                }
            }
        }
        // The level L = l of c: the mass strictly above it, then its tokens in id order, each
        // kept while the mass before it is below need (as the device computes it).
        const float L = v[c], wL = w[ix[c]];
        double g = 0.0;
        uint32_t n_lvl = 0;
        for (size_t i = 0; i < n; i++) {
            if (!(w[i] > 0.0f))
                continue;
            if (l[i] > L)
                g += w[i];
            else if (l[i] == L)
                n_lvl++;
        }
        uint32_t keep_lvl = 1;
        while (keep_lvl < n_lvl && g + (double)keep_lvl * (double)wL < need)
            keep_lvl++;
        for (size_t i = 0; i < n; i++)
            if (w[i] > 0.0f && l[i] == L && --keep_lvl == 0) {
                cut_id = (uint32_t)i;
                break;
            }
        has_cut = 1, cut_l = L;
    }

    // The draw: one uniform, the kept set walked in id order.
    const float min_p = p->min_p > 0.0f ? p->min_p : 0.0f;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        const int kept = w[i] > 0.0f && w[i] >= min_p &&
                         (!has_cut || l[i] > cut_l || (l[i] == cut_l && i <= cut_id));
        if (!kept)
            w[i] = 0.0f;
        total += w[i];
    }
    const double u = tm_sample_uniform(p->seed, step) * total;
    double cum = 0.0;
    uint32_t last = arg;
    for (size_t i = 0; i < n; i++) { // hot loop: the whole vocabulary
        if (w[i] == 0.0f)
            continue;
        cum += w[i];
        last = (uint32_t)i;
        if (u < cum) {
            *out = (uint32_t)i;
            return TM_OK;
        }
    }
    *out = last; // rounding: u landed on the very top of the total
    return TM_OK;
}
