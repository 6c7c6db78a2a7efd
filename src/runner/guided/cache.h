/* runner/guided/cache.h - the runner's side of structured output: compiled constraints shared by
 * the records that ask for the same one (a batch usually repeats one schema, so its DFA and its
 * masks are made once), the vocabulary trie of the tokenizer (built at the first constrained
 * record), and the per-sequence automaton state that advances by each accepted token's bytes.
 * Entries are refcounted by the records holding them (window entries and running sequences);
 * unreferenced ones are kept for later records, up to TM_GUIDE_CACHE_KEEP of them. Runner thread
 * only. */
#ifndef TM_RUNNER_GUIDED_CACHE_H
#define TM_RUNNER_GUIDED_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/record.h"
#include "runner/guided/guided.h"
#include "runner/text/tokenizer.h"

#define TM_GUIDE_CACHE_KEEP 32 /* unreferenced compiled constraints kept for reuse */

typedef struct tm_guide_cache tm_guide_cache;
typedef struct tm_guide_ent tm_guide_ent; /* one compiled constraint */

/* The automaton of one sequence. Zeroed: not constrained. */
typedef struct tm_guided_seq {
    tm_guide_ent *ent;     /* a reference, or NULL */
    uint32_t state;        /* DFA state after the tokens accepted so far */
    const uint32_t *allow; /* the mask of state (valid while ent is held) */
    uint32_t *own;         /* owned: the mask when the guide's cache is full (else NULL) */
} tm_guided_seq;

/* Counters (metrics.json "guided"). */
typedef struct tm_guide_stats {
    uint64_t n_records;    /* sequences that ran constrained */
    uint64_t n_compiled;   /* constraints compiled (cache misses; failures included) */
    uint64_t n_mask;       /* masks looked up (one per constrained generated token) */
    uint64_t n_mask_cold;  /* of them, computed (not in the cache) */
    double mask_s;         /* time in mask lookups and computation */
    double compile_s;      /* time compiling constraints and building the vocabulary trie */
    uint64_t n_unfinished; /* sequences that hit max_tokens / the context before acceptance */
} tm_guide_stats;

/* tok is borrowed (must outlive the cache); ids [0, n_vocab) are the ones sampling can pick; the
 * end-of-sequence ids eos[0, n_eos) are allowed where the automaton accepts. */
tm_rc tm_guide_cache_create(const tm_tokenizer *tok, uint32_t n_vocab, const int32_t *eos,
                            uint32_t n_eos, tm_guide_cache **out, tm_err *err);
void tm_guide_cache_destroy(tm_guide_cache *c); /* NULL is a no-op; entries must be unreferenced */
const tm_guide_stats *tm_guide_cache_stats(const tm_guide_cache *c);

/* The compiled constraint of a record's guided_kind and guided text, as a new reference in *out.
 * A constraint that cannot be compiled: TM_E_RECORD with *code (unsupported or invalid_value) and
 * err naming the keyword (the failure is cached too: a record repeating the constraint gets the
 * same answer without compiling). c NULL: compile only, to check (*out stays NULL). TM_E_NOMEM. */
tm_rc tm_guide_cache_get(tm_guide_cache *c, uint32_t kind, const char *spec, tm_guide_ent **out,
                         tm_errcode *code, tm_err *err);
void tm_guide_ent_ref(tm_guide_ent *e);
void tm_guide_cache_unref(tm_guide_cache *c, tm_guide_ent *e); /* NULL e is a no-op */

/* Start s on ent (takes a new reference): the start state and its mask. TM_E_NOMEM. */
tm_rc tm_guided_start(tm_guide_cache *c, tm_guide_ent *ent, tm_guided_seq *s, tm_err *err);
/* 1 when token id is allowed in s's current state. */
int tm_guided_allows(const tm_guided_seq *s, uint32_t id);
/* Advance s by token id's bytes (id must be allowed and not an end-of-sequence id) and look up
 * the next mask. *final: the output is complete and nothing may follow. TM_E_NOMEM. */
tm_rc tm_guided_advance(tm_guide_cache *c, tm_guided_seq *s, uint32_t id, int *final, tm_err *err);
/* Speculative drafts of a constrained sequence (docs/speculative.md): how many of draft[0, n)
 * may be verified from s's state (a prefix: each token allowed where it stands, none leading to a
 * state where the output is complete, none needing a mask past a full cache), with allow[k] the
 * mask after the first k of them (allow[0] = s->allow) for the rows of the verification. The
 * masks are the cache's (valid while s holds its constraint). TM_E_NOMEM. */
tm_rc tm_guided_draft(tm_guide_cache *c, const tm_guided_seq *s, const uint32_t *draft, uint32_t n,
                      const uint32_t **allow, uint32_t *n_ok, tm_err *err);
/* 1 when the tokens so far form a whole accepted output. */
int tm_guided_accepts(const tm_guided_seq *s);
/* Drop s's reference (s zeroed). A sequence that ends unaccepted counts as unfinished when
 * unfinished is 1. */
void tm_guided_end(tm_guide_cache *c, tm_guided_seq *s, int unfinished);

#endif /* TM_RUNNER_GUIDED_CACHE_H */
