/* sink/writer.c - the sink thread's loop and the commit (sink/writer.h): records go to their
 * outputs through the output table (sink/out.h), the commit runs the outputs' commits, then the
 * manifest, then the acks. */
#define _POSIX_C_SOURCE 200809L
#include "sink/writer.h"

#include <pthread.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/seqset.h"

typedef struct writer_out {
    tm_sink_out out;
    unsigned routes; /* TM_SINK_ROUTE_* */
    bool closed;
} writer_out;

struct tm_sink_writer {
    tm_sink_writer_cfg cfg;
    tm_manifest *man; /* cfg.man */
    writer_out outs[TM_SINK_WRITER_MAX_OUTS];
    size_t n_outs;
    tm_queue *q;
    pthread_t thread;
    uint64_t *pending; /* [n_pending] seq_nos written since the last commit (to ack) */
    size_t n_pending, cap_pending;
    double last_commit_ms;
    tm_sink_writer_stats st;
    tm_rc rc;
    tm_err err;
};

tm_rc tm_sink_writer_create(const tm_sink_writer_cfg *cfg, tm_sink_writer **out, tm_err *err) {
    tm_sink_writer *w = tm_calloc(1, sizeof(*w));
    if (!w)
        return TM_ERR(err, TM_E_NOMEM, "sink writer");
    w->cfg = *cfg;
    w->man = cfg->man;
    *out = w;
    return TM_OK;
}

void tm_sink_writer_add(tm_sink_writer *w, tm_sink_out out, unsigned routes) {
    TM_ASSERT(w->n_outs < TM_SINK_WRITER_MAX_OUTS);
    w->outs[w->n_outs++] = (writer_out){.out = out, .routes = routes};
}

// The output that takes this kind of record: the last added one that routes it.
static writer_out *route(tm_sink_writer *w, const tm_completion *comp) {
    unsigned kind = comp->err_code == TM_ERRCODE_NONE ? TM_SINK_ROUTE_OK : TM_SINK_ROUTE_ERR;
    for (size_t i = w->n_outs; i-- > 0;)
        if (w->outs[i].routes & kind)
            return &w->outs[i];
    return NULL;
}

// One commit (sink/manifest.h): the input's positions, every output durable (Kafka acks and
// transaction, then frame close + fsync of the data files), manifest publish; then the input
// hears which records became durable.
static tm_rc commit(tm_sink_writer *w, tm_err *err) {
    const tm_sink_writer_input *in = &w->cfg.input;
    double t0 = tm_now_ms();
    tm_sink_commit ci = {0};
    tm_rc rc = TM_OK;
    if (in->prepare)
        rc = in->prepare(in->ctx, w->pending, w->n_pending, w->man, &ci, err);
    for (size_t i = w->n_outs; !rc && i-- > 0;)
        rc = w->outs[i].out.ops->commit(w->outs[i].out.self, &ci, err);
    if (rc)
        return rc;
    if (in->seal)
        in->seal(in->ctx, w->man);
    if (ci.files_set) {
        w->man->bytes_completions = ci.bytes_completions;
        w->man->bytes_errors = ci.bytes_errors;
    }
    w->man->n_commits++;
    if (w->st.n_commits == 0)
        w->man->n_runs++;
    rc = tm_manifest_save(w->cfg.dir, w->man, err);
    if (rc)
        return rc;
    rc = in->ack(in->ctx, w->pending, w->n_pending, err);
    w->n_pending = 0;
    double t1 = tm_now_ms();
    w->st.n_commits++;
    w->st.commit_ms_total += t1 - t0;
    w->st.commit_ms_max = TM_MAX(w->st.commit_ms_max, t1 - t0);
    w->last_commit_ms = t1;
    return rc;
}

// Write one finished record to its output (ok records to Kafka or the completions file, errors
// to errors.jsonl); then it is part of the next commit (done set, counts, acks).
// A released record (tm_completion.released) writes and counts nothing: only its seq_no joins the
// done set and the acks, so that they stay dense (its source never makes it done).
static tm_rc write_record(tm_sink_writer *w, const tm_completion *comp, tm_err *err) {
    tm_rc rc = TM_OK;
    if (!comp->released) {
        writer_out *o = route(w, comp);
        TM_ASSERT(o);
        rc = o->out.ops->write(o->out.self, comp, err);
        if (rc)
            return rc;
    }
    tm_manifest *m = w->man;
    rc = tm_seqset_add(&m->done, comp->seq_no, err);
    if (rc)
        return rc;
    if (comp->released) {
    } else if (comp->err_code == TM_ERRCODE_NONE) {
        m->counts.n_ok++;
        m->counts.n_tok_prompt += comp->n_tok_prompt;
        m->counts.n_tok_cached += comp->n_tok_cached;
        m->counts.n_tok_gen += comp->n_tok_gen;
    } else {
        m->counts.n_failed++;
        if ((unsigned)comp->err_code < TM_ERRCODE_COUNT)
            m->counts.n_err_by_code[comp->err_code]++;
    }
    if (w->n_pending == w->cap_pending) {
        size_t cap = w->cap_pending ? w->cap_pending * 2 : 1024;
        uint64_t *p = tm_realloc(w->pending, cap * sizeof(*p));
        if (!p)
            return TM_ERR(err, TM_E_NOMEM, "pending acks");
        w->pending = p;
        w->cap_pending = cap;
    }
    w->pending[w->n_pending++] = comp->seq_no;
    return TM_OK;
}

static bool commit_due(const tm_sink_writer *w) {
    return w->n_pending > 0 && (w->n_pending >= w->cfg.commit_every_records ||
                                tm_now_ms() - w->last_commit_ms >= w->cfg.commit_every_ms);
}

// The outputs' poll (delivery reports) between records.
static tm_rc poll_outs(tm_sink_writer *w, tm_err *err) {
    tm_rc rc = TM_OK;
    for (size_t i = 0; i < w->n_outs && !rc; i++)
        if (w->outs[i].out.ops->poll)
            rc = w->outs[i].out.ops->poll(w->outs[i].out.self, err);
    return rc;
}

static void *writer_main(void *arg) {
    tm_sink_writer *w = arg;
    void *item;
    w->last_commit_ms = tm_now_ms();
    for (;;) {
        // Wake up now and then with no record, so progress and GPU power keep being sampled.
        tm_rc qrc = tm_queue_pop_timed(w->q, &item, 200);
        tm_metrics_poll_gpus(w->cfg.metrics);
        tm_progress_tick(w->cfg.progress);
        if (w->rc == TM_OK)
            w->rc = poll_outs(w, &w->err);
        if (qrc == TM_E_AGAIN) {
            if (w->rc == TM_OK && commit_due(w))
                w->rc = commit(w, &w->err);
            continue;
        }
        if (qrc != TM_OK)
            break;
        tm_completion *comp = item;
        tm_progress_add_record(w->cfg.progress, comp);
        if (w->rc == TM_OK) {
            w->rc = write_record(w, comp, &w->err);
            if (w->rc == TM_OK && !comp->released)
                w->rc = tm_metrics_add_record(w->cfg.metrics, comp, &w->err);
            if (w->rc == TM_OK && commit_due(w))
                w->rc = commit(w, &w->err);
            w->st.n_ok += comp->err_code == TM_ERRCODE_NONE && !comp->released;
            w->st.n_err += comp->err_code != TM_ERRCODE_NONE;
            w->st.n_tok_prompt += comp->n_tok_prompt;
            w->st.n_tok_gen += comp->n_tok_gen;
        }
        tm_completion_destroy(comp);
    }
    return NULL;
}

tm_rc tm_sink_writer_start(tm_sink_writer *w, tm_queue *q, tm_err *err) {
    w->q = q;
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0)
        return TM_ERR(err, TM_E_INTERNAL, "cannot start the sink thread");
    return TM_OK;
}

void tm_sink_writer_join(tm_sink_writer *w) { pthread_join(w->thread, NULL); }

tm_rc tm_sink_writer_status(const tm_sink_writer *w, tm_err *err) {
    if (w->rc)
        *err = w->err;
    return w->rc;
}

tm_rc tm_sink_writer_commit(tm_sink_writer *w, tm_err *err) { return commit(w, err); }

void tm_sink_writer_get_stats(const tm_sink_writer *w, tm_sink_writer_stats *out) { *out = w->st; }

tm_rc tm_sink_writer_close(tm_sink_writer *w, tm_err *err) {
    if (!w)
        return TM_OK;
    tm_rc rc = TM_OK;
    for (size_t i = w->n_outs; i-- > 0;) {
        writer_out *o = &w->outs[i];
        if (o->closed)
            continue;
        o->closed = true;
        tm_err cerr = {0};
        tm_rc crc = o->out.ops->close(o->out.self, &cerr);
        if (crc && !rc) {
            *err = cerr;
            rc = crc;
        }
    }
    return rc;
}

void tm_sink_writer_destroy(tm_sink_writer *w) {
    if (!w)
        return;
    tm_sink_writer_close(w, &(tm_err){0});
    tm_free(w->pending);
    tm_free(w);
}
