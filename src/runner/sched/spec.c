/* runner/sched/spec.c - n-gram drafting and the adaptive rule (see runner/sched/spec.h). One
 * backward scan over the candidate end positions, most recent first, so that among matches of the
 * same length the most recent wins. */
#include "runner/sched/spec.h"

#include "base/err.h"

uint32_t tm_spec_ngram_propose(const uint32_t *toks, size_t n, uint32_t lookup_min,
                               uint32_t lookup_max, uint32_t k, uint32_t *out) {
    TM_ASSERT(lookup_min >= 1 && lookup_min <= lookup_max && k <= TM_SPEC_MAX_K);
    if (k == 0 || n < (size_t)lookup_min + 1)
        return 0;
    size_t best_end = 0; // an occurrence of the n-gram ends at toks[best_end - 1]
    uint32_t best_len = 0;
    // Candidate occurrences end at e - 1 for e < n (the suffix itself ends at n - 1).
    for (size_t e = n - 1; e >= lookup_min && best_len < lookup_max; e--) {
        uint32_t m = 0;
        while (m < lookup_max && m < e && toks[e - 1 - m] == toks[n - 1 - m])
            m++;
        if (m >= lookup_min && m > best_len)
            best_len = m, best_end = e;
    }
    if (best_len == 0)
        return 0;
    uint32_t got = 0;
    for (size_t i = best_end; i < n && got < k; i++)
        out[got++] = toks[i];
    return got;
}

int tm_spec_may_draft(tm_spec_state *st) {
    if (st->pause == 0)
        return 1;
    st->pause--;
    return 0;
}

float tm_spec_gain(const tm_spec_state *st) { return st->has_gain ? st->gain : TM_SPEC_GAIN0; }

void tm_spec_gated(tm_spec_state *st) {
    st->gain = tm_spec_gain(st) + TM_SPEC_GAIN_DRIFT * (TM_SPEC_GAIN0 - tm_spec_gain(st));
    st->has_gain = 1;
}

int tm_spec_gate_open(double gain, uint32_t n_running, double t_spec_s, double t_plain_s) {
    if (n_running < 2 || t_spec_s <= 0 || t_plain_s <= 0)
        return 1;
    return gain >= n_running * (t_spec_s / t_plain_s - 1.0);
}

void tm_spec_verified(tm_spec_state *st, uint32_t n_draft, uint32_t n_acc) {
    if (n_draft == 0)
        return;
    st->gain = tm_spec_gain(st) + TM_SPEC_GAIN_ALPHA * ((float)n_acc - tm_spec_gain(st));
    st->has_gain = 1;
    if (n_acc > 0) {
        st->miss = st->pause = st->next = 0;
        return;
    }
    if (++st->miss < TM_SPEC_MISS_LIMIT)
        return;
    st->miss = 0;
    st->pause = st->next ? st->next : TM_SPEC_PAUSE0;
    st->next = st->pause * 2 > TM_SPEC_PAUSE_MAX ? TM_SPEC_PAUSE_MAX : st->pause * 2;
}
