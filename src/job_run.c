/* job_run.c - wires one job together: spec -> model + tokenizer -> engine; a source thread feeds
 * parsed records into a bounded queue, the runner (this thread) turns them into completions, and a
 * sink thread writes them and counts metrics. Queues are bounded, so memory does not grow with the
 * input. A fatal error in any stage stops the others: the source stops at its next push, the
 * runner drains, the sink closes its files (everything it wrote stays valid). */
#define _POSIX_C_SOURCE 200809L
#include "job_run.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/queue.h"
#include "ingest/job_spec.h"
#include "ingest/source.h"
#include "runner/engine.h"
#include "runner/engine_cuda.h"
#include "runner/model.h"
#include "runner/runner.h"
#include "runner/tokenizer.h"
#include "sink/metrics.h"
#include "sink/progress.h"
#include "sink/sink.h"

#define QUEUE_CAP 256
/* Default KV pool for the CPU engine: this many bytes at most (fp32 K and V). */
#define CPU_KV_BUDGET_BYTES (2ull << 30)

typedef struct source_ctx {
    tm_source *src;
    tm_queue *q;
    tm_progress *progress;
    tm_rc rc;
    tm_err err;
} source_ctx;

typedef struct sink_ctx {
    tm_sink *sink;
    tm_metrics *metrics;
    tm_progress *progress;
    tm_queue *q;
    uint64_t n_ok, n_err, n_tok_prompt, n_tok_gen;
    tm_rc rc;
    tm_err err;
} sink_ctx;

static void *source_main(void *arg) {
    source_ctx *c = arg;
    for (uint64_t n_read = 0;; n_read++) {
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(c->src, &job, &c->err);
        if (rc == TM_E_EOF) {
            tm_progress_set_total(c->progress, n_read); // now the progress line has a total
            break;
        }
        if (rc) {
            c->rc = rc;
            break;
        }
        if (tm_queue_push(c->q, job) != TM_OK) { // the runner stopped early
            tm_job_destroy(job);
            break;
        }
    }
    tm_queue_close(c->q);
    return NULL;
}

static void *sink_main(void *arg) {
    sink_ctx *c = arg;
    void *item;
    for (;;) {
        // Wake up now and then with no record, so progress and GPU power keep being sampled.
        tm_rc qrc = tm_queue_pop_timed(c->q, &item, 200);
        tm_metrics_poll_gpus(c->metrics);
        tm_progress_tick(c->progress);
        if (qrc == TM_E_AGAIN)
            continue;
        if (qrc != TM_OK)
            break;
        tm_completion *comp = item;
        tm_progress_add_record(c->progress, comp);
        if (c->rc == TM_OK) {
            c->rc = tm_sink_write(c->sink, comp, &c->err);
            if (c->rc == TM_OK)
                c->rc = tm_metrics_add_record(c->metrics, comp, &c->err);
            c->n_ok += comp->err_code == TM_ERRCODE_NONE;
            c->n_err += comp->err_code != TM_ERRCODE_NONE;
            c->n_tok_prompt += comp->n_tok_prompt;
            c->n_tok_gen += comp->n_tok_gen;
        }
        tm_completion_destroy(comp);
    }
    return NULL;
}

// Blocks for the CPU engine's KV pool: kv_blocks when the job sets it, else enough for max_seqs
// sequences of min(n_ctx, 8192) tokens within CPU_KV_BUDGET_BYTES (but at least one full
// context's worth of the smaller of the two).
static uint32_t cpu_kv_blocks(const tm_job_spec *spec, const tm_model_cfg *mc) {
    if (spec->engine.kv_blocks)
        return spec->engine.kv_blocks;
    const uint32_t bs = spec->engine.block_size;
    uint64_t per_block = 2ull * mc->n_layer * bs * mc->n_kv_head * mc->head_dim * sizeof(float);
    uint64_t per_seq = TM_CEIL_DIV(TM_MIN(mc->n_ctx, 8192u), bs);
    uint64_t want = per_seq * spec->engine.max_seqs;
    uint64_t cap = TM_MAX(CPU_KV_BUDGET_BYTES / per_block, per_seq);
    return (uint32_t)TM_MIN(want, cap);
}

// The engine the spec asks for. auto: the CUDA engine when this build has it and a GPU answers,
// else the CPU engine. cpu with tp > 1: shards in one process (tests the sharding math).
static tm_rc create_engine(const tm_job_spec *spec, const tm_model *m, tm_engine_opts *eo,
                           tm_engine **out, tm_err *err) {
    tm_backend be = spec->engine.backend;
    if (be == TM_BACKEND_CUDA || (be == TM_BACKEND_AUTO && spec->engine.tp <= 1)) {
        tm_rc rc = tm_engine_cuda_create(m, eo, out, err);
        if (rc == TM_OK || be == TM_BACKEND_CUDA)
            return rc;
        TM_LOG_INFO("job", "backend auto: no CUDA engine (%s); using the CPU engine", err->msg);
    }
    return tm_engine_cpu_tp_create(m, eo, out, err);
}

typedef struct job_parts {
    tm_job_spec *spec;
    tm_model *model;
    tm_tokenizer *tok;
} job_parts;

static void parts_fini(job_parts *p) {
    tm_tok_destroy(p->tok);
    tm_model_destroy(p->model);
    tm_job_spec_destroy(p->spec);
}

static tm_rc parts_load(const char *path, job_parts *p, tm_err *err) {
    tm_rc rc = tm_job_spec_load(path, &p->spec, err);
    if (rc)
        return rc;
    rc = tm_model_load(p->spec->model, &p->model, err);
    if (rc)
        return rc;
    rc = tm_tok_load(p->spec->model, &p->tok, err);
    if (rc)
        return rc;
    if (p->spec->engine.backend == TM_BACKEND_CUDA && p->spec->engine.tp > 1)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: engine.tp: tensor parallel over NCCL is not written yet; use tp 1 "
                      "with the cuda backend (the cpu backend runs tp > 1 in one process, to "
                      "test the sharding)",
                      path);
    if (tm_tok_n_vocab(p->tok) > p->model->cfg.n_vocab)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: the tokenizer has %u ids but the model's vocab_size is %u",
                      p->spec->model, tm_tok_n_vocab(p->tok), p->model->cfg.n_vocab);
    return TM_OK;
}

static tm_rc run_job(const char *path, tm_err *err) {
    job_parts p = {0};
    tm_engine *eng = NULL;
    tm_source *src = NULL;
    tm_sink *sink = NULL;
    tm_metrics *metrics = NULL;
    tm_progress *progress = NULL;
    tm_queue *q_in = NULL, *q_out = NULL;
    int src_started = 0, sink_started = 0;
    pthread_t src_thread, sink_thread;
    source_ctx sc = {0};
    sink_ctx kc = {0};
    tm_runner_stats stats = {0};
    double t0 = tm_now_ms();

    tm_rc rc = parts_load(path, &p, err);
    if (rc)
        goto done;
    const tm_job_spec *spec = p.spec;
    const tm_model_cfg *mc = &p.model->cfg;
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    tm_engine_opts eo = {
        .n_threads = spec->engine.threads ? spec->engine.threads : (uint32_t)TM_MAX(n_cpu, 1),
        .block_size = spec->engine.block_size,
        .n_kv_block = cpu_kv_blocks(spec, mc),
        .max_seqs = spec->engine.max_seqs,
        .max_batched_tokens = spec->engine.max_batched_tokens,
        .tp_size = spec->engine.tp,
    };
    rc = create_engine(spec, p.model, &eo, &eng, err);
    if (rc)
        goto done;
    const char *backend = eng->ops->name;
    TM_LOG_INFO("job", "%s: model %s (%s, %u layers, hidden %u, vocab %u), %s engine, tp %u, "
                "%u threads, %u KV blocks of %u tokens",
                path, spec->model, tm_model_arch_name(p.model), mc->n_layer, mc->n_embd,
                mc->n_vocab, backend, TM_MAX(eo.tp_size, 1u), eo.n_threads, eo.n_kv_block,
                eo.block_size);

    rc = tm_metrics_create(&metrics, err);
    if (rc)
        goto done;
    tm_metrics_settings ms = {
        .backend = backend,
        .tp = TM_MAX(eo.tp_size, 1u),
        .max_seqs = eo.max_seqs,
        .max_batched_tokens = eo.max_batched_tokens,
        .block_size = eo.block_size,
        .kv_blocks = eo.n_kv_block,
        .kv_dtype = strcmp(backend, "cuda") == 0 ? "bf16" : "f32",
        .prefix_cache = spec->engine.prefix_cache,
        .threads = eo.n_threads,
        .model_path = spec->model,
        .model_arch = tm_model_arch_name(p.model),
    };
    rc = tm_metrics_set_settings(metrics, &ms, err);
    if (rc)
        goto done;
    rc = tm_metrics_set_job(metrics, path, err);
    if (rc)
        goto done;
    rc = tm_progress_create(&(tm_progress_cfg){.job_name = path,
                                               .textfile = spec->prometheus_textfile},
                            &progress, err);
    if (rc)
        goto done;
    rc = tm_source_open(spec, &src, err);
    if (rc)
        goto done;
    rc = tm_sink_open(spec->output_dir, NULL, &sink, err);
    if (rc)
        goto done;
    rc = tm_queue_create(QUEUE_CAP, &q_in, err);
    if (rc)
        goto done;
    rc = tm_queue_create(QUEUE_CAP, &q_out, err);
    if (rc)
        goto done;

    sc = (source_ctx){.src = src, .q = q_in, .progress = progress};
    kc = (sink_ctx){.sink = sink, .metrics = metrics, .progress = progress, .q = q_out};
    if (pthread_create(&src_thread, NULL, source_main, &sc) != 0) {
        rc = TM_ERR(err, TM_E_INTERNAL, "cannot start the source thread");
        goto done;
    }
    src_started = 1;
    if (pthread_create(&sink_thread, NULL, sink_main, &kc) != 0) {
        rc = TM_ERR(err, TM_E_INTERNAL, "cannot start the sink thread");
        goto done;
    }
    sink_started = 1;

    tm_runner_cfg rcfg = {
        .max_seqs = eo.max_seqs,
        .max_batched_tokens = eo.max_batched_tokens,
        .block_size = eo.block_size,
        .n_kv_block = eo.n_kv_block,
        .n_ctx = mc->n_ctx,
        .defaults = spec->defaults,
        .prefix_cache = spec->engine.prefix_cache,
        .policy = spec->engine.schedule_fcfs ? TM_SCHED_FCFS : TM_SCHED_PREFIX,
        .lookahead = spec->engine.lookahead,
    };
    rc = tm_runner_run(&rcfg, eng, p.tok, q_in, q_out, &stats, err);

done:
    if (q_in)
        tm_queue_close(q_in); // stops the source if the runner ended early
    if (src_started) {
        pthread_join(src_thread, NULL);
        void *item;
        while (tm_queue_try_pop(q_in, &item) == TM_OK)
            tm_job_destroy(item);
    }
    if (q_out)
        tm_queue_close(q_out);
    if (sink_started) {
        pthread_join(sink_thread, NULL);
        tm_progress_finish(progress);
    }
    if (rc == TM_OK && sc.rc) {
        *err = sc.err;
        rc = sc.rc;
    }
    if (rc == TM_OK && kc.rc) {
        *err = kc.err;
        rc = kc.rc;
    }
    tm_err close_err = {0};
    tm_rc close_rc = tm_sink_close(sink, &close_err);
    if (rc == TM_OK && close_rc) {
        *err = close_err;
        rc = close_rc;
    }
    if (metrics && p.spec) {
        tm_metrics_add_engine(metrics, &(tm_metrics_engine){
                                           .steps = stats.n_step,
                                           .n_tok_prefill = stats.n_tok_prefill,
                                           .prefill_s = stats.prefill_s,
                                           .n_tok_decode = stats.n_tok_decode,
                                           .decode_s = stats.decode_s,
                                           .preemptions = stats.n_preempt,
                                           .sum_step_fill = stats.sum_step_fill,
                                           .sum_running = stats.sum_running,
                                       });
        tm_metrics_end(metrics);
        char mpath[4096];
        snprintf(mpath, sizeof(mpath), "%s/metrics.json", p.spec->output_dir);
        tm_err merr = {0};
        tm_rc mrc = tm_metrics_write_json(metrics, mpath, &merr);
        if (rc == TM_OK && mrc) {
            *err = merr;
            rc = mrc;
        }
    }
    if (rc == TM_OK && sink_started) {
        double wall_s = (tm_now_ms() - t0) / 1e3;
        uint64_t n_ok = kc.n_ok, n_err = kc.n_err;
        printf("tokenmill: %s done in %.1f s\n", path, wall_s);
        printf("  records   %llu in, %llu ok, %llu failed\n", (unsigned long long)(n_ok + n_err),
               (unsigned long long)n_ok, (unsigned long long)n_err);
        printf("  tokens    %llu prompt, %llu completion; %llu steps, %llu preemptions\n",
               (unsigned long long)kc.n_tok_prompt, (unsigned long long)kc.n_tok_gen,
               (unsigned long long)stats.n_step, (unsigned long long)stats.n_preempt);
        printf("  speed     prefill %.0f tok/s, decode %.1f tok/s, output %.1f tok/s overall\n",
               stats.prefill_s > 0 ? stats.n_tok_prefill / stats.prefill_s : 0.0,
               stats.decode_s > 0 ? stats.n_tok_decode / stats.decode_s : 0.0,
               kc.n_tok_gen / wall_s);
        printf("  outputs   %s/{completions.jsonl.lz4,errors.jsonl,metrics.json}\n",
               p.spec->output_dir);
    }
    tm_queue_destroy(q_in);
    tm_queue_destroy(q_out);
    tm_source_destroy(src);
    tm_metrics_destroy(metrics);
    tm_progress_destroy(progress);
    tm_engine_destroy(eng);
    parts_fini(&p);
    return rc;
}

tm_rc tm_job_run(const char *path) {
    tm_err err = {0};
    tm_rc rc = run_job(path, &err);
    if (rc)
        TM_LOG_ERROR("job", "%s: %s", path, err.msg);
    return rc;
}

static tm_rc validate_job(const char *path, tm_err *err) {
    job_parts p = {0};
    tm_source *src = NULL;
    tm_buf line = {0};
    uint64_t n_ok = 0, n_bad = 0;
    tm_rc rc = parts_load(path, &p, err);
    if (rc == TM_OK)
        rc = tm_source_open(p.spec, &src, err);
    while (rc == TM_OK) {
        tm_job *job = NULL;
        rc = tm_source_next(src, &job, err);
        if (rc)
            break;
        if (job->err_code == TM_ERRCODE_NONE) {
            n_ok++;
        } else {
            n_bad++;
            tm_completion c = {.file = job->file, .line = job->line, .id_json = job->id_json,
                               .err_code = job->err_code, .err_msg = job->err_msg};
            tm_buf_clear(&line);
            rc = tm_sink_format_error(&line, &c, err);
            if (rc == TM_OK)
                fputs(line.data, stdout);
        }
        tm_job_destroy(job);
    }
    if (rc == TM_E_EOF) {
        rc = TM_OK;
        printf("tokenmill: %s is valid: model %s (%s), %llu records ok, %llu rejected%s\n", path,
               p.spec->model, tm_model_arch_name(p.model), (unsigned long long)n_ok,
               (unsigned long long)n_bad, n_bad ? " (listed above)" : "");
    }
    tm_buf_fini(&line);
    tm_source_destroy(src);
    parts_fini(&p);
    return rc;
}

tm_rc tm_job_validate(const char *path) {
    tm_err err = {0};
    tm_rc rc = validate_job(path, &err);
    if (rc)
        TM_LOG_ERROR("validate", "%s: %s", path, err.msg);
    return rc;
}
