/* ingest/source.c - the shared part of every source: picks the kind that reads the job's input
 * (tm_source_kinds: files and standard input, Kafka; source_int.h is the table a kind implements),
 * owns the record parser the kind numbers its records with and the set of acknowledged seq_nos,
 * and forwards each tm_source call to the kind's operation, or answers for a kind without that
 * capability; for a sharded job (ingest/shard.h) it passes on only the shard's own records. It
 * knows no kind: a new one is a file implementing tm_source_ops and a line in
 * source_kinds.c. */
#include "ingest/source.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "base/alloc.h"
#include "base/seqset.h"
#include "ingest/rec_parser_int.h"
#include "ingest/shard.h"
#include "ingest/source_int.h"

struct tm_source {
    const tm_job_spec *spec;  /* borrowed */
    const tm_source_ops *ops; /* the kind that reads spec's input */
    void *self;               /* its state, owned */
    tm_rec_parser parser;     /* numbers and parses the records (lent to the kind) */
    pthread_mutex_t ack_mu;   /* guards acked (tm_source_ack comes from the sink thread) */
    tm_seqset acked;          /* seq_nos acknowledged as durable */
};

static tm_rc ack_from_kind(void *ctx, const uint64_t *seq_nos, size_t n, tm_err *err) {
    return tm_source_ack(ctx, seq_nos, n, err);
}

tm_rc tm_source_open(const tm_job_spec *spec, tm_source **out, tm_err *err) {
    tm_source *src = tm_calloc(1, sizeof(*src));
    if (!src)
        return TM_ERR(err, TM_E_NOMEM, "source");
    pthread_mutex_init(&src->ack_mu, NULL);
    src->spec = spec;
    tm_rec_parser_init(&src->parser, spec);
    src->ops = &tm_file_in_ops;
    for (size_t i = 0; tm_source_kinds[i]; i++)
        if (tm_source_kinds[i]->claims(spec)) {
            src->ops = tm_source_kinds[i];
            break;
        }
    const tm_source_env env = {.parser = &src->parser, .ack = ack_from_kind, .ack_ctx = src};
    if (src->ops->open(spec, &env, &src->self, err)) {
        tm_source_destroy(src);
        return err->rc;
    }
    *out = src;
    return TM_OK;
}

void tm_source_destroy(tm_source *src) {
    if (!src)
        return;
    src->ops->close(src->self); // a consumer commits what is durable and leaves its group
    tm_rec_parser_fini(&src->parser);
    tm_seqset_fini(&src->acked);
    pthread_mutex_destroy(&src->ack_mu);
    tm_free(src);
}

tm_rc tm_source_next(tm_source *src, tm_job **out, tm_err *err) {
    const tm_job_shard *sh = &src->spec->shard;
    for (;;) {
        tm_rc rc = src->ops->next(src->self, out, err);
        if (rc || !sh->active || tm_shard_of(*out, sh) == (uint32_t)sh->index)
            return rc;
        // Another shard's record: it was parsed (its id counts for duplicates, as in the whole
        // job) but is not numbered here, so this shard's seq_nos stay dense (resume, acks).
        tm_rec_parser_take_back(&src->parser, (*out)->seq_no);
        tm_job_destroy(*out);
        *out = NULL;
    }
}

tm_rc tm_source_set_input_sizes(tm_source *src, const int64_t *sizes, size_t n, tm_err *err) {
    TM_ASSERT(n == src->spec->n_inputs);
    return src->ops->set_input_sizes ? src->ops->set_input_sizes(src->self, sizes, n, err) : TM_OK;
}

void tm_source_stdin_fingerprint(tm_source *src, tm_source_stdin_fp *out) {
    if (src->ops->stdin_fingerprint)
        src->ops->stdin_fingerprint(src->self, out);
    else
        memset(out, 0, sizeof(*out));
}

void tm_source_stdin_resume(tm_source *src, const tm_seqset *skip, const tm_source_stdin_fp *fp) {
    if (src->ops->stdin_resume)
        src->ops->stdin_resume(src->self, skip, fp);
}

tm_rc tm_source_stdin_check(tm_source *src, tm_err *err) {
    return src->ops->stdin_check ? src->ops->stdin_check(src->self, err) : TM_OK;
}

uint64_t tm_source_n_skipped(const tm_source *src) {
    return src->ops->n_skipped ? src->ops->n_skipped(src->self) : 0;
}

tm_rc tm_source_ack(tm_source *src, const uint64_t *seq_nos, size_t n, tm_err *err) {
    tm_rc rc = TM_OK;
    pthread_mutex_lock(&src->ack_mu);
    for (size_t i = 0; i < n && !rc; i++)
        rc = tm_seqset_add(&src->acked, seq_nos[i], err);
    pthread_mutex_unlock(&src->ack_mu);
    if (!rc && src->ops->ack)
        rc = src->ops->ack(src->self, seq_nos, n, err);
    return rc;
}

bool tm_source_is_live(const tm_source *src) { return src->ops->live; }

tm_rc tm_source_wait(tm_source *src, const tm_job *held, int ms, bool *drop, tm_err *err) {
    *drop = false;
    if (!src->ops->wait)
        return TM_OK;
    tm_rc rc = src->ops->wait(src->self, held->seq_no, ms, drop, err);
    if (*drop) {
        // Nothing was numbered since the held record: the next record takes its seq_no.
        tm_rec_parser_take_back(&src->parser, held->seq_no);
    }
    return rc;
}

tm_rc tm_source_mark_written(tm_source *src, const uint64_t *seq_nos, size_t n, tm_err *err) {
    return src->ops->mark_written ? src->ops->mark_written(src->self, seq_nos, n, err) : TM_OK;
}

tm_rc tm_source_positions(tm_source *src, tm_source_kpos_fn fn, void *ctx, tm_err *err) {
    return src->ops->positions ? src->ops->positions(src->self, fn, ctx, err) : TM_OK;
}

tm_rc tm_source_resume_positions(tm_source *src, const tm_source_kpos *pos, tm_err *err) {
    return src->ops->resume_positions ? src->ops->resume_positions(src->self, pos, err) : TM_OK;
}

tm_rc tm_source_check_resume(tm_source *src, const char *cluster_before, tm_err *err) {
    return src->ops->check_resume ? src->ops->check_resume(src->self, cluster_before, err) : TM_OK;
}

tm_rc tm_source_linger(tm_source *src, int ms, tm_err *err) {
    return src->ops->linger ? src->ops->linger(src->self, ms, err) : TM_E_EOF;
}

size_t tm_source_kafka_lag(tm_source *src, tm_source_klag *out, size_t cap) {
    return src->ops->kafka_lag ? src->ops->kafka_lag(src->self, out, cap) : 0;
}

void tm_source_kafka_skips(tm_source *src, tm_source_kskips *out) {
    *out = (tm_source_kskips){0};
    if (src->ops->kafka_skips)
        src->ops->kafka_skips(src->self, out);
}

const char *tm_source_cluster_id(const tm_source *src) {
    return src->ops->cluster_id ? src->ops->cluster_id(src->self) : NULL;
}

void tm_source_set_txn(tm_source *src, bool on) {
    if (src->ops->set_txn)
        src->ops->set_txn(src->self, on);
}

void tm_source_set_release(tm_source *src, bool on) {
    if (src->ops->set_release)
        src->ops->set_release(src->self, on);
}

bool tm_source_start(tm_source *src, uint64_t seq_no) {
    return src->ops->start ? src->ops->start(src->self, seq_no) : true;
}

tm_rc tm_source_group_md(tm_source *src, tm_buf *out, tm_err *err) {
    if (!src->ops->group_md)
        return TM_ERR(err, TM_E_INVAL, "the job's input has no consumer group (%s)",
                      src->ops->name);
    return src->ops->group_md(src->self, out, err);
}

uint64_t tm_source_durable_watermark(tm_source *src) {
    pthread_mutex_lock(&src->ack_mu);
    uint64_t w = src->acked.watermark;
    pthread_mutex_unlock(&src->ack_mu);
    return w;
}

uint64_t tm_source_n_records(const tm_source *src) { return tm_rec_parser_n_records(&src->parser); }

size_t tm_source_line_cap(const tm_source *src) {
    return src->ops->line_cap ? src->ops->line_cap(src->self) : 0;
}
