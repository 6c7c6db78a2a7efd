/* runner/guided/cache.c - compiled constraints shared between records, the vocabulary trie, and
 * per-sequence automaton state (cache.h). Lookup is a linear scan: a job has a handful of
 * distinct constraints, and each is looked up once per record, not per token. */
#include "runner/guided/cache.h"

#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"

struct tm_guide_ent {
    uint32_t kind;
    char *spec;           /* owned */
    tm_dfa *dfa;          /* owned until the guide is made (at the first sequence start) */
    tm_guide *g;          /* owned; NULL until then */
    uint32_t n_ref;       /* records holding it */
    uint64_t last;        /* use stamp for eviction */
    tm_errcode fail_code; /* != NONE: the constraint does not compile (kept so that records
                           * repeating it are not compiled again); fail_msg says why */
    char *fail_msg;       /* owned */
};

struct tm_guide_cache {
    const tm_tokenizer *tok;
    uint32_t n_vocab;
    uint32_t eos[TM_GUIDE_CACHE_KEEP];
    uint32_t n_eos;
    tm_guide_vocab *v; /* NULL until the first sequence start */
    tm_guide_ent **ents;
    uint32_t n_ents, cap_ents;
    uint64_t clock;
    tm_guide_stats st;
};

tm_rc tm_guide_cache_create(const tm_tokenizer *tok, uint32_t n_vocab, const int32_t *eos,
                            uint32_t n_eos, tm_guide_cache **out, tm_err *err) {
    tm_guide_cache *c = tm_calloc(1, sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "guided: cache");
    c->tok = tok, c->n_vocab = n_vocab;
    for (uint32_t i = 0; i < n_eos && c->n_eos < TM_GUIDE_CACHE_KEEP; i++)
        if (eos[i] >= 0)
            c->eos[c->n_eos++] = (uint32_t)eos[i];
    *out = c;
    return TM_OK;
}

static void ent_free(tm_guide_ent *e) {
    if (!e)
        return;
    tm_free(e->spec);
    tm_free(e->fail_msg);
    tm_dfa_destroy(e->dfa);
    tm_guide_destroy(e->g);
    tm_free(e);
}

void tm_guide_cache_destroy(tm_guide_cache *c) {
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n_ents; i++)
        ent_free(c->ents[i]);
    tm_free(c->ents);
    tm_guide_vocab_destroy(c->v);
    tm_free(c);
}

const tm_guide_stats *tm_guide_cache_stats(const tm_guide_cache *c) { return &c->st; }

void tm_guide_ent_ref(tm_guide_ent *e) { e->n_ref++; }

// Evict the least recently used unreferenced entries beyond the keep limit.
static void trim(tm_guide_cache *c) {
    for (;;) {
        uint32_t n_free = 0, victim = UINT32_MAX;
        for (uint32_t i = 0; i < c->n_ents; i++)
            if (c->ents[i]->n_ref == 0) {
                n_free++;
                if (victim == UINT32_MAX || c->ents[i]->last < c->ents[victim]->last)
                    victim = i;
            }
        if (n_free <= TM_GUIDE_CACHE_KEEP)
            return;
        ent_free(c->ents[victim]);
        c->ents[victim] = c->ents[--c->n_ents];
    }
}

void tm_guide_cache_unref(tm_guide_cache *c, tm_guide_ent *e) {
    if (!e)
        return;
    TM_ASSERT(e->n_ref > 0);
    e->n_ref--;
    if (e->n_ref == 0)
        trim(c);
}

static const char *kind_name(uint32_t kind) {
    switch (kind) {
    case TM_GUIDE_KIND_JSON_SCHEMA:
        return "json_schema";
    case TM_GUIDE_KIND_JSON_OBJECT:
        return "json_object";
    case TM_GUIDE_KIND_REGEX:
        return "regex";
    case TM_GUIDE_KIND_CHOICE:
        return "choice";
    }
    return "?";
}

tm_rc tm_guide_cache_get(tm_guide_cache *c, uint32_t kind, const char *spec, tm_guide_ent **out,
                         tm_errcode *code, tm_err *err) {
    *out = NULL;
    if (!spec)
        spec = "";
    for (uint32_t i = 0; c && i < c->n_ents; i++) {
        tm_guide_ent *e = c->ents[i];
        if (e->kind == kind && strcmp(e->spec, spec) == 0) {
            e->last = ++c->clock;
            if (e->fail_code) {
                *code = e->fail_code;
                return TM_ERR(err, TM_E_RECORD, "%s", e->fail_msg);
            }
            e->n_ref++;
            *out = e;
            return TM_OK;
        }
    }
    double t0 = tm_now_ms();
    tm_dfa *d = NULL;
    tm_guide_why why = TM_GUIDE_WHY_NONE;
    tm_err cerr = {0};
    tm_rc rc = tm_dfa_compile((tm_guide_kind)kind, spec, strlen(spec), &d, &why, &cerr);
    if (c) {
        c->st.compile_s += (tm_now_ms() - t0) / 1e3;
        c->st.n_compiled++;
    }
    if (rc && rc != TM_E_INVAL) {
        *err = cerr;
        return rc;
    }
    tm_errcode fcode = TM_ERRCODE_NONE;
    if (rc == TM_E_INVAL) {
        fcode = why == TM_GUIDE_WHY_UNSUPPORTED ? TM_ERRCODE_UNSUPPORTED : TM_ERRCODE_INVALID_VALUE;
        TM_ERR(err, TM_E_RECORD, "structured output (%s): %s", kind_name(kind), cerr.msg);
        *code = fcode;
    }
    if (!c) {
        tm_dfa_destroy(d);
        return rc ? TM_E_RECORD : TM_OK;
    }
    tm_guide_ent *e = tm_calloc(1, sizeof(*e));
    char *copy = tm_strdup(spec);
    char *fmsg = fcode ? tm_strdup(err->msg) : NULL;
    if (!e || !copy || (fcode && !fmsg) ||
        (c->n_ents == c->cap_ents && c->cap_ents >= UINT32_MAX / 2)) {
        tm_free(e), tm_free(copy), tm_free(fmsg), tm_dfa_destroy(d);
        return TM_ERR(err, TM_E_NOMEM, "guided: cache entry");
    }
    if (c->n_ents == c->cap_ents) {
        uint32_t cap = c->cap_ents ? 2 * c->cap_ents : 8;
        tm_guide_ent **ne = tm_realloc(c->ents, cap * sizeof(*ne));
        if (!ne) {
            tm_free(e), tm_free(copy), tm_free(fmsg), tm_dfa_destroy(d);
            return TM_ERR(err, TM_E_NOMEM, "guided: cache entries");
        }
        c->ents = ne, c->cap_ents = cap;
    }
    *e = (tm_guide_ent){.kind = kind,
                        .spec = copy,
                        .dfa = d,
                        .n_ref = fcode ? 0 : 1,
                        .last = ++c->clock,
                        .fail_code = fcode,
                        .fail_msg = fmsg};
    c->ents[c->n_ents++] = e;
    if (fcode) {
        trim(c);
        return TM_E_RECORD;
    }
    *out = e;
    return TM_OK;
}

// The vocabulary trie: every id's decoded bytes, special tokens left out (they have no text).
static tm_rc make_vocab(tm_guide_cache *c, tm_err *err) {
    double t0 = tm_now_ms();
    const char **piece = tm_calloc(c->n_vocab ? c->n_vocab : 1, sizeof(*piece));
    size_t *len = tm_calloc(c->n_vocab ? c->n_vocab : 1, sizeof(*len));
    tm_rc rc = TM_OK;
    if (!piece || !len) {
        rc = TM_ERR(err, TM_E_NOMEM, "guided: vocabulary of %u tokens", c->n_vocab);
    } else {
        for (uint32_t i = 0; i < c->n_vocab; i++)
            if (!tm_tok_is_special(c->tok, i))
                piece[i] = tm_tok_piece(c->tok, i, &len[i]);
        rc = tm_guide_vocab_create(piece, len, c->n_vocab, c->eos, c->n_eos, &c->v, err);
    }
    tm_free(piece);
    tm_free(len);
    c->st.compile_s += (tm_now_ms() - t0) / 1e3;
    return rc;
}

static tm_rc lookup(tm_guide_cache *c, tm_guided_seq *s, tm_err *err) {
    double t0 = tm_now_ms();
    int cold = 0;
    tm_guide *g = s->ent->g;
    if (tm_guide_cache_full(g) && !s->own) { // a state past the cache goes to the sequence's own
        s->own = tm_malloc((size_t)tm_guide_vocab_n_words(c->v) * sizeof(uint32_t));
        if (!s->own)
            return TM_ERR(err, TM_E_NOMEM, "guided: token mask");
    }
    s->allow = tm_guide_mask(g, s->state, s->own, &cold, err);
    c->st.n_mask++;
    c->st.n_mask_cold += cold;
    c->st.mask_s += (tm_now_ms() - t0) / 1e3;
    return s->allow ? TM_OK : err->rc;
}

tm_rc tm_guided_start(tm_guide_cache *c, tm_guide_ent *ent, tm_guided_seq *s, tm_err *err) {
    tm_rc rc = TM_OK;
    if (!c->v)
        rc = make_vocab(c, err);
    if (rc == TM_OK && !ent->g) {
        rc = tm_guide_create(ent->dfa, c->v, &ent->g, err); // takes the DFA either way
        ent->dfa = NULL;
    }
    if (rc)
        return rc;
    ent->n_ref++;
    *s = (tm_guided_seq){.ent = ent, .state = tm_dfa_start(tm_guide_dfa(ent->g))};
    c->st.n_records++;
    return lookup(c, s, err);
}

int tm_guided_allows(const tm_guided_seq *s, uint32_t id) {
    return s->allow && ((s->allow[id >> 5] >> (id & 31)) & 1u);
}

tm_rc tm_guided_advance(tm_guide_cache *c, tm_guided_seq *s, uint32_t id, int *final, tm_err *err) {
    const tm_dfa *d = tm_guide_dfa(s->ent->g);
    size_t n = 0;
    const char *p = tm_tok_piece(c->tok, id, &n);
    s->state = tm_dfa_walk(d, s->state, p, p ? n : 0);
    TM_ASSERT(s->state != 0); // the mask allowed only tokens that keep the automaton alive
    *final = tm_dfa_is_final(d, s->state);
    if (*final) {
        s->allow = NULL;
        return TM_OK;
    }
    return lookup(c, s, err);
}

tm_rc tm_guided_draft(tm_guide_cache *c, const tm_guided_seq *s, const uint32_t *draft, uint32_t n,
                      const uint32_t **allow, uint32_t *n_ok, tm_err *err) {
    tm_guide *g = s->ent->g;
    const tm_dfa *d = tm_guide_dfa(g);
    uint32_t q = s->state;
    allow[0] = s->allow;
    *n_ok = 0;
    for (uint32_t k = 0; k < n && allow[k]; k++) {
        const uint32_t id = draft[k];
        if (id >= c->n_vocab || !((allow[k][id >> 5] >> (id & 31)) & 1u))
            return TM_OK; // not allowed here (end-of-sequence ids included: they have no piece)
        size_t len = 0;
        const char *p = tm_tok_piece(c->tok, id, &len);
        const uint32_t t = p ? tm_dfa_walk(d, q, p, len) : 0;
        if (t == 0 || tm_dfa_is_final(d, t) || tm_guide_cache_full(g))
            return TM_OK; // complete after it (nothing may follow), or no room for its mask
        int cold = 0;
        allow[k + 1] = tm_guide_mask(g, t, NULL, &cold, err);
        c->st.n_mask++;
        c->st.n_mask_cold += cold;
        if (!allow[k + 1])
            return err->rc;
        q = t;
        *n_ok = k + 1;
    }
    return TM_OK;
}

int tm_guided_accepts(const tm_guided_seq *s) {
    return s->ent && s->ent->g && tm_dfa_accepts(tm_guide_dfa(s->ent->g), s->state);
}

void tm_guided_end(tm_guide_cache *c, tm_guided_seq *s, int unfinished) {
    if (!s->ent)
        return;
    if (unfinished && !tm_guided_accepts(s))
        c->st.n_unfinished++;
    tm_guide_cache_unref(c, s->ent);
    tm_free(s->own);
    *s = (tm_guided_seq){0};
}
