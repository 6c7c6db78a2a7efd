/* runner/guided/guide.c - the vocabulary trie and the per-state token masks (guided.h).
 *
 * The trie is stored in preorder: node i has its byte, its depth and skip[i], the first node
 * after its subtree, and the token ids whose bytes end there. A mask is one linear pass over the
 * nodes keeping the DFA state of each depth on a stack: a node whose byte leads to the dead state
 * is skipped with its whole subtree. The cost is the number of trie nodes visited, at most the
 * trie's size (~ the vocabulary's total bytes).
 *
 * Masks are cached per class of states that no token can tell apart: a mask depends only on
 * which byte strings of at most max_depth bytes (the longest token) keep the DFA alive from the
 * state, and on whether it accepts (EOS). tm_guide_create refines the partition {dead} /
 * {live, accepting} / {live, not accepting} max_depth times by the classes of each state's
 * successors (Moore's algorithm, stopped at that depth or when stable): states in one class then
 * have equal masks. A free string of maxLength N is ~31 N states but only ~31 max_depth classes
 * (positions more than a token from the end look alike), so its masks are computed once per class,
 * not once per position. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/guided/guided.h"

#define MAX_TOKEN_BYTES 4096 /* longer tokens are never allowed (none exist in practice) */

struct tm_guide_vocab {
    uint32_t n_vocab, n_words;
    uint32_t n_node;  /* node 0 is the root */
    uint8_t *byte;    /* [n_node] */
    uint16_t *depth;  /* [n_node] root 0 */
    uint32_t *skip;   /* [n_node] */
    uint32_t *tok_lo; /* [n_node + 1] the node's ids are ids[tok_lo[i], tok_lo[i + 1]) */
    uint32_t *ids;    /* token ids in byte order */
    uint32_t *eos;    /* [n_eos] */
    uint32_t n_eos;
    uint32_t max_depth;
};

struct tm_guide {
    tm_dfa *dfa;
    const tm_guide_vocab *v;
    uint32_t *cls;          /* [n_states] the state's mask class (0: the dead state) */
    uint32_t n_cls;         /* classes */
    uint32_t **mask;        /* [n_cls] NULL until computed */
    uint32_t n_cached, cap; /* cap: masks cached at most (TM_GUIDE_MASK_CACHE_BYTES) */
};

// Work bound of the refinement (transition runs x rounds); past it each state is its own class.
#define REFINE_MAX_WORK (1ull << 30)

// The run-length form of a DFA's rows: state q's row is runs [off[q], off[q + 1]) of (first byte
// class, target), adjacent classes with one target merged (a row has a handful, not n_class).
typedef struct rows_rl {
    uint32_t *off, *lo, *tgt;
} rows_rl;

// q's row with every target replaced by its class, adjacent equal runs merged, into out (pairs
// lo, class); returns the pairs written.
static uint32_t merged_row(const rows_rl *r, const uint32_t *cls, uint32_t q, uint32_t *out) {
    uint32_t n = 0;
    for (uint32_t k = r->off[q]; k < r->off[q + 1]; k++) {
        const uint32_t c = cls[r->tgt[k]];
        if (n && out[2 * n - 1] == c)
            continue;
        out[2 * n] = r->lo[k], out[2 * n + 1] = c, n++;
    }
    return n;
}

// Mask classes of d's states into cls (see the top): returns their count, 0 on allocation failure.
static uint32_t mask_classes(const tm_dfa *d, uint32_t depth, uint32_t *cls) {
    const uint32_t n = tm_dfa_n_states(d);
    const tm_dfa_table_view t = tm_dfa_table(d);
    rows_rl r = {.off = tm_malloc(((size_t)n + 1) * sizeof(uint32_t))};
    size_t n_run = 0;
    for (uint32_t q = 0; r.off && q < n; q++) // count the runs
        for (uint32_t c = 0; c < t.n_class; c++)
            n_run += c == 0 ||
                     t.next[(size_t)q * t.n_class + c] != t.next[(size_t)q * t.n_class + c - 1];
    uint32_t nh = 16;
    while (nh < 2 * n)
        nh *= 2;
    r.lo = tm_malloc((n_run ? n_run : 1) * sizeof(uint32_t));
    r.tgt = tm_malloc((n_run ? n_run : 1) * sizeof(uint32_t));
    uint32_t *nc = tm_malloc((size_t)n * sizeof(*nc));
    uint32_t *rep = tm_malloc((size_t)n * sizeof(*rep)); // a state of each new class
    uint32_t *hash = tm_malloc((size_t)nh * sizeof(*hash));
    uint32_t *bq = tm_malloc((size_t)4 * t.n_class * sizeof(uint32_t)), *br = bq + 2 * t.n_class;
    uint32_t n_cls = 0;
    if (!r.off || !r.lo || !r.tgt || !nc || !rep || !hash || !bq)
        goto out;
    n_run = 0;
    for (uint32_t q = 0; q < n; q++) {
        r.off[q] = (uint32_t)n_run;
        for (uint32_t c = 0; c < t.n_class; c++) {
            const uint32_t x = t.next[(size_t)q * t.n_class + c];
            if (c == 0 || x != t.next[(size_t)q * t.n_class + c - 1])
                r.lo[n_run] = c, r.tgt[n_run++] = x;
        }
    }
    r.off[n] = (uint32_t)n_run;
    for (uint32_t q = 0; q < n; q++)
        cls[q] = q == 0 ? 0 : 1 + (uint32_t)tm_dfa_accepts(d, q);
    n_cls = 3;
    if ((uint64_t)n_run * depth > REFINE_MAX_WORK)
        depth = 0; // too large to refine: classes by acceptance only would be wrong, see below
    for (uint32_t round = 0; round < depth; round++) {
        memset(hash, 0xff, (size_t)nh * sizeof(*hash));
        uint32_t m = 0;
        for (uint32_t q = 0; q < n; q++) {
            const uint32_t nq = merged_row(&r, cls, q, bq);
            uint64_t h = (cls[q] + 1) * 0x9e3779b97f4a7c15ull;
            for (uint32_t k = 0; k < 2 * nq; k++)
                h = (h ^ bq[k]) * 0x100000001b3ull;
            for (uint32_t k = (uint32_t)(h ^ (h >> 32)) & (nh - 1);; k = (k + 1) & (nh - 1)) {
                if (hash[k] == UINT32_MAX) { // a new class, q its representative
                    hash[k] = m, rep[m] = q, nc[q] = m++;
                    break;
                }
                const uint32_t p = rep[hash[k]];
                if (cls[p] == cls[q] && merged_row(&r, cls, p, br) == nq &&
                    memcmp(bq, br, (size_t)2 * nq * sizeof(uint32_t)) == 0) {
                    nc[q] = hash[k]; // same class, same successors' classes on the same bytes
                    break;
                }
            }
        }
        memcpy(cls, nc, (size_t)n * sizeof(*cls));
        const int stable = m == n_cls;
        n_cls = m;
        if (stable)
            break;
    }
    if (depth == 0 && n > 3) { // not refined: one class per state (always exact)
        for (uint32_t q = 0; q < n; q++)
            cls[q] = q;
        n_cls = n;
    }
out:
    tm_free(r.off), tm_free(r.lo), tm_free(r.tgt);
    tm_free(nc), tm_free(rep), tm_free(hash), tm_free(bq);
    return n_cls;
}

// Order of token ids by their pieces (bytes, then length, then id: a total order).
static int piece_before(const char *const *piece, const size_t *len, uint32_t x, uint32_t y) {
    size_t nx = len[x], ny = len[y], n = nx < ny ? nx : ny;
    int c = n ? memcmp(piece[x], piece[y], n) : 0;
    if (c)
        return c < 0;
    if (nx != ny)
        return nx < ny;
    return x < y;
}

// Sort ids[0, n) by piece_before: bottom-up merge sort through tmp (qsort has no context
// argument in C11, and the module keeps no global state).
static void sort_ids(uint32_t *ids, uint32_t *tmp, uint32_t n, const char *const *piece,
                     const size_t *len) {
    uint32_t *src = ids, *dst = tmp;
    for (uint32_t w = 1; w < n; w *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            uint32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            uint32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                dst[k++] = piece_before(piece, len, src[j], src[i]) ? src[j++] : src[i++];
            while (i < mid)
                dst[k++] = src[i++];
            while (j < hi)
                dst[k++] = src[j++];
        }
        uint32_t *t = src;
        src = dst, dst = t;
        if (w > UINT32_MAX / 2)
            break;
    }
    if (src != ids)
        memcpy(ids, src, (size_t)n * sizeof(uint32_t));
}

uint32_t tm_guide_vocab_n_words(const tm_guide_vocab *v) { return v->n_words; }

void tm_guide_vocab_destroy(tm_guide_vocab *v) {
    if (!v)
        return;
    tm_free(v->byte);
    tm_free(v->depth);
    tm_free(v->skip);
    tm_free(v->tok_lo);
    tm_free(v->ids);
    tm_free(v->eos);
    tm_free(v);
}

tm_rc tm_guide_vocab_create(const char *const *piece, const size_t *len, uint32_t n_vocab,
                            const uint32_t *eos, uint32_t n_eos, tm_guide_vocab **out,
                            tm_err *err) {
    *out = NULL;
    tm_guide_vocab *v = tm_calloc(1, sizeof(*v));
    uint32_t *order = tm_malloc((n_vocab ? n_vocab : 1) * sizeof(uint32_t));
    size_t *lens = tm_malloc((n_vocab ? n_vocab : 1) * sizeof(size_t));
    uint32_t *path = tm_malloc((MAX_TOKEN_BYTES + 1) * sizeof(uint32_t));
    uint32_t *end = tm_malloc((n_vocab ? n_vocab : 1) * sizeof(uint32_t));
    if (!v || !order || !lens || !path || !end)
        goto nomem;
    v->n_vocab = n_vocab;
    v->n_words = (n_vocab + 31) / 32;
    uint32_t n_tok = 0;
    size_t total = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        lens[i] = piece[i] && len[i] <= MAX_TOKEN_BYTES ? len[i] : 0;
        if (lens[i])
            order[n_tok++] = i, total += lens[i];
    }
    sort_ids(order, end, n_tok, piece, lens); // end[] is free until the trie is built
    size_t cap = total + 1;
    if (cap > UINT32_MAX / 2)
        goto nomem;
    v->byte = tm_malloc(cap);
    v->depth = tm_malloc(cap * sizeof(uint16_t));
    v->skip = tm_malloc(cap * sizeof(uint32_t));
    v->tok_lo = tm_malloc((cap + 1) * sizeof(uint32_t));
    v->ids = tm_malloc((n_tok ? n_tok : 1) * sizeof(uint32_t));
    v->eos = tm_malloc((n_eos ? n_eos : 1) * sizeof(uint32_t));
    if (!v->byte || !v->depth || !v->skip || !v->tok_lo || !v->ids || !v->eos)
        goto nomem;
    for (uint32_t i = 0; i < n_eos; i++)
        if (eos[i] < n_vocab)
            v->eos[v->n_eos++] = eos[i];
    // Build in preorder from the sorted pieces: path[d] is the open node at depth d.
    uint32_t n = 1, d_open = 0; // node 0: the root, open at depth 0
    v->byte[0] = 0, v->depth[0] = 0;
    path[0] = 0;
    const char *prev = NULL;
    size_t prev_len = 0;
    for (uint32_t k = 0; k < n_tok; k++) {
        uint32_t id = order[k];
        const unsigned char *p = (const unsigned char *)piece[id];
        size_t len_k = lens[id], lcp = 0;
        while (lcp < len_k && lcp < prev_len && (unsigned char)prev[lcp] == p[lcp])
            lcp++;
        while (d_open > lcp) // close the nodes below the common prefix
            v->skip[path[d_open--]] = n;
        for (size_t d = lcp; d < len_k; d++) {
            v->byte[n] = p[d];
            v->depth[n] = (uint16_t)(d + 1);
            path[++d_open] = n++;
        }
        // this token ends at path[len_k]: sorted order puts an equal piece right after, and a
        // piece before every longer one it prefixes
        end[k] = path[len_k];
        prev = (const char *)p, prev_len = len_k;
        if (len_k > v->max_depth)
            v->max_depth = (uint32_t)len_k;
    }
    while (d_open > 0)
        v->skip[path[d_open--]] = n;
    v->skip[0] = n;
    v->n_node = n;
    // tok_lo by a counting sort of the tokens on their end nodes
    uint32_t *cnt = tm_calloc((size_t)n + 1, sizeof(uint32_t));
    if (!cnt)
        goto nomem;
    for (uint32_t k = 0; k < n_tok; k++)
        cnt[end[k] + 1]++;
    for (uint32_t i = 0; i < n; i++)
        cnt[i + 1] += cnt[i];
    for (uint32_t i = 0; i <= n; i++)
        v->tok_lo[i] = cnt[i];
    for (uint32_t k = 0; k < n_tok; k++)
        v->ids[cnt[end[k]]++] = order[k];
    tm_free(cnt);
    tm_free(order);
    tm_free(lens);
    tm_free(path);
    tm_free(end);
    *out = v;
    return TM_OK;
nomem:
    tm_free(order);
    tm_free(lens);
    tm_free(path);
    tm_free(end);
    tm_guide_vocab_destroy(v);
    return TM_ERR(err, TM_E_NOMEM, "guided: vocabulary trie of %u tokens", n_vocab);
}

void tm_guide_vocab_mask(const tm_guide_vocab *v, const tm_dfa *d, uint32_t q, uint32_t *mask) {
    memset(mask, 0, (size_t)v->n_words * sizeof(uint32_t));
    if (q == 0)
        return;
    const tm_dfa_table_view next = tm_dfa_table(d);
    uint32_t st[MAX_TOKEN_BYTES + 1];
    st[0] = q;
    const uint32_t n = v->n_node;
    // hot loop: the trie in preorder, dead subtrees skipped
    for (uint32_t i = 1; i < n;) {
        uint32_t t = tm_dfa_next(&next, st[v->depth[i] - 1], v->byte[i]);
        if (!t) {
            i = v->skip[i];
            continue;
        }
        st[v->depth[i]] = t;
        for (uint32_t k = v->tok_lo[i]; k < v->tok_lo[i + 1]; k++)
            mask[v->ids[k] >> 5] |= 1u << (v->ids[k] & 31);
        i++;
    }
    if (tm_dfa_accepts(d, q))
        for (uint32_t k = 0; k < v->n_eos; k++)
            mask[v->eos[k] >> 5] |= 1u << (v->eos[k] & 31);
}

tm_rc tm_guide_create(tm_dfa *dfa, const tm_guide_vocab *v, tm_guide **out, tm_err *err) {
    *out = NULL;
    tm_guide *g = tm_calloc(1, sizeof(*g));
    if (g)
        g->cls = tm_malloc((size_t)tm_dfa_n_states(dfa) * sizeof(*g->cls));
    if (g && g->cls)
        g->n_cls = mask_classes(dfa, v->max_depth, g->cls);
    if (g && g->n_cls)
        g->mask = tm_calloc(g->n_cls, sizeof(*g->mask));
    if (!g || !g->mask) {
        if (g)
            tm_free(g->cls);
        tm_free(g);
        tm_dfa_destroy(dfa);
        return TM_ERR(err, TM_E_NOMEM, "guided: mask cache");
    }
    g->dfa = dfa, g->v = v;
    g->cap = (uint32_t)(TM_GUIDE_MASK_CACHE_BYTES / ((size_t)(v->n_words ? v->n_words : 1) * 4));
    *out = g;
    return TM_OK;
}

void tm_guide_destroy(tm_guide *g) {
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_cls; i++)
        tm_free(g->mask[i]);
    tm_free(g->mask);
    tm_free(g->cls);
    tm_dfa_destroy(g->dfa);
    tm_free(g);
}

const tm_dfa *tm_guide_dfa(const tm_guide *g) { return g->dfa; }
uint32_t tm_guide_n_cached(const tm_guide *g) { return g->n_cached; }
uint32_t tm_guide_n_classes(const tm_guide *g) { return g->n_cls; }
uint32_t tm_guide_state_class(const tm_guide *g, uint32_t q) { return g->cls[q]; }

int tm_guide_cache_full(const tm_guide *g) { return g->n_cached >= g->cap; }
void tm_guide_set_cache_cap(tm_guide *g, uint32_t n_masks) { g->cap = n_masks; }

const uint32_t *tm_guide_mask(tm_guide *g, uint32_t q, uint32_t *spare, int *cold, tm_err *err) {
    TM_ASSERT(q > 0 && q < tm_dfa_n_states(g->dfa));
    if (cold)
        *cold = 0;
    const uint32_t k = g->cls[q];
    if (g->mask[k])
        return g->mask[k];
    if (spare && tm_guide_cache_full(g)) {
        tm_guide_vocab_mask(g->v, g->dfa, q, spare);
        if (cold)
            *cold = 1;
        return spare;
    }
    uint32_t *m = tm_malloc((size_t)(g->v->n_words ? g->v->n_words : 1) * sizeof(uint32_t));
    if (!m) {
        TM_ERR(err, TM_E_NOMEM, "guided: token mask");
        return NULL;
    }
    tm_guide_vocab_mask(g->v, g->dfa, q, m);
    g->mask[k] = m;
    g->n_cached++;
    if (cold)
        *cold = 1;
    return m;
}
