/* runner/engine/cpu/engine_tp.c - tensor parallel on the CPU in one process: tp_size shard
 * engines (engine_cpu.c with tp_rank set), one worker thread per rank, and an in-process
 * all-reduce standing in for NCCL's. It exists to test the sharding math (TP=2, TP=4 must match
 * TP=1) on machines without GPUs; it is not a way to make CPU inference faster.
 *
 * The all-reduce: each rank publishes its buffer, a barrier, each rank sums its 1/tp share of the
 * elements over all ranks in rank order into a shared buffer, a barrier, each rank copies the sum
 * back, a barrier. Every rank gets the same bits. One thread drives the engine; forward blocks
 * until every rank has finished the step. tm_engine_cpu_tp_run (runner/engine/cpu/dsv4.h) hands
 * the ranks another job the same way (the DeepSeek-V4 MTP forward). */
#include <pthread.h>
#include <string.h>

#include "base/alloc.h"
#include "runner/engine/cpu/dsv4.h"
#include "runner/engine/engine.h"
#include "runner/tp/shard.h"

typedef struct tp_impl tp_impl;

typedef struct rank_ctx {
    tp_impl *tp;
    uint32_t rank;
} rank_ctx;

struct tp_impl {
    tm_engine eng;      /* eng.impl points back here */
    uint32_t n;         /* ranks */
    tm_engine **ranks;  /* [n] owned shard engines */
    rank_ctx *ctx;      /* [n] */
    pthread_t *threads; /* [n] */
    uint32_t n_started;
    float **rank_logits; /* [n] [max_seqs][vocab slice] */
    uint32_t *vocab0;    /* [n] first vocabulary row of each rank */
    uint32_t *n_vocab;   /* [n] vocabulary rows of each rank */
    tm_rc *rc;           /* [n] result of the last step per rank */
    tm_err *errs;        /* [n] */
    /* all-reduce */
    pthread_barrier_t bar;
    int bar_ok;
    float **pub; /* [n] buffers published for the current all-reduce */
    float *sum;  /* [max_batched_tokens * n_embd] */
    /* step hand-off */
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t gen; /* incremented per step */
    uint32_t n_done;
    int quit;
    const tm_batch *b;
    tm_cpu_tp_job job; /* non-NULL: the step runs job on every rank instead of a forward */
    void *job_ctx;
};

static void tp_allreduce(void *vctx, float *buf, size_t n) {
    rank_ctx *rc = vctx;
    tp_impl *tp = rc->tp;
    tp->pub[rc->rank] = buf;
    pthread_barrier_wait(&tp->bar);
    size_t per = (n + tp->n - 1) / tp->n;
    size_t i0 = TM_MIN(rc->rank * per, n), i1 = TM_MIN(i0 + per, n);
    for (size_t i = i0; i < i1; i++) {
        float s = 0.0f;
        for (uint32_t r = 0; r < tp->n; r++)
            s += tp->pub[r][i];
        tp->sum[i] = s;
    }
    pthread_barrier_wait(&tp->bar);
    memcpy(buf, tp->sum, n * sizeof(float));
    pthread_barrier_wait(&tp->bar); // nobody reuses sum before everyone has copied it
}

static void *rank_main(void *arg) {
    rank_ctx *rc = arg;
    tp_impl *tp = rc->tp;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (tp->gen == seen && !tp->quit)
            pthread_cond_wait(&tp->cv_go, &tp->mu);
        if (tp->quit) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = tp->gen;
        const tm_batch *b = tp->b;
        tm_cpu_tp_job job = tp->job;
        void *job_ctx = tp->job_ctx;
        pthread_mutex_unlock(&tp->mu);
        tm_err *err = &tp->errs[rc->rank];
        if (job)
            tp->rc[rc->rank] = job(tp->ranks[rc->rank], rc->rank, job_ctx, err);
        else
            tp->rc[rc->rank] = tm_engine_forward(tp->ranks[rc->rank], b, tp->rank_logits[rc->rank],
                                                 err);
        pthread_mutex_lock(&tp->mu);
        if (++tp->n_done == tp->n)
            pthread_cond_signal(&tp->cv_done);
        pthread_mutex_unlock(&tp->mu);
    }
}

static tm_rc tp_forward(tm_engine *eng, const tm_batch *b, float *logits, tm_err *err) {
    tp_impl *tp = eng->impl;
    pthread_mutex_lock(&tp->mu);
    tp->b = b;
    tp->job = NULL;
    tp->n_done = 0;
    tp->gen++;
    pthread_cond_broadcast(&tp->cv_go);
    while (tp->n_done < tp->n)
        pthread_cond_wait(&tp->cv_done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    // A rank that fails before an all-reduce would leave the others waiting at the barrier;
    // shard engines only fail in their argument checks, which every rank runs identically.
    for (uint32_t r = 0; r < tp->n; r++)
        if (tp->rc[r]) {
            *err = tp->errs[r];
            return tp->rc[r];
        }
    const uint32_t n_vocab = eng->model->cfg.n_vocab;
    uint32_t n_want = 0;
    for (uint32_t i = 0; i < b->n_seq; i++)
        n_want += tm_batch_seq_rows(&b->seqs[i]);
    for (uint32_t w = 0; w < n_want; w++)
        for (uint32_t r = 0; r < tp->n; r++)
            memcpy(logits + (size_t)w * n_vocab + tp->vocab0[r],
                   tp->rank_logits[r] + (size_t)w * tp->n_vocab[r], tp->n_vocab[r] * sizeof(float));
    return TM_OK;
}

static tm_rc tp_kv_copy(tm_engine *eng, uint32_t src, uint32_t dst, uint32_t n_tok, tm_err *err) {
    tp_impl *tp = eng->impl;
    for (uint32_t r = 0; r < tp->n; r++) {
        tm_rc rc = tp->ranks[r]->ops->kv_copy(tp->ranks[r], src, dst, n_tok, err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

static void tp_destroy(tm_engine *eng) {
    if (!eng)
        return;
    tp_impl *tp = eng->impl;
    if (tp->n_started) {
        pthread_mutex_lock(&tp->mu);
        tp->quit = 1;
        pthread_cond_broadcast(&tp->cv_go);
        pthread_mutex_unlock(&tp->mu);
        for (uint32_t r = 0; r < tp->n_started; r++)
            pthread_join(tp->threads[r], NULL);
    }
    for (uint32_t r = 0; tp->ranks && r < tp->n; r++) {
        tm_engine_destroy(tp->ranks[r]);
        if (tp->rank_logits)
            tm_free(tp->rank_logits[r]);
    }
    if (tp->bar_ok)
        pthread_barrier_destroy(&tp->bar);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv_go);
    pthread_cond_destroy(&tp->cv_done);
    tm_free(tp->ranks);
    tm_free(tp->ctx);
    tm_free(tp->threads);
    tm_free(tp->rank_logits);
    tm_free(tp->vocab0);
    tm_free(tp->n_vocab);
    tm_free(tp->rc);
    tm_free(tp->errs);
    tm_free(tp->pub);
    tm_free(tp->sum);
    tm_free(tp);
}

// The drafter ops go to rank 0's engine, handed this engine (engine.h: its ops accept it and
// run every rank through tm_engine_cpu_tp_run where the drafter is split).
static void tp_draft_info(const tm_engine *eng, tm_engine_draft_info *info) {
    const tp_impl *tp = eng->impl;
    const tm_engine_ops *r0 = tp->ranks[0]->ops;
    *info = (tm_engine_draft_info){TM_DRAFT_NONE, 0, 0, 0};
    if (r0->draft_info && r0->hidden && r0->draft)
        r0->draft_info(eng, info);
}

static const float *tp_hidden(const tm_engine *eng, uint32_t *n_tok) {
    const tp_impl *tp = eng->impl;
    *n_tok = 0;
    return tp->ranks[0]->ops->hidden ? tp->ranks[0]->ops->hidden(eng, n_tok) : NULL;
}

static tm_rc tp_draft(tm_engine *eng, const tm_engine_draft_seq *seqs, uint32_t n_seq,
                      float *logits, float *hidden_out, tm_err *err) {
    const tp_impl *tp = eng->impl;
    if (!tp->ranks[0]->ops->draft)
        return TM_ERR(err, TM_E_INVAL, "tp engine: the model has no drafter");
    return tp->ranks[0]->ops->draft(eng, seqs, n_seq, logits, hidden_out, err);
}

static const tm_engine_ops tp_ops = {
    .name = "cpu-tp",
    .kv_auto = "f32",
    .forward = tp_forward,
    .kv_copy = tp_kv_copy,
    .draft_info = tp_draft_info,
    .hidden = tp_hidden,
    .draft = tp_draft,
    .destroy = tp_destroy,
};

tm_engine *tm_engine_cpu_tp_rank(tm_engine *eng, uint32_t rank) {
    if (!eng || eng->ops != &tp_ops)
        return NULL;
    tp_impl *tp = eng->impl;
    return rank < tp->n ? tp->ranks[rank] : NULL;
}

tm_rc tm_engine_cpu_tp_run(tm_engine *eng, tm_cpu_tp_job job, void *ctx, tm_err *err) {
    if (!eng || eng->ops != &tp_ops)
        return TM_ERR(err, TM_E_INVAL, "tp engine: not a CPU tensor-parallel engine");
    tp_impl *tp = eng->impl;
    pthread_mutex_lock(&tp->mu);
    tp->job = job;
    tp->job_ctx = ctx;
    tp->n_done = 0;
    tp->gen++;
    pthread_cond_broadcast(&tp->cv_go);
    while (tp->n_done < tp->n)
        pthread_cond_wait(&tp->cv_done, &tp->mu);
    tp->job = NULL;
    pthread_mutex_unlock(&tp->mu);
    for (uint32_t r = 0; r < tp->n; r++)
        if (tp->rc[r]) {
            *err = tp->errs[r];
            return tp->rc[r];
        }
    return TM_OK;
}

tm_rc tm_engine_cpu_tp_create(const tm_model *m, const tm_engine_opts *opts, tm_engine **out,
                              tm_err *err) {
    const uint32_t n = opts->tp_size;
    if (n < 2)
        return tm_engine_cpu_create(m, opts, out, err);
    tp_impl *tp = tm_calloc(1, sizeof(*tp));
    if (!tp)
        return TM_ERR(err, TM_E_NOMEM, "tp engine header");
    tp->eng = (tm_engine){.ops = &tp_ops, .model = m, .opts = *opts, .impl = tp};
    tp->n = n;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv_go, NULL);
    pthread_cond_init(&tp->cv_done, NULL);
    tm_rc rc;
    tp->ranks = tm_calloc(n, sizeof(*tp->ranks));
    tp->ctx = tm_calloc(n, sizeof(*tp->ctx));
    tp->threads = tm_calloc(n, sizeof(*tp->threads));
    tp->rank_logits = tm_calloc(n, sizeof(*tp->rank_logits));
    tp->vocab0 = tm_calloc(n, sizeof(*tp->vocab0));
    tp->n_vocab = tm_calloc(n, sizeof(*tp->n_vocab));
    tp->rc = tm_calloc(n, sizeof(*tp->rc));
    tp->errs = tm_calloc(n, sizeof(*tp->errs));
    tp->pub = tm_calloc(n, sizeof(*tp->pub));
    tp->sum = tm_calloc((size_t)opts->max_batched_tokens * m->cfg.n_embd, sizeof(float));
    if (!tp->ranks || !tp->ctx || !tp->threads || !tp->rank_logits || !tp->vocab0 || !tp->n_vocab ||
        !tp->rc || !tp->errs || !tp->pub || !tp->sum) {
        rc = TM_ERR(err, TM_E_NOMEM, "tp engine state for %u ranks", n);
        goto fail;
    }
    if (pthread_barrier_init(&tp->bar, NULL, n) != 0) {
        rc = TM_ERR(err, TM_E_INTERNAL, "tp engine: barrier");
        goto fail;
    }
    tp->bar_ok = 1;
    for (uint32_t r = 0; r < n; r++) {
        tp->ctx[r] = (rank_ctx){.tp = tp, .rank = r};
        tm_engine_opts ro = *opts;
        ro.tp_rank = r;
        ro.n_threads = TM_MAX(opts->n_threads / n, 1u);
        ro.allreduce = tp_allreduce;
        ro.allreduce_ctx = &tp->ctx[r];
        rc = tm_engine_cpu_create(m, &ro, &tp->ranks[r], err);
        if (rc) {
            tm_err_wrap(err, "tp rank %u of %u", r, n);
            goto fail;
        }
        tm_shard_split sp; // rank r's vocabulary rows, as its engine's shard holds them
        rc = tm_shard_split_init(&sp, &m->cfg, r, n, "tp shard", err);
        if (rc)
            goto fail;
        tp->vocab0[r] = sp.vocab0;
        tp->n_vocab[r] = sp.cfg.n_vocab;
        tp->rank_logits[r] =
            tm_calloc((size_t)tm_engine_max_rows(opts) * TM_MAX(tp->n_vocab[r], 1u), sizeof(float));
        if (!tp->rank_logits[r]) {
            rc = TM_ERR(err, TM_E_NOMEM, "tp rank %u logits", r);
            goto fail;
        }
    }
    for (uint32_t r = 0; r < n; r++) {
        if (pthread_create(&tp->threads[r], NULL, rank_main, &tp->ctx[r]) != 0) {
            rc = TM_ERR(err, TM_E_INTERNAL, "tp engine: cannot start rank thread %u", r);
            goto fail;
        }
        tp->n_started++;
    }
    *out = &tp->eng;
    return TM_OK;
fail:
    tp_destroy(&tp->eng);
    return rc;
}
