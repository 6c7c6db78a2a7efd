/* tests/unit/test_sched_plan.c - the step planner (runner/sched/sched.h) driven directly, with no
 * engine, on random workloads: random limits (max_seqs, max_batched_tokens, block size, a KV pool
 * from just enough for one sequence to roomy), prefix cache on and off, block copies on and off,
 * records that generate, score continuations, want prompt logprobs, want nothing, run as groups
 * of n sequences, and fail mid-run. A small driver plays the runner's part (admission into the
 * first free slot, then after each step: a token appended or a row scored, finished sequences
 * cleared, a failed record's sequences all dropped).
 *
 * Each plan is checked two ways. Invariants: tokens <= max_batched_tokens, entries <= max_seqs,
 * no slot twice, a chunk starts at the sequence's n_done, has its blocks, never runs past a wanted
 * row and wants the row it ends on; blocks written by the step are held by their sequence alone;
 * every block's refcount is what the sequences and the cache hold; nothing deadlocks and every
 * admitted record is planned to completion. And a naive model of the scheduling policy (plain
 * arrays, linear scans, block keys recomputed from the tokens, prefixes compared token by token)
 * with its own pool and cache must make the same plan, entry for entry, with the same block ids,
 * copies and preemptions, and leave the same state after every step. The naive model restates the
 * runner's step() as it was before the plan/apply split (commit e6a559a); at the split, every
 * step plan of tests/unit/test_runner.c and of bench/layout_identity.sh's runs was compared with
 * the old code's and matched. */
#include <string.h>

#include "base/alloc.h"
#include "runner/sched/kv_block.h"
#include "runner/sched/prefix_cache.h"
#include "runner/sched/sched.h"
#include "tm_test.h"

enum { MAX_S = 6, MAX_LEN = 72, MAX_REC = 48, MAX_SUB = 3, VOCAB = 5 };

static uint64_t rng_state;
static uint64_t rnd(void) { // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint32_t rnd_in(uint32_t lo, uint32_t hi) { return lo + (uint32_t)(rnd() % (hi - lo + 1)); }

/* ---- the workload ---- */

enum { KIND_GEN, KIND_PROMPT_LP, KIND_SCORE, KIND_NOTHING };

typedef struct record {
    int kind;
    uint32_t n_sub;                     /* sequences (samples, or continuations) */
    uint32_t prompt[MAX_LEN], n_prompt; /* without continuation */
    uint32_t cont[MAX_SUB][8], n_cont[MAX_SUB];
    uint32_t max_tokens;
    uint64_t salt;
    int fails_at; /* fail the record at this many generated tokens of
                   * sub 0 (0: never) */
    uint32_t n_admitted, n_finished;
    int failed, done;
} record;

typedef struct world_cfg {
    tm_sched_cfg sc;
    uint32_t n_kv_block;
    uint32_t max_len; /* min(context, pool tokens), as the runner's */
    int prefix_cache;
    uint32_t n_rec;
} world_cfg;

static void make_workload(const world_cfg *wc, record *recs) {
    uint32_t shared[4][MAX_LEN];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < MAX_LEN; i++)
            shared[k][i] = (uint32_t)(rnd() % VOCAB);
    for (uint32_t r = 0; r < wc->n_rec; r++) {
        record *x = &recs[r];
        memset(x, 0, sizeof(*x));
        x->kind = (int)rnd_in(0, 9) < 6 ? KIND_GEN : (int)rnd_in(1, 3);
        x->n_sub = rnd_in(1, MAX_SUB);
        if (x->kind == KIND_NOTHING || x->kind == KIND_PROMPT_LP)
            x->n_sub = 1;
        uint32_t max_prompt = wc->max_len - 1;
        if (x->kind == KIND_SCORE)
            max_prompt = wc->max_len > 9 ? wc->max_len - 8 : 1;
        max_prompt = TM_MIN(max_prompt, 40u);
        x->n_prompt = rnd_in(1, max_prompt);
        const int k = (int)rnd_in(0, 4); // 4: no shared prefix
        const uint32_t n_shared = k < 4 ? rnd_in(0, x->n_prompt) : 0;
        for (uint32_t i = 0; i < x->n_prompt; i++)
            x->prompt[i] = i < n_shared ? shared[k][i] : (uint32_t)(rnd() % VOCAB);
        for (uint32_t s = 0; s < x->n_sub && x->kind == KIND_SCORE; s++) {
            x->n_cont[s] = rnd_in(1, TM_MIN(7u, wc->max_len - x->n_prompt));
            for (uint32_t i = 0; i < x->n_cont[s]; i++)
                x->cont[s][i] = (uint32_t)(rnd() % VOCAB);
        }
        x->max_tokens = x->kind == KIND_GEN || x->kind == KIND_PROMPT_LP ? rnd_in(1, 8) : 0;
        x->salt = rnd_in(0, 5) == 0 ? 7 : 0;
        x->fails_at = x->kind == KIND_GEN && rnd_in(0, 15) == 0 ? (int)rnd_in(1, x->max_tokens) : 0;
    }
}

// The token that sub s of record r samples as its n-th generated token.
static uint32_t token_of(uint32_t r, uint32_t s, uint32_t n) {
    return (uint32_t)((r * 31u + s * 7u + n * 13u + (n * n) / 3u) % VOCAB);
}

/* ---- the naive model of the policy ---- */

typedef struct nseq {
    int active;
    uint64_t order;
    uint32_t ids[MAX_LEN + 8], len, n_prompt, n_done;
    uint32_t blocks[MAX_LEN + 8], n_block, n_offered, n_cached;
    uint64_t salt;
    int preempted, gen;
    uint32_t score_next, score_end;
    int seen;         /* considered in the step being planned */
    uint32_t planned; /* tokens planned in it */
} nseq;

typedef struct naive {
    tm_sched_cfg cfg;
    tm_kv_pool *pool;
    tm_pcache *pc;
    nseq s[MAX_S];
} naive;

// The cache key of block j of q, chained from block 0.
static tm_bhash nkey(const naive *m, const nseq *q, uint32_t j) {
    const uint32_t bs = m->cfg.block_size;
    tm_bhash k = {0};
    for (uint32_t b = 0; b <= j; b++)
        k = tm_pcache_key(b ? &k : NULL, q->salt, q->ids + b * bs, bs);
    return k;
}

static uint32_t nrow(const nseq *q) { // the first position whose row q wants
    return q->score_next < q->score_end ? q->score_next : q->len - 1;
}

static void nrelease(naive *m, nseq *q) {
    for (uint32_t i = 0; i < q->n_block; i++)
        tm_kv_block_unref(m->pool, q->blocks[i]);
    q->n_block = 0;
}

static void npreempt(naive *m, tm_sched_plan *p, uint32_t slot) {
    nseq *q = &m->s[slot];
    nrelease(m, q);
    q->n_done = 0;
    q->n_offered = 0;
    q->preempted = 1;
    p->preempt[p->n_preempt++] = slot;
}

static uint32_t nreserve(naive *m, tm_sched_plan *p, nseq *q, uint32_t want) {
    const uint32_t bs = m->cfg.block_size;
    for (;;) {
        uint32_t need = (q->n_done + want + bs - 1) / bs;
        if (need <= q->n_block)
            return want;
        uint32_t more = need - q->n_block;
        while (m->pc && tm_kv_pool_n_free(m->pool) < more && tm_pcache_evict_one(m->pc))
            ;
        uint32_t n_free = tm_kv_pool_n_free(m->pool);
        if (more <= n_free) {
            tm_err e = {0};
            TM_ASSERT(tm_kv_block_try_alloc(m->pool, more, q->blocks + q->n_block, &e) == TM_OK);
            q->n_block += more;
            return want;
        }
        int victim = -1; // the youngest holder of blocks not seen in this step
        for (uint32_t i = 0; i < m->cfg.max_seqs; i++) {
            const nseq *o = &m->s[i];
            if (o->active && o != q && !o->seen && o->n_block > 0 &&
                (victim < 0 || o->order > m->s[victim].order))
                victim = (int)i;
        }
        if (victim >= 0) {
            npreempt(m, p, (uint32_t)victim);
            continue;
        }
        uint32_t fit = (q->n_block + n_free) * bs;
        if (fit <= q->n_done)
            return 0;
        if (fit - q->n_done < want)
            want = fit - q->n_done;
    }
}

static int same_prefix(const nseq *a, const nseq *b, uint32_t n) {
    if (a->salt != b->salt || a->len < n || b->len < n)
        return 0;
    return memcmp(a->ids, b->ids, n * sizeof(uint32_t)) == 0;
}

static uint32_t common(const uint32_t *a, const uint32_t *b, uint32_t n) {
    uint32_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

// Tokens q could take from another sequence's same block (0: not at a fresh block start).
static uint32_t nlimit(const naive *m, const nseq *q) {
    const uint32_t bs = m->cfg.block_size, row = nrow(q);
    if (q->n_done % bs != 0 || q->n_block != q->n_done / bs || q->n_done >= row)
        return 0;
    return row - q->n_done < bs ? row - q->n_done : bs;
}

static void nplan(naive *m, tm_sched_plan *p) {
    const uint32_t bs = m->cfg.block_size;
    memset(p->run, 0, sizeof(*p->run) * m->cfg.max_seqs);
    p->n_run = p->n_copy = p->n_preempt = 0;
    p->n_tok_prefill = p->n_tok_decode = p->n_tok_copied = 0;
    for (uint32_t i = 0; i < m->cfg.max_seqs; i++)
        m->s[i].seen = 0, m->s[i].planned = 0;
    uint32_t budget = m->cfg.max_batched_tokens;
    for (int decodes = 1; decodes >= 0; decodes--) {
        while (budget > 0) {
            int pick = -1; // the oldest unseen sequence of this pass
            for (uint32_t i = 0; i < m->cfg.max_seqs; i++) {
                const nseq *o = &m->s[i];
                if (o->active && !o->seen && ((o->len - o->n_done == 1) == (decodes == 1)) &&
                    (pick < 0 || o->order < m->s[pick].order))
                    pick = (int)i;
            }
            if (pick < 0)
                break;
            nseq *q = &m->s[pick];
            q->seen = 1;
            if (!decodes && m->pc) {
                // Cached blocks that continue q, keeping its wanted row to compute.
                while (q->n_done % bs == 0 && q->n_block == q->n_done / bs &&
                       q->n_done + bs <= nrow(q)) {
                    uint32_t b;
                    if (!tm_pcache_take(m->pc, nkey(m, q, q->n_done / bs), &b))
                        break;
                    q->blocks[q->n_block++] = b;
                    if (!q->preempted && q->n_done < q->n_prompt)
                        q->n_cached += TM_MIN(bs, q->n_prompt - q->n_done);
                    q->n_done += bs;
                }
                const uint32_t limit = nlimit(m, q), start = q->n_done;
                int wait = 0;
                for (uint32_t i = 0; i < m->cfg.max_seqs && limit && !wait; i++) {
                    const nseq *o = &m->s[i];
                    if (!o->active || o == q || o->order > q->order || o->len <= start ||
                        !same_prefix(q, o, start))
                        continue;
                    uint32_t mm = common(q->ids + start, o->ids + start,
                                         TM_MIN(limit, o->len - start));
                    wait = mm >= TM_MIN(2u, limit) && o->n_done < start + mm;
                }
                if (wait)
                    continue;
                const nseq *donor = NULL;
                uint32_t best = 0, j = start / bs;
                for (uint32_t i = 0; i < m->cfg.max_seqs && limit && m->cfg.can_copy; i++) {
                    const nseq *o = &m->s[i];
                    if (!o->active || o == q || o->n_block <= j || o->n_done <= start ||
                        !same_prefix(q, o, start))
                        continue;
                    uint32_t mm = common(q->ids + start, o->ids + start,
                                         TM_MIN(limit, TM_MIN(o->n_done - start, bs)));
                    if (mm > best)
                        donor = o, best = mm;
                }
                if (donor) {
                    uint32_t src = donor->blocks[j];
                    tm_kv_block_ref(m->pool, src);
                    uint32_t got = nreserve(m, p, q, best);
                    if (got) {
                        p->copy[p->n_copy++] = (tm_sched_copy){
                            .slot = (uint32_t)pick, .src = src, .dst = q->blocks[j], .n_tok = got};
                        if (!q->preempted && q->n_done < q->n_prompt)
                            q->n_cached += TM_MIN(got, q->n_prompt - q->n_done);
                        q->n_done += got;
                        p->n_tok_copied += got;
                    }
                    tm_kv_block_unref(m->pool, src);
                }
            }
            const uint32_t row = nrow(q);
            uint32_t want = q->len - q->n_done;
            if (row >= q->n_done && row + 1 - q->n_done < want)
                want = row + 1 - q->n_done;
            uint32_t got = nreserve(m, p, q, TM_MIN(want, budget));
            if (got == 0)
                continue;
            q->planned = got;
            budget -= got;
            int decode = q->n_done >= q->n_prompt;
            p->run[p->n_run++] = (tm_sched_run){
                .slot = (uint32_t)pick,
                .pos = q->n_done,
                .n_tok = got,
                .n_block = q->n_block,
                .want_logits = q->n_done + got - 1 == row &&
                               (q->gen || q->score_next < q->score_end),
                .decode = decode,
            };
            if (decode)
                p->n_tok_decode += got;
            else
                p->n_tok_prefill += got;
        }
    }
}

static void ncomputed(naive *m, nseq *q) {
    q->n_done += q->planned;
    q->planned = 0;
    if (!m->pc)
        return;
    for (; q->n_offered < q->n_done / m->cfg.block_size; q->n_offered++)
        tm_pcache_insert(m->pc, nkey(m, q, q->n_offered), q->blocks[q->n_offered]);
}

/* ---- the world: the real scheduler, the naive one, the driver's per-slot state ---- */

typedef struct slot_info {
    int rec; /* record index, -1: free */
    uint32_t sub;
    uint32_t n_gen;
    uint32_t n_scored;
} slot_info;

typedef struct world {
    world_cfg wc;
    record recs[MAX_REC];
    uint32_t next_rec; /* records [0, next_rec) are (being) admitted */
    uint64_t n_admitted;
    tm_kv_pool *pool;
    tm_pcache *pc;
    tm_sched sched;
    tm_sched_seq seqs[MAX_S];
    tm_sched_seq *slots[MAX_S];
    tm_sched_plan plan, nplan;
    naive nv;
    slot_info si[MAX_S];
    uint32_t n_running;
    uint64_t n_step, n_preempt, n_copy, n_cached_tok, n_fail;
} world;

static void world_init(world *w, const world_cfg *wc) {
    tm_err err = {0};
    memset(w, 0, sizeof(*w));
    w->wc = *wc;
    make_workload(wc, w->recs);
    const uint32_t max_blocks = TM_CEIL_DIV(wc->max_len, wc->sc.block_size);
    const tm_kv_cfg kc = {.n_block = wc->n_kv_block, .block_tok = wc->sc.block_size};
    TM_ASSERT(tm_kv_pool_create(&kc, &w->pool, &err) == TM_OK);
    TM_ASSERT(tm_kv_pool_create(&kc, &w->nv.pool, &err) == TM_OK);
    if (wc->prefix_cache) {
        TM_ASSERT(tm_pcache_create(w->pool, &w->pc, &err) == TM_OK);
        TM_ASSERT(tm_pcache_create(w->nv.pool, &w->nv.pc, &err) == TM_OK);
    }
    for (uint32_t i = 0; i < wc->sc.max_seqs; i++) {
        w->seqs[i].blocks = tm_calloc(max_blocks, sizeof(uint32_t));
        w->seqs[i].keys = tm_calloc(max_blocks, sizeof(tm_bhash));
        TM_ASSERT(w->seqs[i].blocks && w->seqs[i].keys);
        w->slots[i] = &w->seqs[i];
        w->si[i].rec = -1;
    }
    w->sched = (tm_sched){.cfg = wc->sc, .pool = w->pool, .pcache = w->pc, .slots = w->slots};
    w->nv.cfg = wc->sc;
    TM_ASSERT(tm_sched_plan_init(&w->plan, wc->sc.max_seqs, &err) == TM_OK);
    TM_ASSERT(tm_sched_plan_init(&w->nplan, wc->sc.max_seqs, &err) == TM_OK);
}

static void world_fini(world *w) {
    for (uint32_t i = 0; i < w->wc.sc.max_seqs; i++) {
        tm_sched_seq_release(&w->sched, &w->seqs[i]);
        tm_ids_fini(&w->seqs[i].ids);
        tm_free(w->seqs[i].blocks);
        tm_free(w->seqs[i].keys);
        nrelease(&w->nv, &w->nv.s[i]);
    }
    tm_sched_plan_fini(&w->plan);
    tm_sched_plan_fini(&w->nplan);
    tm_pcache_destroy(w->pc);
    tm_pcache_destroy(w->nv.pc);
    TM_CHECK(tm_kv_pool_n_free(w->pool) == w->wc.n_kv_block); // every reference was dropped
    TM_CHECK(tm_kv_pool_n_free(w->nv.pool) == w->wc.n_kv_block);
    tm_kv_pool_destroy(w->pool);
    tm_kv_pool_destroy(w->nv.pool);
}

// Append token t to both models' copies of slot i's sequence.
static void push_token(world *w, uint32_t i, uint32_t t) {
    tm_err err = {0};
    TM_ASSERT(tm_ids_push(&w->seqs[i].ids, t, &err) == TM_OK);
    nseq *n = &w->nv.s[i];
    TM_ASSERT(n->len < sizeof(n->ids) / sizeof(n->ids[0]));
    n->ids[n->len++] = t;
}

// Admit sequences into free slots (the first free one), records in order, a group's sequences
// back to back, as the runner does.
static void admit(world *w) {
    while (w->n_running < w->wc.sc.max_seqs && w->next_rec < w->wc.n_rec) {
        record *x = &w->recs[w->next_rec];
        if (x->failed || x->n_admitted == x->n_sub) { // nothing (more) to admit
            w->next_rec++;
            continue;
        }
        uint32_t i = 0;
        while (w->si[i].rec >= 0)
            i++;
        const uint32_t sub = x->n_admitted++;
        w->si[i] = (slot_info){.rec = (int)w->next_rec, .sub = sub};
        for (uint32_t t = 0; t < x->n_prompt; t++)
            push_token(w, i, x->prompt[t]);
        for (uint32_t t = 0; x->kind == KIND_SCORE && t < x->n_cont[sub]; t++)
            push_token(w, i, x->cont[sub][t]);
        tm_sched_seq *q = &w->seqs[i];
        nseq *n = &w->nv.s[i];
        q->active = n->active = 1;
        q->admit_order = n->order = w->n_admitted++;
        q->n_prompt = n->n_prompt = n->len;
        q->salt = n->salt = x->salt;
        q->gen = n->gen = x->max_tokens > 0 && x->kind != KIND_SCORE;
        if (x->kind == KIND_SCORE) {
            q->score_next = n->score_next = x->n_prompt - 1;
            q->score_end = n->score_end = n->len - 1;
        }
        if (x->kind == KIND_PROMPT_LP && sub == 0) {
            q->score_next = n->score_next = 0;
            q->score_end = n->score_end = x->n_prompt - 1;
        }
        w->n_running++;
    }
}

// Slot i's sequence ends (finished, or its record failed): both models drop it.
static void drop(world *w, uint32_t i) {
    tm_sched_seq *q = &w->seqs[i];
    tm_sched_seq_release(&w->sched, q);
    tm_ids_fini(&q->ids);
    *q = (tm_sched_seq){.blocks = q->blocks, .keys = q->keys};
    nrelease(&w->nv, &w->nv.s[i]);
    memset(&w->nv.s[i], 0, sizeof(w->nv.s[i]));
    w->si[i].rec = -1;
    w->n_running--;
}

// Slot i's sequence finished normally: check it was planned to completion.
static void finish(world *w, uint32_t i) {
    const slot_info *si = &w->si[i];
    record *x = &w->recs[si->rec];
    const tm_sched_seq *q = &w->seqs[i];
    TM_CHECK_MSG(q->n_done + 1 >= q->ids.len, "record %d finished with %u of %zu tokens computed",
                 si->rec, q->n_done, q->ids.len);
    if (x->kind == KIND_GEN || x->kind == KIND_PROMPT_LP)
        TM_CHECK(si->n_gen == x->max_tokens || q->ids.len >= w->wc.max_len);
    if (x->kind == KIND_SCORE)
        TM_CHECK(si->n_scored == x->n_cont[si->sub]);
    if (x->kind == KIND_PROMPT_LP && si->sub == 0)
        TM_CHECK(si->n_scored == x->n_prompt - 1);
    w->n_cached_tok += q->n_cached;
    if (++x->n_finished == x->n_sub)
        x->done = 1;
    drop(w, i);
}

// A record fails (the runner: non-finite logits): all its running sequences go, in slot order.
static void fail_record(world *w, int rec) {
    w->recs[rec].failed = 1;
    w->n_fail++;
    for (uint32_t i = 0; i < w->wc.sc.max_seqs; i++)
        if (w->si[i].rec == rec)
            drop(w, i);
}

static int same_plan(const tm_sched_plan *a, const tm_sched_plan *b) {
    if (a->n_run != b->n_run || a->n_copy != b->n_copy || a->n_preempt != b->n_preempt ||
        a->n_tok_prefill != b->n_tok_prefill || a->n_tok_decode != b->n_tok_decode ||
        a->n_tok_copied != b->n_tok_copied)
        return 0;
    for (uint32_t i = 0; i < a->n_run; i++) {
        const tm_sched_run *x = &a->run[i], *y = &b->run[i];
        if (x->slot != y->slot || x->pos != y->pos || x->n_tok != y->n_tok ||
            x->n_block != y->n_block || !x->want_logits != !y->want_logits ||
            !x->decode != !y->decode)
            return 0;
    }
    for (uint32_t i = 0; i < a->n_copy; i++)
        if (memcmp(&a->copy[i], &b->copy[i], sizeof(a->copy[i])) != 0)
            return 0;
    return a->n_preempt == 0 ||
           memcmp(a->preempt, b->preempt, a->n_preempt * sizeof(uint32_t)) == 0;
}

static int same_state(const world *w) {
    for (uint32_t i = 0; i < w->wc.sc.max_seqs; i++) {
        const tm_sched_seq *q = &w->seqs[i];
        const nseq *n = &w->nv.s[i];
        if (!q->active != !n->active || q->n_done != n->n_done || q->n_block != n->n_block ||
            q->n_cached != n->n_cached || q->n_offered != n->n_offered || q->ids.len != n->len ||
            !q->preempted != !n->preempted ||
            (q->n_block && memcmp(q->blocks, n->blocks, q->n_block * sizeof(uint32_t)) != 0))
            return 0;
    }
    if (tm_kv_pool_n_free(w->pool) != tm_kv_pool_n_free(w->nv.pool))
        return 0;
    return !w->pc || tm_pcache_n_cached(w->pc) == tm_pcache_n_cached(w->nv.pc);
}

// The invariants of a plan, from the real scheduler's state alone.
static void check_plan(world *w) {
    const tm_sched_plan *p = &w->plan;
    const tm_sched_cfg *c = &w->wc.sc;
    const uint32_t bs = c->block_size;
    uint32_t n_tok = 0, n_pre = 0, n_dec = 0;
    int in_step[MAX_S] = {0};
    TM_CHECK(p->n_run <= c->max_seqs);
    TM_CHECK_MSG(p->n_run > 0, "step %llu: nothing scheduled with %u running",
                 (unsigned long long)w->n_step, w->n_running);
    for (uint32_t k = 0; k < p->n_run; k++) {
        const tm_sched_run *e = &p->run[k];
        TM_ASSERT(e->slot < c->max_seqs);
        const tm_sched_seq *q = &w->seqs[e->slot];
        TM_CHECK(q->active && !in_step[e->slot]);
        in_step[e->slot] = 1;
        TM_CHECK(e->n_tok >= 1 && q->chunk == e->n_tok);
        TM_CHECK(e->pos == q->n_done && e->pos + e->n_tok <= q->ids.len);
        TM_CHECK(e->n_block == q->n_block && (uint64_t)e->n_block * bs >= e->pos + e->n_tok);
        const uint32_t last = e->pos + e->n_tok - 1;
        const int scoring = q->score_next < q->score_end;
        TM_CHECK(!scoring || last <= q->score_next); // one row per chunk: it ends at the row
        const uint32_t row = scoring ? q->score_next : (uint32_t)q->ids.len - 1;
        TM_CHECK(!e->want_logits == !(last == row && (q->gen || scoring)));
        TM_CHECK(!e->decode == !(e->pos >= q->n_prompt));
        n_tok += e->n_tok;
        if (e->decode)
            n_dec += e->n_tok;
        else
            n_pre += e->n_tok;
        // The blocks this step writes belong to this sequence alone (never a cached block).
        for (uint32_t b = e->pos / bs; b <= last / bs; b++)
            TM_CHECK_MSG(tm_kv_block_refcount(w->pool, q->blocks[b]) == 1,
                         "step %llu: slot %u writes block %u held %u times",
                         (unsigned long long)w->n_step, e->slot, q->blocks[b],
                         tm_kv_block_refcount(w->pool, q->blocks[b]));
    }
    TM_CHECK(n_tok <= c->max_batched_tokens);
    TM_CHECK(n_pre == p->n_tok_prefill && n_dec == p->n_tok_decode);
    for (uint32_t i = 0; i < c->max_seqs; i++)
        TM_CHECK(in_step[i] || w->seqs[i].chunk == 0);
    uint32_t copied = 0;
    for (uint32_t k = 0; k < p->n_copy; k++) {
        const tm_sched_copy *cp = &p->copy[k];
        const tm_sched_seq *q = &w->seqs[cp->slot];
        TM_CHECK(c->can_copy && w->pc && cp->n_tok >= 1 && cp->n_tok <= bs);
        TM_CHECK(cp->src != cp->dst && q->active);
        int held = 0;
        for (uint32_t b = 0; b < q->n_block; b++)
            held |= q->blocks[b] == cp->dst;
        TM_CHECK(held);
        copied += cp->n_tok;
    }
    TM_CHECK(copied == p->n_tok_copied);
    int preempted[MAX_S] = {0};
    for (uint32_t k = 0; k < p->n_preempt; k++) {
        TM_CHECK(p->preempt[k] < c->max_seqs && !preempted[p->preempt[k]]);
        preempted[p->preempt[k]] = 1;
        TM_CHECK(w->seqs[p->preempt[k]].active && w->seqs[p->preempt[k]].preempted);
    }
    // Every reference is a sequence's or the cache's; a block is free iff nobody holds it.
    uint64_t refs = 0, held = 0;
    uint32_t n_zero = 0;
    for (uint32_t b = 0; b < w->wc.n_kv_block; b++) {
        refs += tm_kv_block_refcount(w->pool, b);
        n_zero += tm_kv_block_refcount(w->pool, b) == 0;
    }
    for (uint32_t i = 0; i < c->max_seqs; i++)
        held += w->seqs[i].active ? w->seqs[i].n_block : 0;
    TM_CHECK(refs == held + (w->pc ? tm_pcache_n_cached(w->pc) : 0));
    TM_CHECK(n_zero == tm_kv_pool_n_free(w->pool));
}

// The driver's part after the engine: each entry's sequence computed its chunk, then its row is
// scored or a token sampled; sequences that are done finish.
static void apply(world *w) {
    const tm_sched_plan *p = &w->plan;
    for (uint32_t k = 0; k < p->n_run; k++) {
        const tm_sched_run *e = &p->run[k];
        const uint32_t i = e->slot;
        if (w->si[i].rec < 0)
            continue; // its record failed earlier in this loop
        tm_sched_seq *q = &w->seqs[i];
        nseq *n = &w->nv.s[i];
        tm_sched_computed(&w->sched, q);
        ncomputed(&w->nv, n);
        slot_info *si = &w->si[i];
        record *x = &w->recs[si->rec];
        if (!e->want_logits) {
            if (!q->gen && q->score_next >= q->score_end && q->n_done == q->ids.len)
                finish(w, i);
            continue;
        }
        if (q->score_next < q->score_end) {
            q->score_next++, n->score_next++;
            si->n_scored++;
            if (q->score_next == q->score_end && !q->gen)
                finish(w, i);
            continue;
        }
        if (x->fails_at && si->sub == 0 && si->n_gen + 1 == (uint32_t)x->fails_at) {
            fail_record(w, si->rec);
            continue;
        }
        push_token(w, i, token_of((uint32_t)si->rec, si->sub, si->n_gen));
        si->n_gen++;
        if (si->n_gen >= x->max_tokens || q->ids.len >= w->wc.max_len)
            finish(w, i);
    }
}

static void run_world(const world_cfg *wc, uint64_t seed, world *w) {
    rng_state = seed;
    world_init(w, wc);
    const uint64_t max_steps = 40000;
    for (;;) {
        admit(w);
        if (w->n_running == 0)
            break;
        if (w->n_step == max_steps) {
            TM_CHECK_MSG(0, "seed %llu: not done after %llu steps", (unsigned long long)seed,
                         (unsigned long long)max_steps);
            break;
        }
        tm_sched_plan_step(&w->sched, &w->plan);
        nplan(&w->nv, &w->nplan);
        w->n_step++;
        check_plan(w);
        int same = same_plan(&w->plan, &w->nplan) && same_state(w);
        TM_CHECK_MSG(same, "seed %llu step %llu: the plan or state differs from the naive model",
                     (unsigned long long)seed, (unsigned long long)w->n_step);
        if (!same || w->plan.n_run == 0)
            break;
        w->n_preempt += w->plan.n_preempt;
        w->n_copy += w->plan.n_copy;
        apply(w);
        TM_CHECK_MSG(same_state(w), "seed %llu step %llu: state after the step differs",
                     (unsigned long long)seed, (unsigned long long)w->n_step);
    }
    for (uint32_t r = 0; r < wc->n_rec; r++)
        TM_CHECK_MSG(w->recs[r].done || w->recs[r].failed, "seed %llu: record %u never finished",
                     (unsigned long long)seed, r);
    world_fini(w);
}

static void random_cfg(world_cfg *wc) {
    memset(wc, 0, sizeof(*wc));
    static const uint32_t sizes[] = {1, 2, 4, 8, 16};
    wc->sc.block_size = sizes[rnd_in(0, 4)];
    wc->sc.max_seqs = rnd_in(1, MAX_S);
    wc->sc.max_batched_tokens = rnd_in(0, 3) == 0 ? rnd_in(1, 4) : rnd_in(5, 96);
    wc->prefix_cache = rnd_in(0, 3) != 0;
    wc->sc.can_copy = rnd_in(0, 3) != 0;
    const uint32_t n_ctx = rnd_in(12, 64);
    // From barely one context's worth of blocks (constant preemption) to plenty.
    const uint32_t one = TM_CEIL_DIV(n_ctx, wc->sc.block_size);
    wc->n_kv_block = rnd_in(1, 4) == 1 ? one : rnd_in(one, 4 * one + 8);
    wc->max_len = TM_MIN(n_ctx, wc->n_kv_block * wc->sc.block_size);
    wc->n_rec = rnd_in(1, MAX_REC);
}

static void test_plans_match_naive(void) {
    static world w; // large; not on the stack
    uint64_t n_step = 0, n_preempt = 0, n_copy = 0, n_cached = 0, n_fail = 0;
    for (uint64_t seed = 1; seed <= 400; seed++) {
        world_cfg wc;
        rng_state = seed * 0x5851f42d4c957f2dull;
        random_cfg(&wc);
        int before = tm_test_failures;
        run_world(&wc, seed, &w);
        if (tm_test_failures != before) {
            fprintf(stderr,
                    "  seed %llu: max_seqs %u, max_batched_tokens %u, block %u, %u blocks, "
                    "cache %d, copy %d, %u records\n",
                    (unsigned long long)seed, wc.sc.max_seqs, wc.sc.max_batched_tokens,
                    wc.sc.block_size, wc.n_kv_block, wc.prefix_cache, wc.sc.can_copy, wc.n_rec);
            break;
        }
        n_step += w.n_step, n_preempt += w.n_preempt, n_copy += w.n_copy;
        n_cached += w.n_cached_tok, n_fail += w.n_fail;
    }
    fprintf(stderr,
            "  %llu steps, %llu preemptions, %llu copies, %llu cached prompt tokens, %llu "
            "failed records\n",
            (unsigned long long)n_step, (unsigned long long)n_preempt, (unsigned long long)n_copy,
            (unsigned long long)n_cached, (unsigned long long)n_fail);
    // The workloads reached the paths that matter.
    TM_CHECK(n_preempt > 100 && n_copy > 100 && n_cached > 1000 && n_fail > 10);
}

int main(void) {
    TM_RUN(test_plans_match_naive);
    return tm_test_report();
}
