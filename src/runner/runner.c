/* runner/runner.c - the continuous-batching loop. One thread. Records are read into a look-ahead
 * window (tokenized, ordered), then admitted into max_seqs slots. Each step is planned first from
 * the scheduler's state alone (runner/sched/sched.h: decodes first, oldest first, then prefill
 * chunks until the token budget is spent; KV blocks from the free list, then by evicting unused
 * cached blocks, then by preempting the youngest unscheduled sequence), then applied here: the
 * plan's block copies and one forward on the engine, the step's counters, and each entry's row
 * scored or sampled, its record finished when it stops. A step whose wanted rows are all sampled
 * greedily (no logprobs, no scoring) goes through the engine's forward_greedy when it has one, so
 * that only token ids leave the engine; the tokens are the ones tm_sample_token would pick.
 * Nothing here allocates per step except the growth of a sequence's token array and text. */
#include "runner/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/stop.h"
#include "runner/engine/engine.h"
#include "runner/guided/cache.h"
#include "runner/text/chat.h"
#include "runner/sched/kv_block.h"
#include "runner/sched/prefix_cache.h"
#include "runner/sched/sample.h"
#include "runner/sched/sched.h"

struct group;

typedef struct seq {
    tm_sched_seq q; /* what the scheduler sees: tokens, blocks, progress, wanted rows;
                     * q.active iff job is set */
    tm_job *job;    /* owned while the sequence runs (borrowed from grp when grp is set);
                     * NULL = free slot */
    uint32_t n_gen;
    uint32_t max_len; /* stop at this many tokens (context / pool limit) */
    int32_t max_tokens;
    tm_sample_params sp;
    char *const *stop; /* borrowed from job or defaults */
    uint32_t n_stop;
    /* Logits processing (issue 22): penalties and logit_bias are in sp (borrowed like stop). */
    int ignore_eos;
    uint32_t min_tokens;      /* EOS and stop ids are masked while n_gen < min_tokens */
    const uint32_t *stop_ids; /* borrowed from job or defaults: ids that end the record */
    uint32_t n_stop_ids;
    uint32_t *mask; /* owned; [n_mask] EOS ids (unless ignore_eos) and stop_ids */
    uint32_t n_mask;
    size_t max_stop_len;
    tm_detok detok;
    tm_buf text;
    double t_admit_ms, t_first_ms;
    double t_last_ms; /* when the latest generated token was sampled */
    float *itl;       /* [n_itl] gaps between generated tokens (ms); to the completion */
    uint32_t n_itl, cap_itl;
    /* Evaluation (issue 5). Rows of positions [q.score_next, q.score_end) are wanted for
     * scoring: the row of position p gives the logprob of token p + 1 (a prompt token when
     * p + 1 < n_prompt_only, else a continuation token). Such a sequence is computed in chunks
     * that end at the next wanted row, since the engine gives one row per chunk. */
    struct group *grp;      /* the record's group (n > 1, continuations), or NULL */
    uint32_t sub;           /* index of this sequence in its group */
    uint32_t n_prompt_only; /* prompt tokens before a continuation (= q.n_prompt without one) */
    uint32_t n_top, n_top_prompt; /* alternatives per generated/scored and per prompt token */
    tm_logprobs *lp;              /* owned; generated or continuation tokens' logprobs, or NULL */
    tm_logprobs *plp;             /* owned; prompt tokens' logprobs, or NULL */
    uint32_t lp_cap, plp_cap;
    double score_sum;  /* continuation: sum of its token logprobs */
    uint32_t n_scored; /* continuation tokens scored */
    int not_greedy;    /* continuation: some token was not the argmax of its row */
    /* Speculative decoding (runner/sched/spec.h): drafting state and the record's counts. */
    tm_spec_state spec;
    uint32_t n_spec_drafts, n_spec_draft_tok, n_spec_accepted;
    int mtp_ok;         /* MTP drafts: mtp_draft (and its streams) are for the decode at mtp_at */
    uint32_t mtp_draft; /* the MTP layer's pick for the token after the decode token */
    uint32_t mtp_at;    /* q.n_done when mtp_draft was made */
    uint32_t n_dsp;     /* DSpark: usable drafts in dsp_draft (for the decode at mtp_at, mtp_ok) */
    uint32_t dsp_draft[TM_SPEC_MAX_K]; /* the DSpark block's greedy drafts */
    tm_guided_seq gd; /* structured output (issue 26): the automaton and its mask, or zeroed */
    /* the masks of a constrained record's verification rows: after 0..q.n_draft drafts */
    const uint32_t *spec_allow[TM_SPEC_MAX_K + 1];
} seq;

/* A record that runs as several sequences: n > 1 samples, or one sequence per continuation of a
 * scoring record. Admitted as siblings (back to back), so the prefix cache and the partial-block
 * copy share the prompt's KV. References: the pending window entry (until every sequence is
 * admitted) and each running sequence; the last unref frees it. */
typedef struct group {
    tm_job *job;     /* owned; the sequences borrow it */
    tm_ids *sub_ids; /* [n_sub] each sequence's ids, moved into it at admission */
    uint32_t n_sub, n_admit, n_fin, n_ref;
    uint32_t n_prompt; /* prompt tokens (without a continuation) */
    int failed;        /* an error record was emitted; admit nothing more */
    double t_admit_ms, t_first_ms;
    tm_completion *c; /* owned until emitted; choices/scores filled as sequences finish */
} group;

/* A record read ahead of admission: tokenized, checked, waiting in the window. */
typedef struct pending {
    tm_job *job;        /* owned (borrowed from grp when grp is set) */
    tm_ids ids;         /* owned prompt tokens */
    group *grp;         /* a reference to the record's group, or NULL */
    tm_sampling sp;     /* the record's settings over the job defaults (tm_sampling_resolve, in
                         * prepare; borrows from job and defaults) */
    int32_t max_tokens; /* sp's, 0 for a scoring record: for ordering */
    tm_guide_ent *gent; /* a reference to the record's compiled constraint, or NULL */
} pending;

typedef struct runner {
    const tm_runner_cfg *cfg;
    tm_engine *eng;
    const tm_tokenizer *tok;
    tm_queue *out;
    tm_runner_stats *stats;
    tm_kv_pool *pool;
    tm_pcache *pcache; /* NULL when the prefix cache is off */
    pending *win;      /* [lookahead] the window; [win_head, win_len) still waiting */
    uint32_t win_cap, win_head, win_len;
    seq *seqs; /* [max_seqs] slots */
    uint32_t n_running;
    uint64_t n_admitted;
    uint32_t max_len; /* min(n_ctx, pool capacity) */
    uint32_t max_blocks_per_seq;
    uint32_t n_vocab;     /* logits row length (the model's vocab_size) */
    uint32_t n_vocab_tok; /* ids the tokenizer can decode; sampling never picks beyond */
    int32_t bos_id;
    int32_t eos_ids[TM_MODEL_MAX_EOS + 1];
    uint32_t n_eos;
    tm_sched sched;              /* the step planner over seqs[i].q (slots) */
    tm_sched_seq **slots;        /* [max_seqs] &seqs[i].q */
    tm_sched_plan plan;          /* the current step's plan */
    tm_batch_seq *bseqs;         /* [max_seqs] the current step's batch, one per plan entry */
    uint32_t max_rows;           /* logits rows per step: max_seqs, more with speculation */
    float *logits;               /* [max_rows][n_vocab] */
    uint32_t *ids;               /* [max_rows] forward_greedy's ids of a greedy step */
    tm_engine_sample_row *srows; /* [max_rows] forward_sample's rows of a sampled step */
    tm_engine_sample_out *souts; /* [max_rows] and its results */
    tm_sample_scratch scratch;
    double spec_t_spec, spec_t_plain; /* speculative step gate: decode-only step seconds with and
                                       * without drafts (moving averages; 0 = none yet) */
    tm_guide_cache *gcache;  /* structured output's compiled constraints (NULL: check only) */
    const tm_chat_tpl *chat; /* the job's chat template, parsed once: cfg->chat_tpl or own_chat;
                              * NULL (check_record without one): parsed per record */
    tm_chat_tpl *own_chat;   /* compiled by tm_runner_run when cfg->chat_tpl is NULL */
    /* MTP drafts (cfg->spec_mtp; docs/speculative.md "MTP"): a stream row is mtp_nd floats */
    uint32_t mtp_nd;
    tm_engine_draft_seq *mseqs; /* [max_seqs] an MTP step's sequences */
    uint32_t *mslot;            /* [max_seqs] their slots */
    uint32_t **mdst;            /* [max_seqs] where their drafts go */
    float *mtp_logits;          /* [max_seqs][n_vocab] */
    float *mtp_out;             /* [max_batched_tokens][mtp_nd] an MTP step's output streams */
    float *mtp_st;              /* [max_seqs][mtp_nd] each slot's last MTP output stream */
    /* DSpark drafts (cfg->spec_dspark; docs/speculative.md "DSpark"): hidden rows of dsp_w
     * floats, blocks of dsp_out rows; mseqs / mslot above are shared */
    uint32_t dsp_w, dsp_out;
    float *dsp_logits; /* [max_seqs * dsp_out][n_vocab] */
    float *dsp_conf;   /* [max_seqs * dsp_out] the blocks' confidence logits */
} runner;

static tm_rc emit_error(runner *r, tm_job *job, tm_errcode code, const char *msg, tm_err *err) {
    tm_completion *c = tm_calloc(1, sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "error completion");
    c->seq_no = job->seq_no;
    c->line = job->line;
    c->file = job->file, job->file = NULL;
    c->id_json = job->id_json, job->id_json = NULL;
    tm_completion_take_job_info(c, job);
    c->err_code = code;
    c->err_msg = tm_strdup(msg ? msg : "");
    tm_job_destroy(job);
    if (!c->err_msg) {
        tm_completion_destroy(c);
        return TM_ERR(err, TM_E_NOMEM, "error completion message");
    }
    if (tm_queue_push(r->out, c) != TM_OK) {
        tm_completion_destroy(c);
        return TM_ERR(err, TM_E_INTERNAL, "output queue closed early");
    }
    return TM_OK;
}

// Whether the record may start (tm_runner_cfg.start); false: the source released it and its
// released completion is pushed (job is freed either way then).
static tm_rc claim(runner *r, tm_job *job, bool *run, tm_err *err) {
    *run = !r->cfg->start || r->cfg->start(r->cfg->start_ctx, job->seq_no);
    if (*run)
        return TM_OK;
    tm_completion *c = tm_calloc(1, sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "released completion");
    c->seq_no = job->seq_no;
    c->released = 1;
    if (tm_queue_push(r->out, c) != TM_OK) {
        tm_completion_destroy(c);
        return TM_ERR(err, TM_E_INTERNAL, "output queue closed early");
    }
    return TM_OK;
}

// The tokenizer and the chat template say TM_E_INVAL or TM_E_PARSE for a record's bad text, the
// sampler and the detokenizer TM_E_INVAL for what a record brought (non-finite logits, bad
// sampling parameters, an id without text): modules that know nothing of records. From the
// runner on, that fails the one record (TM_E_RECORD), not the job; other codes pass unchanged.
static tm_rc record_text_fault(tm_rc rc, tm_err *err) {
    if (rc == TM_E_INVAL || rc == TM_E_PARSE) {
        err->rc = TM_E_RECORD;
        rc = TM_E_RECORD;
    }
    return rc;
}

static tm_rc record_fault(tm_rc rc, tm_err *err) {
    if (rc == TM_E_INVAL) {
        err->rc = TM_E_RECORD;
        rc = TM_E_RECORD;
    }
    return rc;
}

static void seq_reset(runner *r, seq *s) {
    tm_sched_seq_release(&r->sched, &s->q);
    tm_ids_fini(&s->q.ids);
    tm_buf_fini(&s->text);
    tm_free(s->itl);
    tm_logprobs_destroy(s->lp);
    tm_logprobs_destroy(s->plp);
    tm_free(s->mask);
    tm_guided_end(r->gcache, &s->gd, 0);
    uint32_t *blocks = s->q.blocks;
    tm_bhash *keys = s->q.keys;
    memset(s, 0, sizeof(*s));
    s->q.blocks = blocks;
    s->q.keys = keys;
}

// ---- logprobs (issue 5) ----

static tm_rc lp_create(uint32_t n_top, tm_logprobs **out, tm_err *err) {
    *out = tm_calloc(1, sizeof(**out));
    if (!*out)
        return TM_ERR(err, TM_E_NOMEM, "logprobs");
    (*out)->n_top = n_top;
    return TM_OK;
}

// Append one token (its logprob and its n_top alternatives) to l; grows like ids.
static tm_rc lp_push(tm_logprobs *l, uint32_t *cap, uint32_t id, float lp, const uint32_t *top_ids,
                     const float *top_lp, tm_err *err) {
    const uint32_t k = l->n_top;
    if (l->n_tok == *cap) {
        uint32_t c = *cap ? 2 * *cap : 16;
        uint32_t *ids = tm_realloc(l->ids, c * sizeof(*ids));
        if (ids)
            l->ids = ids;
        float *v = ids ? tm_realloc(l->lp, c * sizeof(*v)) : NULL;
        if (v)
            l->lp = v;
        uint32_t *ti = v && k ? tm_realloc(l->top_ids, (size_t)c * k * sizeof(*ti)) : NULL;
        if (ti)
            l->top_ids = ti;
        float *tv = ti ? tm_realloc(l->top_lp, (size_t)c * k * sizeof(*tv)) : NULL;
        if (tv)
            l->top_lp = tv;
        if (!v || (k && !tv))
            return TM_ERR(err, TM_E_NOMEM, "logprobs of %u tokens", c);
        *cap = c;
    }
    l->ids[l->n_tok] = id;
    l->lp[l->n_tok] = lp;
    for (uint32_t j = 0; j < k; j++) {
        l->top_ids[(size_t)l->n_tok * k + j] = top_ids ? top_ids[j] : 0;
        l->top_lp[(size_t)l->n_tok * k + j] = top_ids ? top_lp[j] : NAN;
    }
    l->n_tok++;
    return TM_OK;
}

// Logprob of token id in a logits row (and the row's n_top alternatives) appended to l; *argmax
// gets the greedy token.
static tm_rc lp_push_row(runner *r, tm_logprobs *l, uint32_t *cap, const float *row, uint32_t id,
                         uint32_t *argmax, float *lp_id, tm_err *err);

// Fill l's token byte table (text, off) once its tokens are final.
static tm_rc lp_finish(runner *r, tm_logprobs *l, tm_err *err) {
    if (!l || l->off)
        return TM_OK;
    const uint32_t per = 1 + l->n_top;
    size_t n_ent = (size_t)l->n_tok * per, total = 0, len;
    for (size_t e = 0; e < n_ent; e++) {
        uint32_t id = e % per ? l->top_ids[(e / per) * l->n_top + e % per - 1] : l->ids[e / per];
        if (e % per && isnan(l->top_lp[(e / per) * l->n_top + e % per - 1]))
            continue; // no alternatives (a prompt's first token): empty strings
        if (tm_tok_piece(r->tok, id, &len))
            total += len;
    }
    l->off = tm_calloc(n_ent + 1, sizeof(*l->off));
    l->text = tm_malloc(total + 1);
    if (!l->off || !l->text)
        return TM_ERR(err, TM_E_NOMEM, "logprob token strings (%zu bytes)", total);
    if (total > UINT32_MAX)
        return TM_ERR(err, TM_E_RECORD, "logprob token strings over 4 GiB");
    size_t at = 0;
    for (size_t e = 0; e < n_ent; e++) {
        l->off[e] = (uint32_t)at;
        uint32_t id = e % per ? l->top_ids[(e / per) * l->n_top + e % per - 1] : l->ids[e / per];
        if (e % per && isnan(l->top_lp[(e / per) * l->n_top + e % per - 1]))
            continue;
        const char *p = tm_tok_piece(r->tok, id, &len);
        if (p) {
            memcpy(l->text + at, p, len);
            at += len;
        }
    }
    l->off[n_ent] = (uint32_t)at;
    l->text[at] = '\0';
    return TM_OK;
}

// ---- groups: one record, several sequences ----

static void group_unref(group *g) {
    if (!g || --g->n_ref > 0)
        return;
    tm_job_destroy(g->job);
    for (uint32_t i = 0; i < g->n_sub; i++)
        tm_ids_fini(&g->sub_ids[i]);
    tm_free(g->sub_ids);
    tm_completion_destroy(g->c);
    tm_free(g);
}

// How far a record's tokens are counted: 4 contexts, so that a prompt somewhat too long is told
// its exact length, while a huge one costs O(context) (tm_tok_encode_max).
static size_t count_cap(const runner *r) { return 4 * (size_t)r->max_len; }

// Make p (its job and tokenized prompt) a group of n_sub sequences: copies of the prompt, or
// prompt + each continuation (tokenized on its own and appended, as lm-eval-harness does, so a
// continuation's tokens do not depend on how the prompt ends). Per-record problems: TM_E_RECORD
// with *code set.
static tm_rc group_create(runner *r, pending *p, uint32_t n_sub, tm_errcode *code, tm_err *err) {
    tm_job *job = p->job;
    group *g = tm_calloc(1, sizeof(*g));
    if (!g)
        return TM_ERR(err, TM_E_NOMEM, "record group");
    g->n_ref = 1; // the pending entry's
    g->n_sub = n_sub;
    g->n_prompt = (uint32_t)p->ids.len;
    g->sub_ids = tm_calloc(n_sub, sizeof(*g->sub_ids));
    g->c = tm_calloc(1, sizeof(*g->c));
    tm_rc rc = TM_OK;
    if (!g->sub_ids || !g->c) {
        rc = TM_ERR(err, TM_E_NOMEM, "record group of %u", n_sub);
        goto fail;
    }
    if (job->continuations) {
        g->c->scores = tm_calloc(n_sub, sizeof(*g->c->scores));
        g->c->n_scores = n_sub;
    } else {
        g->c->choices = tm_calloc(n_sub, sizeof(*g->c->choices));
        g->c->n_choices = n_sub;
    }
    if (!g->c->scores && !g->c->choices) {
        rc = TM_ERR(err, TM_E_NOMEM, "record group of %u", n_sub);
        goto fail;
    }
    for (uint32_t i = 0; i < n_sub && rc == TM_OK; i++) {
        tm_ids *v = &g->sub_ids[i];
        for (size_t t = 0; t < p->ids.len && rc == TM_OK; t++)
            rc = tm_ids_push(v, p->ids.ids[t], err);
        if (rc || !job->continuations)
            continue;
        const char *cont = job->continuations[i];
        *code = TM_ERRCODE_INVALID_VALUE;
        int over = 0; // stop counting past the context (issue 24): cost O(context), not O(text)
        rc = tm_tok_encode_max(r->tok, cont, strlen(cont), count_cap(r), v, &over, err);
        rc = record_text_fault(rc, err);
        if (rc == TM_OK && over) {
            *code = TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED;
            rc = TM_ERR(err, TM_E_RECORD,
                        "prompt + continuation %u is more than %zu tokens; this engine holds at "
                        "most %u tokens per sequence",
                        i, count_cap(r), r->max_len);
        }
        if (rc == TM_OK && v->len == p->ids.len)
            rc = TM_ERR(err, TM_E_RECORD, "continuation %u is empty", i);
        if (rc == TM_OK && v->len > r->max_len) {
            *code = TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED;
            rc = TM_ERR(err, TM_E_RECORD,
                        "prompt + continuation %u is %zu tokens; this engine holds at most %u "
                        "tokens per sequence",
                        i, v->len, r->max_len);
        }
    }
    if (rc)
        goto fail;
    p->grp = g;
    return TM_OK;
fail:
    g->job = NULL; // still the pending entry's
    group_unref(g);
    return rc;
}

// A sequence's sampling state from its record's resolved settings (pending.sp).
static void set_sampling(const tm_sampling *sp, seq *s) {
    s->sp.temperature = sp->temperature;
    s->sp.top_k = sp->top_k;
    s->sp.top_p = sp->top_p;
    s->sp.min_p = sp->min_p;
    s->sp.seed = sp->seed;
    s->max_tokens = sp->max_tokens;
    s->sp.presence_penalty = sp->presence_penalty;
    s->sp.frequency_penalty = sp->frequency_penalty;
    s->sp.repetition_penalty = sp->repetition_penalty;
    s->sp.bias_ids = sp->bias_ids, s->sp.bias = sp->bias, s->sp.n_bias = sp->n_bias;
    s->min_tokens = (uint32_t)TM_MAX(sp->min_tokens, 0);
    s->ignore_eos = sp->ignore_eos;
    s->stop_ids = sp->stop_ids, s->n_stop_ids = sp->n_stop_ids;
    s->stop = sp->stop;
    s->n_stop = sp->n_stop;
    s->max_stop_len = 0;
    for (uint32_t i = 0; i < s->n_stop; i++)
        s->max_stop_len = TM_MAX(s->max_stop_len, strlen(s->stop[i]));
}

// A prompt found to need more than count_cap tokens (tm_tok_encode_max stopped counting): the
// same record error as prepare's length check, with a bound for the count.
static tm_rc prompt_over(const runner *r, tm_errcode *code, tm_err *err) {
    *code = TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED;
    return TM_ERR(err, TM_E_RECORD,
                  "prompt is more than %zu tokens; this engine holds at most %u tokens per "
                  "sequence (prompt + at least 1 generated)",
                  count_cap(r), r->max_len);
}

// Tokenize a record into ids. Per-record problems (a template that fails on these messages, text
// the tokenizer rejects) return TM_E_RECORD with err filled and *code set; anything else is
// fatal.
static tm_rc tokenize_job(runner *r, const tm_job *job, tm_ids *ids, tm_errcode *code,
                          tm_err *err) {
    tm_rc rc;
    for (uint32_t i = 0; i < job->n_prompt_ids; i++) { // bench prompts: ids as they are
        rc = tm_ids_push(ids, job->prompt_ids[i], err);
        if (rc)
            return rc;
    }
    if (job->prompt_ids)
        return TM_OK;
    // Count no further than count_cap (issue 24: memory and time are bounded by the context, not
    // by the prompt's bytes); a prompt under it that is too long gets its exact count below.
    size_t max_prompt = count_cap(r);
    if (job->messages) {
        tm_buf prompt = {0};
        int over = 0;
        if (r->chat)
            rc = tm_chat_tpl_render(r->chat, job->messages, job->n_messages, 1, &prompt, err);
        else
            rc = tm_chat_render_with(r->tok, r->cfg->chat_template, job->messages, job->n_messages,
                                     1, &prompt, err);
        if (rc == TM_OK)
            rc = tm_tok_encode_max(r->tok, prompt.data ? prompt.data : "", prompt.len, max_prompt,
                                   ids, &over, err);
        tm_buf_fini(&prompt);
        *code = TM_ERRCODE_TEMPLATE_ERROR;
        return rc == TM_OK && over ? prompt_over(r, code, err) : record_text_fault(rc, err);
    }
    // Plain prompts get the BOS token the model was trained with, as HF tokenizers with
    // add_bos_token do (the chat format writes its own BOS).
    if (r->bos_id >= 0) {
        rc = tm_ids_push(ids, (uint32_t)r->bos_id, err);
        if (rc)
            return rc;
    }
    *code = TM_ERRCODE_INVALID_VALUE;
    int over = 0;
    rc = tm_tok_encode_max(r->tok, job->prompt, strlen(job->prompt), max_prompt, ids, &over, err);
    return rc == TM_OK && over ? prompt_over(r, code, err) : record_text_fault(rc, err);
}

// A record's checks before it can run (window_add's, and tm_runner_check_record's): tokenize it
// into p->ids, check its length, make its group of sequences (n > 1, continuations).
// Per-record problems: TM_E_RECORD with *code and rec_err set.
static tm_rc prepare(runner *r, tm_job *job, pending *p, tm_errcode *code_out, tm_err *rec_err) {
    tm_errcode code = TM_ERRCODE_NONE;
    double t0 = tm_now_ms();
    tm_rc rc = tokenize_job(r, job, &p->ids, &code, rec_err);
    if (r->stats)
        r->stats->tokenize_s += (tm_now_ms() - t0) / 1e3;
    if (rc == TM_OK && (p->ids.len == 0 || p->ids.len >= r->max_len)) {
        code = p->ids.len ? TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED : TM_ERRCODE_INVALID_VALUE;
        if (p->ids.len)
            TM_ERR(rec_err, TM_E_RECORD,
                   "prompt is %zu tokens; this engine holds at most %u tokens per sequence "
                   "(prompt + at least 1 generated)",
                   p->ids.len, r->max_len);
        else
            TM_ERR(rec_err, TM_E_RECORD, "prompt is empty");
        rc = TM_E_RECORD;
    }
    tm_sampling_resolve(&r->cfg->defaults, &job->sp, &p->sp);
    // A record's own max_tokens that cannot fit beside its prompt in the model's context (n_ctx,
    // engine.max_model_len): the error OpenAI and vLLM return (an OpenAI line gets their 400
    // response), not a silent cut at the context's end. The job's default max_tokens is a bound
    // instead: clipped to the context (finish_reason length), as is a KV pool smaller than it.
    if (rc == TM_OK && !job->n_continuations && (job->sp.set & TM_SP_MAX_TOKENS) &&
        (uint64_t)p->ids.len + (uint64_t)job->sp.max_tokens > r->cfg->n_ctx) {
        code = TM_ERRCODE_CONTEXT_LENGTH_EXCEEDED;
        TM_ERR(rec_err, TM_E_RECORD,
               "This model's maximum context length is %u tokens. However, you requested %llu "
               "tokens (%zu in the %s, %d in the completion). Please reduce the length of the "
               "%s or completion.",
               r->cfg->n_ctx,
               (unsigned long long)p->ids.len + (unsigned long long)job->sp.max_tokens, p->ids.len,
               job->messages ? "messages" : "prompt", (int)job->sp.max_tokens,
               job->messages ? "messages" : "prompt");
        rc = TM_E_RECORD;
    }
    const tm_sampling *lb = &p->sp;
    if (rc == TM_OK && lb->n_bias && lb->bias_ids[lb->n_bias - 1] >= r->n_vocab_tok) {
        code = TM_ERRCODE_INVALID_VALUE; // ids are sorted: the last is the largest
        TM_ERR(rec_err, TM_E_RECORD, "field 'logit_bias': token id %u is beyond the model's %u ids",
               lb->bias_ids[lb->n_bias - 1], r->n_vocab_tok);
        rc = TM_E_RECORD;
    }
    if (rc == TM_OK && job->guided_kind && job->continuations) {
        code = TM_ERRCODE_INVALID_VALUE;
        rc = TM_ERR(rec_err, TM_E_RECORD, "structured output does not apply to scoring records");
    }
    if (rc == TM_OK && job->guided_kind) // compiled once per distinct constraint (the cache)
        rc = tm_guide_cache_get(r->gcache, job->guided_kind, job->guided, &p->gent, &code, rec_err);
    uint32_t n_sub = job->continuations ? job->n_continuations : TM_MAX(job->n, 1u);
    if (rc == TM_OK && (job->continuations || n_sub > 1))
        rc = group_create(r, p, n_sub, &code, rec_err);
    *code_out = code;
    return rc;
}

// Take one record off the input: answer it with an error completion, or tokenize it into the
// window.
static tm_rc window_add(runner *r, tm_job *job, tm_err *err) {
    bool run = true;
    if (job->err_code != TM_ERRCODE_NONE) {
        tm_rc rc = claim(r, job, &run, err);
        if (rc || !run) {
            tm_job_destroy(job);
            return rc;
        }
        return emit_error(r, job, job->err_code, job->err_msg, err);
    }
    pending *p = &r->win[r->win_len];
    *p = (pending){.job = job};
    tm_errcode code = TM_ERRCODE_NONE;
    tm_err rec_err = {0};
    tm_rc rc = prepare(r, job, p, &code, &rec_err);
    if (rc) {
        tm_guide_cache_unref(r->gcache, p->gent);
        p->gent = NULL;
    }
    if (rc == TM_E_RECORD) {
        tm_ids_fini(&p->ids);
        tm_rc crc = claim(r, job, &run, err);
        if (crc || !run) {
            tm_job_destroy(job);
            return crc;
        }
        return emit_error(r, job, code, rec_err.msg, err);
    }
    if (rc) {
        tm_ids_fini(&p->ids);
        tm_job_destroy(job);
        *err = rec_err;
        return rc;
    }
    p->max_tokens = p->sp.max_tokens;
    if (job->continuations)
        p->max_tokens = 0;
    if (p->grp)
        p->grp->job = job;
    r->win_len++;
    return TM_OK;
}

static int cmp_ids(const pending *a, const pending *b) {
    size_t n = TM_MIN(a->ids.len, b->ids.len);
    for (size_t i = 0; i < n; i++)
        if (a->ids.ids[i] != b->ids.ids[i])
            return a->ids.ids[i] < b->ids.ids[i] ? -1 : 1;
    return a->ids.len < b->ids.len ? -1 : a->ids.len > b->ids.len;
}

// Depth-first order of the token trie = lexicographic order of the token ids.
static int cmp_trie(const void *pa, const void *pb) {
    const pending *a = pa, *b = pb;
    int c = cmp_ids(a, b);
    if (c)
        return c;
    return a->job->seq_no < b->job->seq_no ? -1 : a->job->seq_no > b->job->seq_no;
}

static size_t common_prefix(const tm_ids *a, const tm_ids *b) {
    size_t n = TM_MIN(a->len, b->len), i = 0;
    while (i < n && a->ids[i] == b->ids[i])
        i++;
    return i;
}

// Order the window: trie order, then within each group sharing at least a first block, longest
// max_tokens first (stable), so no long generation starts last and idles the engine at the end.
static void window_order(runner *r) {
    pending *w = r->win;
    uint32_t n = r->win_len;
    qsort(w, n, sizeof(*w), cmp_trie);
    for (uint32_t g = 0; g < n;) {
        uint32_t e = g + 1;
        while (e < n && common_prefix(&w[g].ids, &w[e].ids) >= r->cfg->block_size)
            e++;
        for (uint32_t i = g + 1; i < e; i++) { // insertion sort: stable, groups are small
            pending x = w[i];
            uint32_t j = i;
            while (j > g && w[j - 1].max_tokens < x.max_tokens) {
                w[j] = w[j - 1];
                j--;
            }
            w[j] = x;
        }
        g = e;
    }
}

// Admit the window's next record (or the next sequence of its group) into a free slot.
static tm_rc admit(runner *r, tm_err *err) {
    pending *p = &r->win[r->win_head];
    group *g = p->grp;
    if (!g || g->n_admit == 0) { // the record starts now, unless its source released it
        bool run = true;
        tm_rc rc = claim(r, p->job, &run, err);
        if (rc)
            return rc;
        if (!run) {
            r->win_head++;
            tm_ids_fini(&p->ids);
            if (g) // the pending entry's reference, the only one yet: frees the job
                group_unref(g);
            else
                tm_job_destroy(p->job);
            tm_guide_cache_unref(r->gcache, p->gent);
            *p = (pending){0};
            return TM_OK;
        }
    }
    if (g && g->failed) { // an earlier sibling failed the record: nothing more to run
        r->win_head++;
        tm_ids_fini(&p->ids);
        group_unref(g);
        tm_guide_cache_unref(r->gcache, p->gent);
        *p = (pending){0};
        return TM_OK;
    }
    seq *s = NULL;
    for (uint32_t i = 0; i < r->cfg->max_seqs && !s; i++)
        if (!r->seqs[i].job)
            s = &r->seqs[i];
    TM_ASSERT(s);
    s->job = p->job;
    s->q.active = 1;
    set_sampling(&p->sp, s); // before the pending entry goes (its last sequence admitted)
    if (p->gent) { // the automaton's start state and its mask (the sequence's own reference)
        tm_rc grc = tm_guided_start(r->gcache, p->gent, &s->gd, err);
        if (grc)
            return grc;
    }
    if (g) {
        s->sub = g->n_admit++;
        s->q.ids = g->sub_ids[s->sub];
        g->sub_ids[s->sub] = (tm_ids){0};
        s->grp = g;
        g->n_ref++;
    } else {
        s->q.ids = p->ids;
        p->ids = (tm_ids){0};
    }
    if (!g || g->n_admit == g->n_sub) {
        r->win_head++;
        tm_ids_fini(&p->ids);
        group_unref(g); // the pending entry's reference
        tm_guide_cache_unref(r->gcache, p->gent);
        *p = (pending){0};
    }
    const tm_job *job = s->job;
    s->t_admit_ms = tm_now_ms();
    if (g && g->t_admit_ms == 0)
        g->t_admit_ms = s->t_admit_ms;
    s->q.n_prompt = (uint32_t)s->q.ids.len;
    s->n_prompt_only = g ? g->n_prompt : s->q.n_prompt;
    s->q.salt = job->cache_salt;
    s->ignore_eos |= job->ignore_eos;
    if (s->min_tokens) {
        s->mask = tm_malloc((r->n_eos + s->n_stop_ids + 1) * sizeof(uint32_t));
        if (!s->mask)
            return TM_ERR(err, TM_E_NOMEM, "min_tokens mask");
        for (uint32_t i = 0; i < r->n_eos && !s->ignore_eos; i++)
            s->mask[s->n_mask++] = (uint32_t)r->eos_ids[i];
        for (uint32_t i = 0; i < s->n_stop_ids; i++)
            s->mask[s->n_mask++] = s->stop_ids[i];
    }
    if (g && !job->continuations)
        s->sp.seed = tm_sample_seed_of(s->sp.seed, s->sub);
    s->max_len = r->max_len;
    s->q.admit_order = r->n_admitted++;
    r->stats->n_tok_prompt += s->q.n_prompt;
    r->n_running++;
    s->q.gen = s->max_tokens > 0 && !job->continuations;
    s->n_top = TM_MIN(job->top_logprobs, r->n_vocab_tok);
    if (job->continuations) {
        s->q.score_next = s->n_prompt_only - 1;
        s->q.score_end = s->q.n_prompt - 1;
    }
    tm_rc rc = TM_OK;
    if (job->logprobs)
        rc = lp_create(s->n_top, &s->lp, err);
    if (rc == TM_OK && job->prompt_logprobs && s->sub == 0) {
        s->n_top_prompt = TM_MIN(job->prompt_top_logprobs, r->n_vocab_tok);
        s->q.score_next = 0;
        if (!job->continuations)
            s->q.score_end = s->n_prompt_only - 1;
        rc = lp_create(s->n_top_prompt, &s->plp, err);
        if (rc == TM_OK) // the first token has no logprob
            rc = lp_push(s->plp, &s->plp_cap, s->q.ids.ids[0], NAN, NULL, NULL, err);
    }
    return rc;
}

static int is_eos(const runner *r, uint32_t id) {
    for (uint32_t i = 0; i < r->n_eos; i++)
        if ((uint32_t)r->eos_ids[i] == id)
            return 1;
    return 0;
}

static int is_stop_id(const seq *s, uint32_t id) {
    for (uint32_t i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id)
            return 1;
    return 0;
}

// Free s's slot (its job belongs to its group, or was moved out).
static void seq_free_slot(runner *r, seq *s) {
    group *g = s->grp;
    s->job = NULL;
    s->grp = NULL;
    seq_reset(r, s);
    r->n_running--;
    group_unref(g);
}

// Record the result of group sequence s in the group's completion; the last one emits it.
static tm_rc sub_finish(runner *r, seq *s, tm_finish why, tm_err *err) {
    group *g = s->grp;
    tm_completion *c = g->c;
    if (g->job->continuations) {
        tm_score *sc = &c->scores[s->sub];
        sc->logprob = s->score_sum;
        sc->n_tok = s->n_scored;
        sc->is_greedy = !s->not_greedy;
        sc->logprobs = s->lp, s->lp = NULL;
    } else {
        tm_choice *ch = &c->choices[s->sub];
        ch->text = s->text.data ? s->text.data : tm_strdup("");
        s->text.data = NULL;
        if (!ch->text)
            return TM_ERR(err, TM_E_NOMEM, "completion text");
        ch->finish = why;
        ch->n_tok_gen = s->n_gen;
        ch->logprobs = s->lp, s->lp = NULL;
        c->n_tok_gen += s->n_gen;
        if (!c->itl_ms) // the first sample to finish gives the record's inter-token latencies
            c->itl_ms = s->itl, s->itl = NULL, c->n_itl = s->n_itl;
    }
    if (s->plp)
        c->prompt_logprobs = s->plp, s->plp = NULL;
    c->spec = r->cfg->spec_k > 0;
    c->n_spec_drafts += s->n_spec_drafts;
    c->n_spec_draft_tok += s->n_spec_draft_tok;
    c->n_spec_accepted += s->n_spec_accepted;
    c->n_tok_cached = TM_MAX(c->n_tok_cached, TM_MIN(s->q.n_cached, g->n_prompt));
    r->stats->n_tok_cached += s->q.n_cached;
    if (s->t_first_ms > 0 && (g->t_first_ms == 0 || s->t_first_ms < g->t_first_ms))
        g->t_first_ms = s->t_first_ms;
    g->n_fin++;
    int last = g->n_fin == g->n_sub;
    if (last)
        g->n_ref++; // keep g past the slot's reference
    seq_free_slot(r, s);
    if (!last)
        return TM_OK;
    tm_job *job = g->job;
    c->seq_no = job->seq_no;
    c->line = job->line;
    c->file = job->file, job->file = NULL;
    c->id_json = job->id_json, job->id_json = NULL;
    tm_completion_take_job_info(c, job);
    c->finish = c->n_choices ? c->choices[0].finish : TM_FINISH_LENGTH;
    c->n_tok_prompt = g->n_prompt;
    c->ttft_ms = (g->t_first_ms > 0 ? g->t_first_ms : tm_now_ms()) - g->t_admit_ms;
    c->total_ms = tm_now_ms() - g->t_admit_ms;
    g->c = NULL;
    group_unref(g);
    if (tm_queue_push(r->out, c) != TM_OK) {
        tm_completion_destroy(c);
        return TM_ERR(err, TM_E_INTERNAL, "output queue closed early");
    }
    return TM_OK;
}

// A sequence failed (non-finite logits): its record becomes an error record; the other
// sequences of its group stop.
static tm_rc fail_seq(runner *r, seq *s, const char *msg, tm_err *err) {
    group *g = s->grp;
    if (!g) {
        tm_job *job = s->job;
        s->job = NULL;
        seq_reset(r, s);
        r->n_running--;
        return emit_error(r, job, TM_ERRCODE_ENGINE_ERROR, msg, err);
    }
    g->n_ref++;
    for (uint32_t i = 0; i < r->cfg->max_seqs; i++)
        if (r->seqs[i].grp == g)
            seq_free_slot(r, &r->seqs[i]);
    g->failed = 1;
    tm_job *job = g->job;
    g->job = NULL;
    group_unref(g);
    return emit_error(r, job, TM_ERRCODE_ENGINE_ERROR, msg, err);
}

static tm_rc finish(runner *r, seq *s, tm_finish why, tm_err *err) {
    tm_guided_end(r->gcache, &s->gd, why == TM_FINISH_LENGTH); // counts an unfinished constraint
    tm_rc rc = record_fault(tm_detok_flush(&s->detok, &s->text, err), err);
    if (rc == TM_OK)
        rc = lp_finish(r, s->lp, err);
    if (rc == TM_OK)
        rc = lp_finish(r, s->plp, err);
    if (rc)
        return rc;
    if (s->grp)
        return sub_finish(r, s, why, err);
    tm_completion *c = tm_calloc(1, sizeof(*c));
    if (!c)
        return TM_ERR(err, TM_E_NOMEM, "completion");
    tm_job *job = s->job;
    double now = tm_now_ms();
    c->seq_no = job->seq_no;
    c->line = job->line;
    c->file = job->file, job->file = NULL;
    c->id_json = job->id_json, job->id_json = NULL;
    tm_completion_take_job_info(c, job);
    c->text = s->text.data ? s->text.data : tm_strdup("");
    s->text.data = NULL;
    c->finish = why;
    c->n_tok_prompt = s->q.n_prompt;
    c->n_tok_gen = s->n_gen;
    c->n_tok_cached = s->q.n_cached;
    r->stats->n_tok_cached += s->q.n_cached;
    c->ttft_ms = s->t_first_ms - s->t_admit_ms;
    c->total_ms = now - s->t_admit_ms;
    c->itl_ms = s->itl, s->itl = NULL;
    c->n_itl = s->n_itl;
    c->logprobs = s->lp, s->lp = NULL;
    c->prompt_logprobs = s->plp, s->plp = NULL;
    c->spec = r->cfg->spec_k > 0;
    c->n_spec_drafts = s->n_spec_drafts;
    c->n_spec_draft_tok = s->n_spec_draft_tok;
    c->n_spec_accepted = s->n_spec_accepted;
    tm_job_destroy(job);
    s->job = NULL;
    seq_reset(r, s);
    r->n_running--;
    if (!c->text) {
        tm_completion_destroy(c);
        return TM_ERR(err, TM_E_NOMEM, "completion text");
    }
    if (tm_queue_push(r->out, c) != TM_OK) {
        tm_completion_destroy(c);
        return TM_ERR(err, TM_E_INTERNAL, "output queue closed early");
    }
    return TM_OK;
}

// A token was sampled for s: append it, detokenize, and check the stop conditions.
static tm_rc on_token(runner *r, seq *s, uint32_t id, tm_err *err) {
    double now = tm_now_ms();
    if (r->cfg->live_tok_gen) // the progress line counts tokens of unfinished records too
        atomic_fetch_add_explicit(r->cfg->live_tok_gen, 1, memory_order_relaxed);
    if (s->n_gen == 0) {
        s->t_first_ms = now;
    } else { // inter-token latency sample (vLLM's ITL); grows like ids, not per step
        if (s->n_itl == s->cap_itl) {
            uint32_t cap = s->cap_itl ? 2 * s->cap_itl : 64;
            float *v = tm_realloc(s->itl, cap * sizeof(*v));
            if (!v)
                return TM_ERR(err, TM_E_NOMEM, "inter-token latencies (%u)", cap);
            s->itl = v;
            s->cap_itl = cap;
        }
        s->itl[s->n_itl++] = (float)(now - s->t_last_ms);
    }
    s->t_last_ms = now;
    s->n_gen++;
    // Before min_tokens no stop applies (vLLM); EOS and stop ids are masked until then.
    const int may_stop = s->n_gen >= s->min_tokens;
    if (may_stop && ((!s->ignore_eos && is_eos(r, id)) || is_stop_id(s, id)))
        return finish(r, s, TM_FINISH_STOP, err);
    if (s->gd.ent && is_eos(r, id)) // structured output: EOS is allowed only where it accepts
        return finish(r, s, TM_FINISH_STOP, err);
    tm_rc rc = tm_ids_push(&s->q.ids, id, err);
    if (rc)
        return rc;
    size_t before = s->text.len;
    rc = record_fault(tm_detok_push(r->tok, &s->detok, id, 1, &s->text, err), err);
    if (rc)
        return rc;
    if (may_stop && s->n_stop && s->text.len > before) {
        // A stop string may start up to max_stop_len - 1 bytes before the new text.
        size_t from = before > s->max_stop_len ? before - s->max_stop_len + 1 : 0;
        size_t cut = SIZE_MAX;
        for (uint32_t i = 0; i < s->n_stop; i++) {
            size_t n = strlen(s->stop[i]);
            if (n == 0)
                continue;
            for (size_t p = from; p + n <= s->text.len && p < cut; p++)
                if (memcmp(s->text.data + p, s->stop[i], n) == 0) {
                    cut = p;
                    break;
                }
        }
        if (cut != SIZE_MAX) {
            s->text.len = cut; // the stop string is not part of the output, as in vLLM
            s->text.data[cut] = '\0';
            s->detok.n_pending = 0;
            return finish(r, s, TM_FINISH_STOP, err);
        }
    }
    if (s->gd.ent) { // structured output: advance by the token's bytes, then the next mask
        int final = 0;
        rc = tm_guided_advance(r->gcache, &s->gd, id, &final, err);
        if (rc)
            return rc;
        if (final) // the answer is complete and nothing may follow: no need to wait for EOS
            return finish(r, s, TM_FINISH_STOP, err);
    }
    if ((int64_t)s->n_gen >= (int64_t)s->max_tokens || s->q.ids.len >= s->max_len)
        return finish(r, s, TM_FINISH_LENGTH, err);
    return TM_OK;
}

static tm_rc lp_push_row(runner *r, tm_logprobs *l, uint32_t *cap, const float *row, uint32_t id,
                         uint32_t *argmax, float *lp_id, tm_err *err) {
    uint32_t top_ids[TM_MAX_TOP_LOGPROBS];
    float top_lp[TM_MAX_TOP_LOGPROBS];
    TM_ASSERT(l->n_top <= TM_MAX_TOP_LOGPROBS);
    tm_rc rc = tm_sample_logprobs(row, r->n_vocab_tok, id, l->n_top, lp_id, top_ids, top_lp, argmax,
                                  err);
    rc = record_fault(rc, err);
    if (rc)
        return rc;
    return lp_push(l, cap, id, *lp_id, top_ids, top_lp, err);
}

// The row of position score_next of s: the logprob of token score_next + 1 (a prompt token, or
// a continuation token that also counts towards the score).
// With o (a sampled step: forward_sample scored the row, tm_engine_sample_row.score), its
// argmax, logprob and alternatives instead of the row's.
static tm_rc score_row(runner *r, seq *s, const float *row, const tm_engine_sample_out *o,
                       tm_err *err) {
    uint32_t pos = s->q.score_next++, id = s->q.ids.ids[pos + 1], am;
    float v;
    tm_rc rc;
    if (s->t_first_ms == 0)
        s->t_first_ms = tm_now_ms();
    if (pos + 1 < s->n_prompt_only && !s->plp)
        return TM_OK;
    if (o) {
        if (o->id == TM_ENGINE_ID_NONFINITE)
            return TM_ERR(err, TM_E_RECORD, "logprobs: a logit is not finite");
        if (o->id >= r->n_vocab_tok)
            return TM_ERR(err, TM_E_INTERNAL, "engine %s: argmax %u beyond the %u sampled ids",
                          r->eng->ops->name, o->id, r->n_vocab_tok);
        am = o->id, v = o->lp;
    }
    if (pos + 1 < s->n_prompt_only) {
        if (o)
            return lp_push(s->plp, &s->plp_cap, id, v, o->top_ids, o->top_lp, err);
        return lp_push_row(r, s->plp, &s->plp_cap, row, id, &am, &v, err);
    }
    if (o) {
        rc = s->lp ? lp_push(s->lp, &s->lp_cap, id, v, o->top_ids, o->top_lp, err) : TM_OK;
    } else if (s->lp) {
        rc = lp_push_row(r, s->lp, &s->lp_cap, row, id, &am, &v, err);
    } else {
        rc = tm_sample_logprobs(row, r->n_vocab_tok, id, 0, &v, NULL, NULL, &am, err);
        rc = record_fault(rc, err);
    }
    if (rc)
        return rc;
    s->score_sum += v;
    s->n_scored++;
    s->not_greedy |= am != id;
    return TM_OK;
}

// The sampling parameters of s's next generated token: its history and, before min_tokens, the
// mask (borrowed from s: valid until s's ids grow).
static tm_sample_params row_params(const seq *s) {
    tm_sample_params p = s->sp;
    p.hist = s->q.ids.ids;
    p.n_hist = (uint32_t)s->q.ids.len;
    p.n_hist_prompt = s->q.n_prompt;
    p.mask_ids = s->mask;
    p.n_mask = s->n_gen < s->min_tokens ? s->n_mask : 0;
    p.allow = s->gd.allow; // structured output: NULL when unconstrained
    return p;
}

// 1 when s's wanted row this step is a generated token that tm_sample_token would pick as the
// argmax, and nothing else reads the row (no logprobs, not a scoring row): the engine may pick it
// itself (forward_greedy) and keep the logits row.
static int row_is_greedy(const runner *r, const seq *s) {
    const tm_sample_params p = row_params(s);
    return s->q.score_next >= s->q.score_end && !s->lp && tm_sample_is_greedy(&p, r->n_vocab_tok) &&
           !tm_sample_has_proc(&p);
}

// 1 when s's wanted row this step is a generated token (not a scoring row): forward_sample may
// sample it on the engine, its logprobs included.
static int row_is_sampled(const seq *s) { return s->q.score_next >= s->q.score_end; }

// 1 when s's wanted row this step is a scoring row whose token the engine can score
// (tm_engine_sample_row.score); *row gets it. Else the row goes to the host.
static int row_scored(const runner *r, const seq *s, tm_engine_sample_row *row) {
    const uint32_t pos = s->q.score_next, id = s->q.ids.ids[pos + 1];
    if (s->q.score_next >= s->q.score_end || id >= r->n_vocab_tok)
        return 0;
    const tm_logprobs *l = pos + 1 < s->n_prompt_only ? s->plp : s->lp;
    *row = (tm_engine_sample_row){.score = 1, .score_id = id, .n_top = l ? l->n_top : 0};
    return 1;
}

// The token of a sampled row as forward_sample gave it; rows tm_sample_token would refuse fail
// their record the same way (TM_E_RECORD).
static tm_rc sampled_token(runner *r, uint32_t got, uint32_t *id, tm_err *err) {
    if (got == TM_ENGINE_ID_MASKED)
        return TM_ERR(err, TM_E_RECORD, "sample: every token is masked (min_tokens)");
    if (got == TM_ENGINE_ID_NONFINITE)
        return TM_ERR(err, TM_E_RECORD, "sample: a logit is NaN or inf");
    if (got >= r->n_vocab_tok)
        return TM_ERR(err, TM_E_INTERNAL, "engine %s: sampled id %u beyond the %u sampled ids",
                      r->eng->ops->name, got, r->n_vocab_tok);
    *id = got;
    return TM_OK;
}

// The token of a greedy row as forward_greedy gave it; a non-finite row fails its record as
// tm_sample_token would (TM_E_RECORD).
static tm_rc greedy_token(runner *r, uint32_t got, uint32_t *id, tm_err *err) {
    if (got == TM_ENGINE_ID_NONFINITE)
        return TM_ERR(err, TM_E_RECORD, "sample: a logit is NaN or inf");
    if (got >= r->n_vocab_tok)
        return TM_ERR(err, TM_E_INTERNAL, "engine %s: greedy id %u beyond the %u sampled ids",
                      r->eng->ops->name, got, r->n_vocab_tok);
    *id = got;
    return TM_OK;
}

// ---- a step: the plan (runner/sched/sched.h), then the engine, the stats and the rows ----

static tm_sample_params spec_row_params(const seq *s, uint32_t k);

// Carry out the plan's copies, then one forward of its entries. A greedy step (the engine has
// forward_greedy and every wanted row only needs its argmax: *greedy 1) leaves one id per wanted
// row in r->ids; a sampled step (the engine has forward_sample and every wanted row is a
// generated token: *greedy 2) its picks and logprobs in r->souts; any other step (*greedy 0)
// the rows in r->logits. *dt_s gets the forward's time.
static tm_rc run_engine(runner *r, const tm_sched_plan *plan, int *greedy, double *dt_s,
                        tm_err *err) {
    for (uint32_t i = 0; i < plan->n_copy; i++) { // in plan order (runner/sched/sched.h)
        const tm_sched_copy *cp = &plan->copy[i];
        tm_rc rc = r->eng->ops->kv_copy(r->eng, cp->src, cp->dst, cp->n_tok, err);
        if (rc)
            return rc;
        r->stats->n_tok_copied += cp->n_tok;
    }
    if (plan->n_run == 0)
        return TM_ERR(err, TM_E_INTERNAL, "scheduler: no sequence could be scheduled");
    int g = r->eng->ops->forward_greedy != NULL;
    int smp = r->eng->ops->forward_sample != NULL;
    uint32_t n_want = 0;
    for (uint32_t i = 0; i < plan->n_run; i++) {
        const tm_sched_run *e = &plan->run[i];
        const seq *s = &r->seqs[e->slot];
        r->bseqs[i] = (tm_batch_seq){
            .tokens = s->q.ids.ids + e->pos,
            .n_tok = e->n_tok,
            .pos = e->pos,
            .block_table = s->q.blocks,
            .n_block = e->n_block,
            .want_logits = e->want_logits,
            .n_logits = e->n_draft ? e->n_tok : 0,
        };
        g = g && (!e->want_logits || row_is_greedy(r, s));
        for (uint32_t k = 0; e->want_logits && smp && row_is_sampled(s) && k <= e->n_draft; k++)
            r->srows[n_want++] = (tm_engine_sample_row){.p = spec_row_params(s, k),
                                                        .step = s->n_gen + k,
                                                        .want_lp = s->lp != NULL,
                                                        .n_top = s->n_top};
        if (e->want_logits && smp && !row_is_sampled(s) && !row_scored(r, s, &r->srows[n_want++]))
            smp = 0;
    }
    tm_batch b = {.seqs = r->bseqs, .n_seq = plan->n_run};
    double t0 = tm_now_ms();
    tm_rc rc = TM_E_AGAIN;
    if (g)
        rc = r->eng->ops->forward_greedy(r->eng, &b, r->n_vocab_tok, r->ids, err);
    else if (smp && n_want)
        rc = r->eng->ops->forward_sample(r->eng, &b, r->n_vocab_tok, r->srows, r->souts, err);
    *greedy = g ? 1 : 2;
    if (rc == TM_E_AGAIN) { // no sampler on the engine for these rows: logits to the host
        rc = tm_engine_forward(r->eng, &b, r->logits, err);
        *greedy = 0;
    }
    if (rc == TM_OK) // rows computed from weights the file no longer has are not emitted
        rc = tm_model_check_files(r->eng->model, err);
    if (rc)
        return rc;
    *dt_s = (tm_now_ms() - t0) / 1e3;
    return TM_OK;
}

// The step's counters; its time is split pro rata between prefill and decode tokens.
static void book_step(runner *r, const tm_sched_plan *plan, int greedy, double dt_s) {
    const uint32_t n_pre = plan->n_tok_prefill, n_dec = plan->n_tok_decode;
    tm_runner_stats *st = r->stats;
    st->n_step++;
    st->n_step_greedy += greedy == 1;
    st->n_step_sampled += greedy == 2;
    st->n_tok_prefill += n_pre;
    st->n_tok_decode += n_dec;
    st->prefill_s += dt_s * n_pre / (n_pre + n_dec);
    st->decode_s += dt_s * n_dec / (n_pre + n_dec);
    st->sum_step_fill += (double)(n_pre + n_dec) / r->cfg->max_batched_tokens;
    st->sum_running += plan->n_run;
    if (r->cfg->live_tok_prompt)
        atomic_fetch_add_explicit(r->cfg->live_tok_prompt, n_pre, memory_order_relaxed);
}

// The token of s's generated-token row w (its id in a greedy step, its pick in a sampled one, else
// its logits row sampled here), its logprobs appended when the record wants them.
static tm_rc sample_row(runner *r, seq *s, uint32_t w, int greedy, uint32_t *id, tm_err *err) {
    const float *lg = r->logits + (size_t)w * r->n_vocab;
    tm_rc rc;
    if (greedy == 1)
        rc = greedy_token(r, r->ids[w], id, err);
    else if (greedy == 2)
        rc = sampled_token(r, r->souts[w].id, id, err);
    else {
        const tm_sample_params p = row_params(s);
        rc = record_fault(tm_sample_token(lg, r->n_vocab_tok, &p, s->n_gen, &r->scratch, id, err),
                          err);
    }
    if (rc == TM_OK && s->gd.ent && !tm_guided_allows(&s->gd, *id))
        rc = TM_ERR(err, TM_E_RECORD,
                    "structured output: engine %s picked token %u, which the mask forbids",
                    r->eng->ops->name, *id);
    if (rc == TM_OK && s->lp && greedy == 2) {
        const tm_engine_sample_out *o = &r->souts[w];
        rc = lp_push(s->lp, &s->lp_cap, *id, o->lp, o->top_ids, o->top_lp, err);
    } else if (rc == TM_OK && s->lp) {
        uint32_t am;
        float v;
        rc = lp_push_row(r, s->lp, &s->lp_cap, lg, *id, &am, &v, err);
    }
    return rc;
}

// Entry e's sequence s computed its chunk; w is its logits row (or id, in a greedy step) when it
// wants one: score the row, or sample the next token and check the stop conditions. A record
// whose row cannot be used (non-finite logits) fails on its own; other errors are fatal.
static tm_rc take_row(runner *r, seq *s, const tm_sched_run *e, uint32_t w, int greedy,
                      tm_err *err) {
    tm_rc rc = TM_OK;
    const float *lg = r->logits + (size_t)w * r->n_vocab;
    tm_sched_computed(&r->sched, &s->q);
    if (!e->want_logits) {
        // A record that wants no rows at all (max_tokens 0): done once computed.
        if (!s->q.gen && s->q.score_next >= s->q.score_end && s->q.n_done == s->q.ids.len)
            return finish(r, s, TM_FINISH_LENGTH, err);
        return TM_OK;
    }
    uint32_t id;
    if (s->q.score_next < s->q.score_end) {
        rc = score_row(r, s, lg, greedy == 2 ? &r->souts[w] : NULL, err);
        if (rc == TM_OK && s->q.score_next == s->q.score_end && !s->q.gen)
            rc = finish(r, s, TM_FINISH_LENGTH, err);
    } else {
        rc = sample_row(r, s, w, greedy, &id, err);
        if (rc == TM_OK)
            rc = on_token(r, s, id, err);
    }
    if (rc == TM_E_RECORD) {
        // Non-finite logits (or the like): this record fails, the job goes on.
        char msg[sizeof(err->msg)];
        memcpy(msg, err->msg, sizeof(msg));
        rc = fail_seq(r, s, msg, err);
    }
    return rc;
}

// ---- speculative decoding (runner/sched/spec.h) ----

// Before planning: n-gram drafts for each running record about to decode (its last generated
// token not yet computed; not the last prompt token of a chunked prefill), written after its ids
// (q.n_draft of them), at most spec_k, none past its max_tokens (the step's last row gives one more
// token) or its context. The adaptive rule may pause it. A constrained record (structured output)
// keeps the prefix of its drafts that its automaton allows (tm_guided_draft), each verification
// row with the mask of its position; MTP drafts are not made for it (they are chosen later).
static tm_rc spec_draft(runner *r, tm_err *err) {
    const tm_runner_cfg *cfg = r->cfg;
    double gain = 0;
    for (uint32_t i = 0; cfg->spec_k && i < cfg->max_seqs; i++) {
        seq *s = &r->seqs[i];
        tm_sched_seq *q = &s->q;
        if (!s->job || !q->gen || q->score_next < q->score_end || q->ids.len != q->n_done + 1 ||
            q->n_done < q->n_prompt || (s->gd.ent && cfg->spec_mtp) || !tm_spec_may_draft(&s->spec))
            continue;
        int64_t k = TM_MIN((int64_t)cfg->spec_k, (int64_t)s->max_tokens - s->n_gen - 1);
        k = TM_MIN(k, (int64_t)s->max_len - (int64_t)q->ids.len);
        if (k <= 0)
            continue;
        if (q->ids.cap < q->ids.len + (size_t)k + 1) { // grows like ids, not per step
            size_t cap = TM_MAX(2 * q->ids.cap, q->ids.len + TM_SPEC_MAX_K + 1);
            uint32_t *v = tm_realloc(q->ids.ids, cap * sizeof(*v));
            if (!v)
                return TM_ERR(err, TM_E_NOMEM, "token id array of %zu", cap);
            q->ids.ids = v;
            q->ids.cap = cap;
        }
        if (cfg->spec_mtp) { // k placeholders; mtp_chain fills drafts 2.. once planned
            q->n_draft = s->mtp_ok && s->mtp_at == q->n_done ? (uint32_t)k : 0;
            for (uint32_t j = 0; j < q->n_draft; j++)
                q->ids.ids[q->ids.len + j] = s->mtp_draft;
        } else if (cfg->spec_dspark) { // the block drafted after the last step (dsp_catch_up)
            q->n_draft = s->mtp_ok && s->mtp_at == q->n_done ? TM_MIN((uint32_t)k, s->n_dsp) : 0;
            memcpy(q->ids.ids + q->ids.len, s->dsp_draft, q->n_draft * sizeof(uint32_t));
        } else
            q->n_draft = tm_spec_ngram_propose(q->ids.ids, q->ids.len, cfg->spec_lookup_min,
                                               cfg->spec_lookup_max, (uint32_t)k,
                                               q->ids.ids + q->ids.len);
        if (s->gd.ent && q->n_draft) {
            uint32_t n_ok = 0;
            tm_rc rc = tm_guided_draft(r->gcache, &s->gd, q->ids.ids + q->ids.len, q->n_draft,
                                       s->spec_allow, &n_ok, err);
            if (rc)
                return rc;
            q->n_draft = n_ok;
        }
        gain += q->n_draft ? tm_spec_gain(&s->spec) : 0.0;
    }
    // The step gate (runner/sched/spec.h): drop this step's drafts when they would not pay.
    if (gain > 0 && !cfg->spec_no_gate &&
        !tm_spec_gate_open(gain, r->n_running, r->spec_t_spec, r->spec_t_plain))
        for (uint32_t i = 0; i < cfg->max_seqs; i++)
            if (r->seqs[i].q.n_draft) {
                r->seqs[i].q.n_draft = 0;
                tm_spec_gated(&r->seqs[i].spec);
                r->stats->n_spec_gated++;
            }
    return TM_OK;
}

// The sampling parameters of row k of a speculative entry: its history is ids and the first k
// drafts (the row is used only when they were all accepted), its step n_gen + k.
static tm_sample_params spec_row_params(const seq *s, uint32_t k) {
    tm_sample_params p = row_params(s);
    p.n_hist += k;
    p.n_mask = s->n_gen + k < s->min_tokens ? s->n_mask : 0;
    if (s->gd.ent && k) // structured output: the mask of the state after k drafts
        p.allow = s->spec_allow[k];
    return p;
}

// Entry e of s verified its e->n_draft drafts; rows w.. are its positions' rows. Row j picks the
// target's own token as take_row would at that point (greedy argmax, or tm_sample_token's draw
// keyed by (seed, step): with a point-mass draft, accepting it iff the draw equals it is the
// rejection sampling that keeps the target distribution, docs/sampling.md); the draft is accepted
// when they agree, and the first disagreement (or the row after the last draft) gives the one
// more token. Tokens go through on_token one by one, so stops apply exactly as without drafts.
// Then the KV of the rejected positions is rolled back (tm_sched_computed_keep).
static tm_rc take_spec(runner *r, seq *s, const tm_sched_run *e, uint32_t w, int greedy,
                       tm_err *err) {
    const uint32_t d = e->n_draft;
    uint32_t draft[TM_SPEC_MAX_K];
    memcpy(draft, s->q.ids.ids + s->q.ids.len, d * sizeof(*draft));
    tm_runner_stats *st = r->stats;
    st->n_spec_drafts++;
    st->n_spec_draft_tok += d;
    s->n_spec_drafts++;
    s->n_spec_draft_tok += d;
    uint32_t n_acc = 0;
    tm_rc rc = TM_OK;
    for (uint32_t j = 0; j <= d && rc == TM_OK && s->job; j++) {
        uint32_t id;
        rc = sample_row(r, s, w + j, greedy, &id, err);
        if (rc)
            break;
        const int ok = j < d && id == draft[j];
        if (ok) {
            n_acc++;
            st->n_spec_accepted++;
            st->spec_accepted_pos[j]++;
            s->n_spec_accepted++;
        }
        rc = on_token(r, s, id, err);
        if (!ok)
            break;
    }
    st->n_tok_decode -= d - n_acc; // rejected positions were not decoded
    if (rc == TM_E_RECORD) {
        char msg[sizeof(err->msg)];
        memcpy(msg, err->msg, sizeof(msg));
        return fail_seq(r, s, msg, err);
    }
    if (rc || !s->job)
        return rc; // fatal, or the record finished
    tm_spec_verified(&s->spec, d, n_acc);
    tm_sched_computed_keep(&r->sched, &s->q, 1 + n_acc);
    return TM_OK;
}

// ---- MTP drafts (docs/speculative.md "MTP") ----

static uint32_t argmax_row(const float *row, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        best = row[i] > row[best] ? i : best;
    return best;
}

// Run the MTP layer on the r->mseqs[0, n) (slots r->mslot); each one wants logits: its greedy
// draft goes to *dst[m] and its last output stream to its slot's r->mtp_st.
static tm_rc mtp_run(runner *r, uint32_t n, tm_err *err) {
    uint32_t **dst = r->mdst;
    tm_rc rc = r->eng->ops->draft(r->eng, r->mseqs, n, r->mtp_logits, r->mtp_out, err);
    if (rc)
        return rc;
    const size_t nd = r->mtp_nd;
    for (uint32_t m = 0, row = 0, w = 0; m < n; m++) {
        row += r->mseqs[m].n_tok;
        if (!r->mseqs[m].want_logits)
            continue;
        *dst[m] = argmax_row(r->mtp_logits + (size_t)w++ * r->n_vocab, r->n_vocab_tok);
        memcpy(r->mtp_st + r->mslot[m] * nd, r->mtp_out + (row - 1) * nd, nd * sizeof(float));
    }
    return TM_OK;
}

// The catch-up rows both drafters share: for every position the step kept of a generating
// sequence, its row of the step's hidden output (width floats a token) and the token after it,
// into r->mseqs / r->mslot (and, with dst, dst[n] = &s->mtp_draft); marks the sequences about to
// decode (mtp_ok, mtp_at). Returns the number of rows.
static uint32_t catch_up_rows(runner *r, const tm_sched_plan *plan, uint32_t width,
                              uint32_t **dst) {
    uint32_t n_h = 0, t0 = 0, n = 0;
    const float *h = r->eng->ops->hidden(r->eng, &n_h);
    for (uint32_t i = 0; i < plan->n_run; t0 += plan->run[i++].n_tok) {
        const tm_sched_run *e = &plan->run[i];
        seq *s = &r->seqs[e->slot];
        tm_sched_seq *q = &s->q;
        s->mtp_ok = 0;
        uint32_t end = TM_MIN(e->pos + e->n_tok, q->n_done);
        if (!s->job || !q->gen || !h || t0 + e->n_tok > n_h || q->ids.len < 1)
            continue;
        end = (uint32_t)TM_MIN((size_t)end, q->ids.len - 1); // each row needs its next token
        if (end <= e->pos)
            continue;
        const int want = q->n_done >= q->n_prompt && q->ids.len == q->n_done + 1 &&
                         end == q->n_done;
        r->mseqs[n] = (tm_engine_draft_seq){.hidden = h + (size_t)t0 * width,
                                            .next = q->ids.ids + e->pos + 1,
                                            .n_tok = end - e->pos,
                                            .pos = e->pos,
                                            .block_table = q->blocks,
                                            .n_block = TM_CEIL_DIV(end, r->cfg->block_size),
                                            .want_logits = want};
        r->mslot[n] = e->slot;
        if (dst)
            dst[n] = &s->mtp_draft;
        n++;
        s->mtp_ok = want, s->mtp_at = q->n_done;
    }
    return n;
}

// After a step's tokens: the MTP layer's rows for every position the step kept of a generating
// sequence (hidden: the main model's final streams there; next: the token after it), which keeps
// its KV state in step with the main layers' (rejected positions are overwritten when they are
// computed again, as theirs). A sequence now about to decode gets its first draft from its last
// row (s->mtp_draft for the decode at mtp_at = n_done).
static tm_rc mtp_catch_up(runner *r, const tm_sched_plan *plan, tm_err *err) {
    uint32_t n = catch_up_rows(r, plan, r->mtp_nd, r->mdst);
    return n ? mtp_run(r, n, err) : TM_OK;
}

// After planning: drafts 2.. of each planned decode with drafts, by chaining the MTP layer on its
// own output streams (draft j + 1 from the row at the position of draft j, whose next token is
// draft j), one MTP step per draft position for the whole batch. Those rows lie within the
// positions the plan gave the sequence blocks for; they are recomputed in the next catch-up.
static tm_rc mtp_chain(runner *r, const tm_sched_plan *plan, tm_err *err) {
    uint32_t **dst = r->mdst;
    for (uint32_t j = 1; j < TM_SPEC_MAX_K; j++) {
        uint32_t n = 0;
        for (uint32_t i = 0; i < plan->n_run; i++) {
            const tm_sched_run *e = &plan->run[i];
            seq *s = &r->seqs[e->slot];
            if (e->n_draft <= j || !s->mtp_ok)
                continue;
            uint32_t *d = s->q.ids.ids + s->q.ids.len; // the drafts
            r->mseqs[n] = (tm_engine_draft_seq){.hidden = r->mtp_st + e->slot * (size_t)r->mtp_nd,
                                                .next = d + j - 1,
                                                .n_tok = 1,
                                                .pos = e->pos + j - 1,
                                                .block_table = s->q.blocks,
                                                .n_block = e->n_block,
                                                .want_logits = 1};
            r->mslot[n] = e->slot;
            dst[n++] = d + j;
        }
        if (n == 0)
            return TM_OK;
        tm_rc rc = mtp_run(r, n, err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

// ---- DSpark drafts (docs/speculative.md "DSpark") ----

// After a step's tokens: the DSpark drafter's rows for every position the step kept of a
// generating sequence (hidden: the target layers' inputs there, captured by the step's forward;
// next: the token after it), which writes the stages' window KV in step with the main layers'.
// A sequence now about to decode also gets the draft block after its last row: its greedy picks
// (argmax over the model's whole vocabulary, the chain the drafter's Markov head followed) are
// its drafts for the decode at mtp_at = n_done, cut before the first id past the tokenizer's.
static tm_rc dsp_catch_up(runner *r, const tm_sched_plan *plan, tm_err *err) {
    uint32_t n = catch_up_rows(r, plan, r->dsp_w, NULL);
    if (!n)
        return TM_OK;
    tm_rc rc = r->eng->ops->draft(r->eng, r->mseqs, n, r->dsp_logits, r->dsp_conf, err);
    if (rc)
        return rc;
    for (uint32_t m = 0, w = 0; m < n; m++) {
        if (!r->mseqs[m].want_logits)
            continue;
        seq *s = &r->seqs[r->mslot[m]];
        const uint32_t nd = TM_MIN(r->dsp_out, (uint32_t)TM_SPEC_MAX_K);
        s->n_dsp = 0;
        const float t = r->cfg->spec_conf_threshold;
        for (uint32_t j = 0; j < r->dsp_out; j++, w++) {
            const uint32_t id = argmax_row(r->dsp_logits + (size_t)w * r->n_vocab, r->n_vocab);
            // DeepSpec's confidence_threshold: the drafts end before the first row whose
            // confidence probability sigmoid(logit) is below t (t 0: never)
            const int unsure = t > 0.0f && 1.0 / (1.0 + exp(-(double)r->dsp_conf[w])) < t;
            if (j < nd && s->n_dsp == j && id < r->n_vocab_tok && !unsure)
                s->dsp_draft[s->n_dsp++] = id;
        }
    }
    return TM_OK;
}

// Apply a plan: run the engine on it, book the step, then take each entry's row in plan order.
static tm_rc apply(runner *r, const tm_sched_plan *plan, tm_err *err) {
    r->stats->n_preempt += plan->n_preempt;
    int greedy = 0;
    double dt_s = 0;
    tm_rc rc = run_engine(r, plan, &greedy, &dt_s, err);
    if (rc)
        return rc;
    book_step(r, plan, greedy, dt_s);
    if (r->cfg->spec_k && plan->n_tok_prefill == 0) { // the step gate's times: decode-only steps
        int drafts = 0;
        for (uint32_t i = 0; i < plan->n_run; i++)
            drafts |= plan->run[i].n_draft > 0;
        double *t = drafts ? &r->spec_t_spec : &r->spec_t_plain;
        *t = *t > 0 ? 0.9 * *t + 0.1 * dt_s : dt_s;
    }
    uint32_t row = 0;
    for (uint32_t i = 0; i < plan->n_run; i++) {
        const tm_sched_run *e = &plan->run[i];
        seq *s = &r->seqs[e->slot];
        const uint32_t w = row; // this sequence's row (when it wants one)
        row += e->want_logits ? 1 + e->n_draft : 0;
        if (!s->job)
            continue; // its record failed earlier in this loop (a sibling's error)
        rc = e->n_draft ? take_spec(r, s, e, w, greedy, err) : take_row(r, s, e, w, greedy, err);
        if (rc)
            return rc;
    }
    return r->cfg->spec_mtp      ? mtp_catch_up(r, plan, err)
           : r->cfg->spec_dspark ? dsp_catch_up(r, plan, err)
                                 : TM_OK;
}

static tm_rc step(runner *r, tm_err *err) {
    tm_rc rc = spec_draft(r, err);
    if (rc)
        return rc;
    tm_sched_plan_step(&r->sched, &r->plan);
    rc = r->cfg->spec_mtp ? mtp_chain(r, &r->plan, err) : TM_OK;
    if (rc == TM_OK)
        rc = apply(r, &r->plan, err);
    for (uint32_t i = 0; r->cfg->spec_k && i < r->cfg->max_seqs; i++)
        r->seqs[i].q.n_draft = 0; // drafts live for one step (unscheduled ones are dropped)
    return rc;
}

static void runner_fini(runner *r) {
    for (uint32_t i = 0; r->seqs && i < r->cfg->max_seqs; i++) {
        seq *s = &r->seqs[i];
        if (!s->grp)
            tm_job_destroy(s->job);
        s->job = NULL;
        if (r->pool)
            seq_reset(r, s);
        group_unref(s->grp);
        s->grp = NULL;
        tm_free(s->q.blocks);
        tm_free(s->q.keys);
    }
    for (uint32_t i = r->win_head; i < r->win_len; i++) {
        tm_guide_cache_unref(r->gcache, r->win[i].gent);
        if (!r->win[i].grp)
            tm_job_destroy(r->win[i].job);
        group_unref(r->win[i].grp);
        tm_ids_fini(&r->win[i].ids);
    }
    tm_free(r->win);
    tm_free(r->seqs);
    tm_free(r->bseqs);
    tm_free(r->slots);
    tm_sched_plan_fini(&r->plan);
    tm_free(r->logits);
    tm_free(r->ids);
    tm_free(r->srows);
    tm_free(r->souts);
    tm_free(r->mseqs);
    tm_free(r->mslot);
    tm_free(r->mdst);
    tm_free(r->mtp_logits);
    tm_free(r->mtp_out);
    tm_free(r->mtp_st);
    tm_free(r->dsp_logits);
    tm_free(r->dsp_conf);
    tm_sample_scratch_fini(&r->scratch);
    if (r->gcache && r->stats)
        r->stats->guided = *tm_guide_cache_stats(r->gcache);
    tm_guide_cache_destroy(r->gcache);
    tm_chat_tpl_destroy(r->own_chat);
    tm_pcache_destroy(r->pcache); // before the pool: it drops its references there
    tm_kv_pool_destroy(r->pool);
}

tm_rc tm_runner_check_record(const tm_runner_cfg *cfg, const tm_tokenizer *tok, tm_job *job,
                             tm_errcode *code, tm_err *err) {
    *code = job->err_code;
    if (job->err_code != TM_ERRCODE_NONE)
        return TM_ERR(err, TM_E_RECORD, "%s", job->err_msg ? job->err_msg : "");
    runner r = {.cfg = cfg, .tok = tok, .bos_id = tm_tok_bos_id(tok), .chat = cfg->chat_tpl};
    uint64_t pool_tok = (uint64_t)cfg->n_kv_block * cfg->block_size;
    r.max_len = cfg->n_kv_block ? (uint32_t)TM_MIN((uint64_t)cfg->n_ctx, pool_tok) : cfg->n_ctx;
    pending p = {.job = job};
    tm_rc rc = prepare(&r, job, &p, code, err);
    if (p.grp) {
        p.grp->job = NULL; // the caller's
        group_unref(p.grp);
    }
    tm_ids_fini(&p.ids);
    return rc;
}

tm_rc tm_runner_run(const tm_runner_cfg *cfg, tm_engine *eng, const tm_tokenizer *tok, tm_queue *in,
                    tm_queue *out, tm_runner_stats *stats, tm_err *err) {
    runner r = {.cfg = cfg, .eng = eng, .tok = tok, .out = out, .stats = stats};
    tm_rc rc;
    const tm_model_cfg *mc = &eng->model->cfg;
    if (cfg->max_seqs == 0 || cfg->max_batched_tokens == 0 || cfg->block_size == 0)
        return TM_ERR(err, TM_E_INVAL, "runner: max_seqs, max_batched_tokens, block_size > 0");
    r.n_vocab = mc->n_vocab;
    // Checkpoints pad vocab_size past the tokenizer (DeepSeek V3: 129280 vs 128815 ids); the
    // padding ids have no text, so they are never sampled.
    r.n_vocab_tok = TM_MIN(mc->n_vocab, tm_tok_n_vocab(tok));
    r.bos_id = tm_tok_bos_id(tok);
    for (uint32_t i = 0; i < mc->n_eos; i++)
        r.eos_ids[r.n_eos++] = mc->eos_ids[i];
    if (tm_tok_eos_id(tok) >= 0 && !is_eos(&r, (uint32_t)tm_tok_eos_id(tok)))
        r.eos_ids[r.n_eos++] = tm_tok_eos_id(tok);
    uint64_t pool_tok = (uint64_t)cfg->n_kv_block * cfg->block_size;
    r.max_len = (uint32_t)TM_MIN((uint64_t)cfg->n_ctx, pool_tok);
    r.max_blocks_per_seq = TM_CEIL_DIV(r.max_len, cfg->block_size);

    rc = tm_kv_pool_create(&(tm_kv_cfg){.n_block = cfg->n_kv_block, .block_tok = cfg->block_size},
                           &r.pool, err);
    if (rc)
        return rc;
    if (cfg->prefix_cache) {
        rc = tm_pcache_create(r.pool, &r.pcache, err);
        if (rc)
            goto done;
    }
    r.win_cap = cfg->policy == TM_SCHED_PREFIX ? TM_MAX(cfg->lookahead, 1u) : 1;
    r.win = tm_calloc(r.win_cap, sizeof(*r.win));
    r.seqs = tm_calloc(cfg->max_seqs, sizeof(*r.seqs));
    r.bseqs = tm_calloc(cfg->max_seqs, sizeof(*r.bseqs));
    r.slots = tm_calloc(cfg->max_seqs, sizeof(*r.slots));
    r.max_rows = cfg->max_seqs;
    if (cfg->spec_k) { // each decode's drafts want rows too, within the step's tokens
        r.max_rows = (uint32_t)TM_MIN((uint64_t)cfg->max_seqs * (cfg->spec_k + 1),
                                      (uint64_t)TM_MAX(cfg->max_batched_tokens, cfg->max_seqs));
        if (cfg->spec_k > TM_SPEC_MAX_K || cfg->spec_lookup_min < 1 ||
            cfg->spec_lookup_min > cfg->spec_lookup_max) {
            rc = TM_ERR(err, TM_E_INVAL, "runner: speculative k %u (<= %u), lookup %u..%u",
                        cfg->spec_k, TM_SPEC_MAX_K, cfg->spec_lookup_min, cfg->spec_lookup_max);
            goto done;
        }
        const tm_engine_draft_info drafter = tm_engine_drafter(eng);
        r.mtp_nd = cfg->spec_mtp && drafter.kind == TM_DRAFT_MTP ? drafter.width : 0;
        if (stats)
            stats->spec_mtp = cfg->spec_mtp;
        if (cfg->spec_mtp && r.mtp_nd == 0) {
            rc = TM_ERR(err, TM_E_INVAL,
                        "engine.speculative.method: \"mtp\" needs a DeepSeek-V4 model with an MTP "
                        "layer on the cpu engine (engine %s, model %s one); use \"ngram\"",
                        eng->ops->name, tm_model_has_drafter(eng->model) ? "has" : "has no");
            goto done;
        }
        if (cfg->spec_dspark) {
            if (drafter.kind != TM_DRAFT_BLOCK) {
                rc = TM_ERR(err, TM_E_INVAL,
                            "engine.speculative.method: \"dspark\" needs a DeepSeek-V4.1 model "
                            "with DSpark stages (config dspark_block_size > 0, mtp.* tensors) on "
                            "the cpu engine with tp 1 (engine %s, model %s a drafter); use "
                            "\"ngram\"",
                            eng->ops->name, tm_model_has_drafter(eng->model) ? "has" : "has no");
                goto done;
            }
            if (cfg->spec_k > drafter.n_out) {
                rc = TM_ERR(err, TM_E_INVAL,
                            "engine.speculative.num_speculative_tokens: %u exceeds the model's "
                            "dspark_block_size %u (drafts per DSpark block)",
                            cfg->spec_k, drafter.n_out);
                goto done;
            }
            r.dsp_w = drafter.width;
            r.dsp_out = drafter.n_out;
            if (stats)
                stats->spec_dspark = true;
            r.mseqs = tm_calloc(cfg->max_seqs, sizeof(*r.mseqs));
            r.mslot = tm_calloc(cfg->max_seqs, sizeof(*r.mslot));
            r.dsp_logits = tm_calloc((size_t)cfg->max_seqs * drafter.n_out * r.n_vocab,
                                     sizeof(float));
            r.dsp_conf = tm_calloc((size_t)cfg->max_seqs * drafter.n_out, sizeof(float));
            if (!r.mseqs || !r.mslot || !r.dsp_logits || !r.dsp_conf) {
                rc = TM_ERR(err, TM_E_NOMEM, "runner: DSpark draft buffers");
                goto done;
            }
        }
        if (r.mtp_nd) {
            r.mseqs = tm_calloc(cfg->max_seqs, sizeof(*r.mseqs));
            r.mslot = tm_calloc(cfg->max_seqs, sizeof(*r.mslot));
            r.mdst = tm_calloc(cfg->max_seqs, sizeof(*r.mdst));
            r.mtp_logits = tm_calloc((size_t)cfg->max_seqs * r.n_vocab, sizeof(float));
            r.mtp_out = tm_calloc((size_t)cfg->max_batched_tokens * r.mtp_nd, sizeof(float));
            r.mtp_st = tm_calloc((size_t)cfg->max_seqs * r.mtp_nd, sizeof(float));
            if (!r.mseqs || !r.mslot || !r.mdst || !r.mtp_logits || !r.mtp_out || !r.mtp_st) {
                rc = TM_ERR(err, TM_E_NOMEM, "runner: MTP draft buffers");
                goto done;
            }
        }
        if (tm_engine_max_rows(&eng->opts) < r.max_rows) {
            rc = TM_ERR(err, TM_E_INVAL,
                        "runner: speculative decoding needs %u logits rows per step; the engine "
                        "holds %u (tm_engine_opts.max_rows)",
                        r.max_rows, tm_engine_max_rows(&eng->opts));
            goto done;
        }
    }
    r.logits = tm_calloc((size_t)r.max_rows * r.n_vocab, sizeof(float));
    r.ids = tm_calloc(r.max_rows, sizeof(uint32_t));
    r.srows = tm_calloc(r.max_rows, sizeof(*r.srows));
    r.souts = tm_calloc(r.max_rows, sizeof(*r.souts));
    if (!r.win || !r.seqs || !r.bseqs || !r.slots || !r.logits || !r.ids || !r.srows || !r.souts) {
        rc = TM_ERR(err, TM_E_NOMEM, "runner state for %u sequences", cfg->max_seqs);
        goto done;
    }
    for (uint32_t i = 0; i < cfg->max_seqs; i++) {
        r.seqs[i].q.blocks = tm_calloc(r.max_blocks_per_seq, sizeof(uint32_t));
        r.seqs[i].q.keys = tm_calloc(r.max_blocks_per_seq, sizeof(tm_bhash));
        if (!r.seqs[i].q.blocks || !r.seqs[i].q.keys) {
            rc = TM_ERR(err, TM_E_NOMEM, "block tables");
            goto done;
        }
        r.slots[i] = &r.seqs[i].q;
    }
    r.sched = (tm_sched){
        .cfg = {.max_seqs = cfg->max_seqs,
                .max_batched_tokens = cfg->max_batched_tokens,
                .block_size = cfg->block_size,
                .can_copy = eng->ops->kv_copy != NULL},
        .pool = r.pool,
        .pcache = r.pcache,
        .slots = r.slots,
    };
    rc = tm_sched_plan_init(&r.plan, cfg->max_seqs, err);
    if (rc)
        goto done;
    rc = tm_sample_scratch_init(&r.scratch, r.n_vocab, err);
    if (rc)
        goto done;
    rc = tm_guide_cache_create(tok, r.n_vocab_tok, r.eos_ids, r.n_eos, &r.gcache, err);
    if (rc)
        goto done;
    r.chat = cfg->chat_tpl;
    if (!r.chat) {
        rc = tm_chat_tpl_create(tok, cfg->chat_template, &r.own_chat, err);
        if (rc)
            goto done;
        r.chat = r.own_chat;
    }

    int input_open = 1;
    for (;;) {
        if (cfg->stop_on_signal && tm_stop_requested())
            break; // graceful stop: what was emitted gets committed, the rest runs next time
        // Refill the window once it is empty. The schedule is a function of the input and the job
        // (issue 35): the window is filled to lookahead records, or to the input's end, before
        // any of it is admitted, however fast ingest is. With admit_early (a stream: stdin,
        // Kafka) it takes what has arrived and blocks only when nothing runs.
        if (r.win_head == r.win_len && input_open) {
            r.win_head = r.win_len = 0;
            while (input_open && r.win_len < r.win_cap) {
                void *item = NULL;
                int wait = !cfg->admit_early || (r.n_running == 0 && r.win_len == 0);
                tm_rc qrc = wait ? tm_queue_pop(in, &item) : tm_queue_try_pop(in, &item);
                if (qrc == TM_E_EOF) {
                    input_open = 0;
                    break;
                }
                if (qrc == TM_E_AGAIN)
                    break;
                rc = window_add(&r, item, err);
                if (rc)
                    goto done;
            }
            if (cfg->policy == TM_SCHED_PREFIX)
                window_order(&r);
        }
        while (r.n_running < cfg->max_seqs && r.win_head < r.win_len) {
            rc = admit(&r, err);
            if (rc)
                goto done;
        }
        if (r.n_running == 0) {
            if (!input_open && r.win_head == r.win_len)
                break;
            continue;
        }
        rc = step(&r, err);
        if (rc)
            goto done;
    }
    rc = TM_OK;
    const tm_guide_stats *gs = tm_guide_cache_stats(r.gcache);
    if (gs->n_unfinished)
        TM_LOG_WARN("runner",
                    "%llu constrained record(s) reached max_tokens or the context before their "
                    "structured output was complete: finish_reason \"length\", text cut short",
                    (unsigned long long)gs->n_unfinished);
done:
    runner_fini(&r);
    return rc;
}
