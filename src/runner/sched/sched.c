/* runner/sched/sched.c - the plan of one engine step (see runner/sched/sched.h). Each step takes
 * decodes first (oldest first), then prefill chunks (oldest first) until the token budget is
 * spent. KV blocks are taken as positions are reached, from the free list, then by evicting
 * unused cached blocks, then by preempting the youngest unscheduled sequence (recompute). With the
 * prefix cache, a prefill chunk first takes the cached blocks that continue its sequence, waits
 * for an older sequence that is about to compute the same block, or copies the computed common
 * run of another sequence's same block. Plain loops over the slots; nothing allocates. */
#include "runner/sched/sched.h"

#include "base/alloc.h"

tm_rc tm_sched_plan_init(tm_sched_plan *plan, uint32_t max_seqs, tm_err *err) {
    *plan = (tm_sched_plan){0};
    plan->run = tm_calloc(max_seqs, sizeof(*plan->run));
    plan->copy = tm_calloc(max_seqs, sizeof(*plan->copy));
    plan->preempt = tm_calloc(max_seqs, sizeof(*plan->preempt));
    if (!plan->run || !plan->copy || !plan->preempt) {
        tm_sched_plan_fini(plan);
        return TM_ERR(err, TM_E_NOMEM, "step plan for %u sequences", max_seqs);
    }
    return TM_OK;
}

void tm_sched_plan_fini(tm_sched_plan *plan) {
    tm_free(plan->run);
    tm_free(plan->copy);
    tm_free(plan->preempt);
    *plan = (tm_sched_plan){0};
}

void tm_sched_seq_release(tm_sched *sc, tm_sched_seq *q) {
    for (uint32_t i = 0; i < q->n_block; i++)
        tm_kv_block_unref(sc->pool, q->blocks[i]);
    q->n_block = 0;
}

// First position whose logits row q still wants: the next scoring row, else its last token.
static uint32_t next_row(const tm_sched_seq *q) {
    return q->score_next < q->score_end ? q->score_next : (uint32_t)q->ids.len - 1;
}

// Prefix-cache key of every full block of q up to block n (exclusive), computed once.
static void ensure_keys(tm_sched *sc, tm_sched_seq *q, uint32_t n) {
    const uint32_t bs = sc->cfg.block_size;
    for (; q->n_keys < n; q->n_keys++) {
        uint32_t j = q->n_keys;
        TM_ASSERT((size_t)(j + 1) * bs <= q->ids.len);
        q->keys[j] = tm_pcache_key(j ? &q->keys[j - 1] : NULL, q->salt, q->ids.ids + (size_t)j * bs,
                                   bs);
    }
}

// At a block boundary, take the longest chain of cached blocks that continues q, leaving at
// least one token to compute (its logits give the next token).
static void match_cached(tm_sched *sc, tm_sched_seq *q) {
    const uint32_t bs = sc->cfg.block_size;
    while (q->n_done % bs == 0 && q->n_block == q->n_done / bs && q->n_done + bs <= next_row(q)) {
        uint32_t j = q->n_done / bs, b;
        ensure_keys(sc, q, j + 1);
        if (!tm_pcache_take(sc->pcache, q->keys[j], &b))
            break;
        q->blocks[q->n_block++] = b;
        if (!q->preempted && q->n_done < q->n_prompt)
            q->n_cached += TM_MIN(bs, q->n_prompt - q->n_done);
        q->n_done += bs;
    }
}

static uint32_t common_run(const uint32_t *a, const uint32_t *b, uint32_t n) {
    uint32_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

// Does o hold the same first j blocks of tokens as q (same chained key of block j - 1)?
static int same_blocks_before(tm_sched *sc, tm_sched_seq *q, tm_sched_seq *o, uint32_t j) {
    if (q->salt != o->salt)
        return 0;
    if (j == 0)
        return 1;
    if (o->ids.len < (size_t)j * sc->cfg.block_size)
        return 0;
    ensure_keys(sc, q, j);
    ensure_keys(sc, o, j);
    return o->keys[j - 1].lo == q->keys[j - 1].lo && o->keys[j - 1].hi == q->keys[j - 1].hi;
}

// q is at the start of its block j with no block j yet: the tokens it could take from another
// sequence's block j (all but its last token, which must be computed for its logits).
static uint32_t block_limit(const tm_sched *sc, const tm_sched_seq *q) {
    const uint32_t bs = sc->cfg.block_size;
    const uint32_t row = next_row(q);
    if (q->n_done % bs || q->n_block != q->n_done / bs || q->n_done >= row)
        return 0;
    return TM_MIN(bs, row - q->n_done);
}

// Is an older running sequence about to compute tokens that q's next block shares with it? Then
// q waits and takes them afterwards, from the cache or by copying, instead of computing them
// twice. A lone shared token (the BOS every prompt starts with) is not worth a step's wait.
static int waits_for_older(tm_sched *sc, tm_sched_seq *q) {
    const uint32_t bs = sc->cfg.block_size, limit = block_limit(sc, q);
    if (limit == 0)
        return 0;
    const uint32_t j = q->n_done / bs, start = j * bs;
    const uint32_t enough = TM_MIN(2u, limit);
    for (uint32_t i = 0; i < sc->cfg.max_seqs; i++) {
        tm_sched_seq *o = sc->slots[i];
        if (!o->active || o == q || o->admit_order > q->admit_order || o->ids.len <= start ||
            !same_blocks_before(sc, q, o, j))
            continue;
        uint32_t m = common_run(q->ids.ids + start, o->ids.ids + start,
                                (uint32_t)TM_MIN((size_t)limit, o->ids.len - start));
        if (m >= enough && o->n_done < start + m)
            return 1;
    }
    return 0;
}

static void preempt(tm_sched *sc, tm_sched_plan *plan, uint32_t slot) {
    tm_sched_seq *q = sc->slots[slot];
    tm_sched_seq_release(sc, q);
    q->n_done = 0;
    q->n_offered = 0;
    q->preempted = 1;
    TM_ASSERT(plan->n_preempt < sc->cfg.max_seqs); // a preempted sequence holds no blocks
    plan->preempt[plan->n_preempt++] = slot;
}

// Slot of the youngest running sequence that holds blocks and is not in the current step (nor
// except), or UINT32_MAX.
static uint32_t pick_victim(const tm_sched *sc, const tm_sched_seq *except) {
    uint32_t v = UINT32_MAX;
    for (uint32_t i = 0; i < sc->cfg.max_seqs; i++) {
        const tm_sched_seq *q = sc->slots[i];
        if (!q->active || q == except || q->chunk || q->n_block == 0)
            continue;
        if (v == UINT32_MAX || q->admit_order > sc->slots[v]->admit_order)
            v = i;
    }
    return v;
}

// Make sure q has blocks for positions [0, n_done + want); returns how many of the wanted tokens
// can be scheduled (0 if none).
static uint32_t reserve(tm_sched *sc, tm_sched_plan *plan, tm_sched_seq *q, uint32_t want) {
    const uint32_t bs = sc->cfg.block_size;
    for (;;) {
        uint32_t need = TM_CEIL_DIV(q->n_done + want, bs);
        if (need <= q->n_block)
            return want;
        uint32_t more = need - q->n_block;
        while (sc->pcache && tm_kv_pool_n_free(sc->pool) < more && tm_pcache_evict_one(sc->pcache))
            ; // cached blocks nobody uses go first
        uint32_t n_free = tm_kv_pool_n_free(sc->pool);
        if (more <= n_free) {
            tm_err e = {0};
            tm_rc rc = tm_kv_block_try_alloc(sc->pool, more, q->blocks + q->n_block, &e);
            TM_ASSERT(rc == TM_OK); // more <= n_free
            q->n_block += more;
            return want;
        }
        uint32_t v = pick_victim(sc, q);
        if (v != UINT32_MAX) {
            preempt(sc, plan, v);
            continue;
        }
        // Nobody left to preempt: take what fits.
        uint32_t fit = (q->n_block + n_free) * bs;
        if (fit <= q->n_done)
            return 0;
        want = TM_MIN(want, fit - q->n_done);
    }
}

// At the start of a block that no cached block matches: take the longest computed common run of
// the same block of another running sequence (same prefix before it) into a new block of q, as a
// copy of the plan. The tokens count as done now; the copy is made before the step's forward.
static void copy_partial(tm_sched *sc, tm_sched_plan *plan, uint32_t slot) {
    tm_sched_seq *q = sc->slots[slot];
    const uint32_t bs = sc->cfg.block_size, limit = block_limit(sc, q);
    if (limit == 0 || !sc->cfg.can_copy)
        return;
    const uint32_t j = q->n_done / bs, start = j * bs;
    tm_sched_seq *best = NULL;
    uint32_t best_m = 0;
    for (uint32_t i = 0; i < sc->cfg.max_seqs; i++) {
        tm_sched_seq *o = sc->slots[i];
        if (!o->active || o == q || o->n_block <= j || o->n_done <= start ||
            !same_blocks_before(sc, q, o, j))
            continue;
        uint32_t computed = TM_MIN(o->n_done - start, bs);
        uint32_t m = common_run(q->ids.ids + start, o->ids.ids + start, TM_MIN(limit, computed));
        if (m > best_m)
            best = o, best_m = m;
    }
    if (!best)
        return;
    // Hold the donor block while reserving, which may preempt its sequence; the reference goes
    // at the same point as when the copy was made here, so the pool sees the same operations.
    uint32_t src = best->blocks[j];
    tm_kv_block_ref(sc->pool, src);
    uint32_t got = reserve(sc, plan, q, best_m);
    if (got > 0) {
        TM_ASSERT(plan->n_copy < sc->cfg.max_seqs); // at most one per sequence and step
        plan->copy[plan->n_copy++] =
            (tm_sched_copy){.slot = slot, .src = src, .dst = q->blocks[j], .n_tok = got};
        if (!q->preempted && q->n_done < q->n_prompt)
            q->n_cached += TM_MIN(got, q->n_prompt - q->n_done);
        q->n_done += got;
        plan->n_tok_copied += got;
    }
    tm_kv_block_unref(sc->pool, src);
}

// Slot of the oldest active sequence not yet considered in this step whose next chunk is a
// decode (one token left) or, with decodes 0, a prefill; UINT32_MAX if none.
static uint32_t oldest_unscheduled(const tm_sched *sc, int decodes) {
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < sc->cfg.max_seqs; i++) {
        const tm_sched_seq *q = sc->slots[i];
        if (!q->active || q->chunk)
            continue;
        uint32_t need = (uint32_t)q->ids.len - q->n_done;
        if ((need == 1) != (decodes != 0))
            continue;
        if (best == UINT32_MAX || q->admit_order < sc->slots[best]->admit_order)
            best = i;
    }
    return best;
}

void tm_sched_plan_step(tm_sched *sc, tm_sched_plan *plan) {
    plan->n_run = plan->n_copy = plan->n_preempt = 0;
    plan->n_tok_prefill = plan->n_tok_decode = plan->n_tok_copied = 0;
    uint32_t budget = sc->cfg.max_batched_tokens;
    // Decodes first, then prefill chunks; both oldest first. A sequence that gets no tokens is
    // marked with chunk = UINT32_MAX for this pass so it is not picked again.
    for (int pass = 1; pass >= 0; pass--) {
        uint32_t slot;
        while (budget > 0 && (slot = oldest_unscheduled(sc, pass)) != UINT32_MAX) {
            tm_sched_seq *q = sc->slots[slot];
            if (pass == 0 && sc->pcache) {
                match_cached(sc, q);
                if (waits_for_older(sc, q)) {
                    q->chunk = UINT32_MAX;
                    continue;
                }
                copy_partial(sc, plan, slot);
            }
            uint32_t need = (uint32_t)q->ids.len - q->n_done;
            // A scoring sequence's chunk ends at its next wanted row (one row per chunk).
            uint32_t row = next_row(q);
            if (row >= q->n_done && row - q->n_done + 1 < need)
                need = row - q->n_done + 1;
            // A decode with drafts computes them too (speculative verification).
            const uint32_t n_draft = pass == 1 && q->gen && row == q->n_done ? q->n_draft : 0;
            need += n_draft;
            uint32_t got = reserve(sc, plan, q, TM_MIN(need, budget));
            if (got == 0) {
                q->chunk = UINT32_MAX;
                continue;
            }
            q->chunk = got;
            budget -= got;
            tm_sched_run *e = &plan->run[plan->n_run++];
            *e = (tm_sched_run){
                .slot = slot,
                .pos = q->n_done,
                .n_tok = got,
                .n_block = q->n_block,
                .want_logits = (q->n_done + got - 1 == row || n_draft) &&
                               (q->gen || q->score_next < q->score_end),
                .decode = q->n_done >= q->n_prompt,
                .n_draft = n_draft ? got - 1 : 0,
            };
            if (e->decode)
                plan->n_tok_decode += got;
            else
                plan->n_tok_prefill += got;
        }
    }
    for (uint32_t i = 0; i < sc->cfg.max_seqs; i++)
        if (sc->slots[i]->chunk == UINT32_MAX)
            sc->slots[i]->chunk = 0;
}

void tm_sched_computed_keep(tm_sched *sc, tm_sched_seq *q, uint32_t n_keep) {
    TM_ASSERT(n_keep >= 1 && n_keep <= q->chunk && q->n_done + n_keep <= q->ids.len);
    q->chunk = n_keep;
    const uint32_t n_need = TM_CEIL_DIV(q->n_done + n_keep + 1, sc->cfg.block_size);
    for (; q->n_block > n_need; q->n_block--) // past n_offered: n_offered <= n_done / block_size
        tm_kv_block_unref(sc->pool, q->blocks[q->n_block - 1]);
    tm_sched_computed(sc, q);
}

void tm_sched_computed(tm_sched *sc, tm_sched_seq *q) {
    q->n_done += q->chunk;
    q->chunk = 0;
    if (!sc->pcache)
        return;
    // Offer the full blocks q has computed to the cache.
    uint32_t n_full = q->n_done / sc->cfg.block_size;
    if (n_full <= q->n_offered)
        return;
    ensure_keys(sc, q, n_full);
    for (; q->n_offered < n_full; q->n_offered++)
        tm_pcache_insert(sc->pcache, q->keys[q->n_offered], q->blocks[q->n_offered]);
}
