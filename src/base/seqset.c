/* base/seqset.c - watermark + sorted array; binary search to insert, pop the front as the
 * watermark advances. */
#include "base/seqset.h"

#include <string.h>

#include "base/alloc.h"

void tm_seqset_fini(tm_seqset *s) {
    tm_free(s->above);
    memset(s, 0, sizeof(*s));
}

// Index of the first member of above[] >= v.
static size_t lower_bound(const tm_seqset *s, uint64_t v) {
    size_t lo = 0, hi = s->n_above;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->above[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool tm_seqset_has(const tm_seqset *s, uint64_t seq_no) {
    if (seq_no < s->watermark)
        return true;
    size_t i = lower_bound(s, seq_no);
    return i < s->n_above && s->above[i] == seq_no;
}

uint64_t tm_seqset_count(const tm_seqset *s) { return s->watermark + s->n_above; }

tm_rc tm_seqset_add(tm_seqset *s, uint64_t seq_no, tm_err *err) {
    if (seq_no < s->watermark)
        return TM_OK;
    if (seq_no == s->watermark) {
        // advance over the run of members that now touch the watermark
        s->watermark++;
        size_t k = 0;
        while (k < s->n_above && s->above[k] == s->watermark) {
            s->watermark++;
            k++;
        }
        if (k) {
            memmove(s->above, s->above + k, (s->n_above - k) * sizeof(*s->above));
            s->n_above -= k;
        }
        return TM_OK;
    }
    size_t i = lower_bound(s, seq_no);
    if (i < s->n_above && s->above[i] == seq_no)
        return TM_OK;
    if (s->n_above == s->cap_above) {
        size_t cap = s->cap_above ? s->cap_above * 2 : 64;
        uint64_t *p = tm_realloc(s->above, cap * sizeof(*p));
        if (!p)
            return TM_ERR(err, TM_E_NOMEM, "seq_no set of %zu", cap);
        s->above = p;
        s->cap_above = cap;
    }
    memmove(s->above + i + 1, s->above + i, (s->n_above - i) * sizeof(*s->above));
    s->above[i] = seq_no;
    s->n_above++;
    return TM_OK;
}

tm_rc tm_seqset_copy(tm_seqset *dst, const tm_seqset *src, tm_err *err) {
    uint64_t *p = NULL;
    if (src->n_above) {
        p = tm_malloc(src->n_above * sizeof(*p));
        if (!p)
            return TM_ERR(err, TM_E_NOMEM, "seq_no set of %zu", src->n_above);
        memcpy(p, src->above, src->n_above * sizeof(*p));
    }
    tm_free(dst->above);
    dst->watermark = src->watermark;
    dst->above = p;
    dst->n_above = dst->cap_above = src->n_above;
    return TM_OK;
}
