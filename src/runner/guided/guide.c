/* runner/guided/guide.c - the vocabulary trie and the per-state token masks (guided.h).
 *
 * The trie is stored in preorder: node i has its byte, its depth and skip[i], the first node
 * after its subtree, and the token ids whose bytes end there. A mask is one linear pass over the
 * nodes keeping the DFA state of each depth on a stack: a node whose byte leads to the dead state
 * is skipped with its whole subtree. The cost is the number of trie nodes visited, at most the
 * trie's size (~ the vocabulary's total bytes). Masks are cached per DFA state. */
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
    uint32_t **mask;        /* [n_states] NULL until computed */
    uint32_t n_cached, cap; /* cap: masks cached at most (TM_GUIDE_MASK_CACHE_BYTES) */
};

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
        g->mask = tm_calloc(tm_dfa_n_states(dfa), sizeof(*g->mask));
    if (!g || !g->mask) {
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
    for (uint32_t i = 0; i < tm_dfa_n_states(g->dfa); i++)
        tm_free(g->mask[i]);
    tm_free(g->mask);
    tm_dfa_destroy(g->dfa);
    tm_free(g);
}

const tm_dfa *tm_guide_dfa(const tm_guide *g) { return g->dfa; }
uint32_t tm_guide_n_cached(const tm_guide *g) { return g->n_cached; }

int tm_guide_cache_full(const tm_guide *g) { return g->n_cached >= g->cap; }
void tm_guide_set_cache_cap(tm_guide *g, uint32_t n_masks) { g->cap = n_masks; }

const uint32_t *tm_guide_mask(tm_guide *g, uint32_t q, uint32_t *spare, int *cold, tm_err *err) {
    TM_ASSERT(q > 0 && q < tm_dfa_n_states(g->dfa));
    if (cold)
        *cold = 0;
    if (g->mask[q])
        return g->mask[q];
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
    g->mask[q] = m;
    g->n_cached++;
    if (cold)
        *cold = 1;
    return m;
}
