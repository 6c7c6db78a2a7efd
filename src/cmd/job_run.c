/* cmd/job_run.c - wires one job together: spec -> model + tokenizer -> engine; a source thread
 * feeds parsed records into a bounded queue, the runner (this thread) turns them into completions,
 * and a sink thread writes them and counts metrics. Queues are bounded, so memory does not grow
 * with the input. A fatal error in any stage stops the others: the source stops at its next push,
 * the runner drains, the sink closes its files (everything it wrote stays valid). */
#define _POSIX_C_SOURCE 200809L
#include "cmd/job_run.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <lz4frame.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/fsutil.h"
#include "base/log.h"
#include "base/queue.h"
#include "base/seqset.h"
#include "base/stop.h"
#include "ingest/job_spec.h"
#include "ingest/source.h"
#include "runner/engine/engine.h"
#include "runner/engine/cuda/engine_cuda.h"
#include "runner/engram_map.h"
#include "runner/model/engram_hash.h"
#include "runner/model/model.h"
#include "runner/model/model_dsv41.h"
#include "runner/runner.h"
#include "runner/text/tokenizer.h"
#include "cmd/engine_opts.h"
#include "cmd/run_metrics.h"
#include "sink/kafka_out.h"
#include "sink/manifest.h"
#include "sink/metrics.h"
#include "sink/progress.h"
#include "sink/sink.h"
#include "sink/writer.h"
#include "cmd/tp_run.h"

#define QUEUE_CAP 256
/* Default KV pool for the CPU engine: this many bytes at most (fp32 K and V). */
#define CPU_KV_BUDGET_BYTES (2ull << 30)

typedef struct source_ctx {
    tm_source *src;
    tm_queue *q;
    tm_progress *progress;
    const tm_seqset *skip; /* records an earlier run committed (resume); borrowed, read-only */
    uint64_t n_skipped;
    bool eof;                   /* the whole input was read */
    bool stopped;               /* a file job's source stopped at a stop signal (base/stop.h) */
    _Atomic bool outputs_final; /* drain: the sink is joined; a lingering source may end */
    tm_rc rc;
    tm_err err;
} source_ctx;

// The input side of the sink thread's commits (sink/writer.h): the source behind the writer's
// hooks, and what a commit's Kafka transaction carries of the input.
typedef struct sink_input {
    tm_source *src;        /* acks go to it (tm_source_ack) after each commit */
    tm_manifest *man;      /* the manifest of the commit being made (prepare's) */
    bool txn_offsets;      /* input offsets go into the Kafka sink's transactions */
    tm_kafka_offset *offs; /* [n_offs] input positions of the commit being made (txn_offsets) */
    size_t n_offs, cap_offs;
    tm_buf group_md; /* the consumer's group metadata, serialized (txn_offsets) */
} sink_input;

// A Kafka source must keep serving its consumer while the runner is full (heartbeats and
// rebalances happen in its poll): it pauses its partitions and polls instead of blocking. TM_OK:
// the queue took job, or *dropped: its partition was revoked while it waited, so the partition's
// new owner answers it and it is not pushed (the caller still owns it then).
static tm_rc push_job(source_ctx *c, tm_job *job, bool *dropped) {
    *dropped = false;
    if (!tm_source_is_live(c->src))
        return tm_queue_push(c->q, job);
    for (;;) {
        tm_rc rc = tm_queue_try_push(c->q, job);
        if (rc != TM_E_AGAIN)
            return rc;
        rc = tm_source_wait(c->src, job, 100, dropped, &c->err);
        if (rc) {
            c->rc = rc;
            return rc;
        }
        if (*dropped)
            return TM_OK;
    }
}

static void *source_main(void *arg) {
    source_ctx *c = arg;
    for (uint64_t n_read = 0;; n_read++) {
        // A file job stops reading at a stop signal (a Kafka source sees it itself and ends).
        if (!tm_source_is_live(c->src) && tm_stop_requested()) {
            c->stopped = true;
            break;
        }
        tm_job *job = NULL;
        tm_rc rc = tm_source_next(c->src, &job, &c->err);
        if (rc == TM_E_AGAIN && tm_stop_requested()) { // stdin was waiting for data
            c->stopped = true;
            break;
        }
        if (rc == TM_E_EOF) {
            c->eof = true;
            // now the progress line has a total: the whole job's, records earlier runs
            // committed included (it counts them as done: tm_progress_set_earlier)
            tm_progress_set_total(c->progress, n_read + c->n_skipped);
            // The runner gets the end of the input now; a Kafka consumer stays in its group
            // (commits, rebalances) until the outputs are final (drain below).
            tm_queue_close(c->q);
            while (!atomic_load(&c->outputs_final)) {
                rc = tm_source_linger(c->src, 100, &c->err);
                if (rc == TM_E_EOF)
                    break;
                if (rc) {
                    c->rc = rc;
                    break;
                }
            }
            break;
        }
        if (rc) {
            c->rc = rc;
            break;
        }
        // Resume: a record an earlier run committed is parsed (so duplicate ids are still seen)
        // but not run again; it is durable already, so the source may give it up.
        if (c->skip && tm_seqset_has(c->skip, job->seq_no)) {
            rc = tm_source_ack(c->src, &job->seq_no, 1, &c->err);
            tm_job_destroy(job);
            c->n_skipped++;
            n_read--;
            if (rc) {
                c->rc = rc;
                break;
            }
            continue;
        }
        // Not pushed: the runner stopped early or the consumer failed (break), or the source took
        // the record back (dropped: its seq_no is reused, so it does not count as read).
        bool dropped = false;
        if (push_job(c, job, &dropped) != TM_OK) {
            tm_job_destroy(job);
            break;
        }
        if (dropped) {
            tm_job_destroy(job);
            n_read--;
        }
    }
    c->n_skipped += tm_source_n_skipped(c->src); // dropped by the source's stdin prefix check
    tm_queue_close(c->q);
    return NULL;
}

// One partition's done offsets into the manifest and, when it is ours now and the offsets travel
// in the transaction, into the commit's offset list.
static tm_rc add_position(void *ctx, const tm_source_kpos *pos, tm_err *err) {
    sink_input *c = ctx;
    tm_rc rc = tm_manifest_kpart_set(c->man, pos->topic, pos->partition, (uint64_t)pos->next,
                                     pos->ranges, pos->n_ranges, err);
    if (!rc && pos->fp_offset >= 0)
        tm_manifest_kpart_set_fp(c->man, pos->topic, pos->partition, pos->fp_offset, pos->fp_ts);
    if (rc || !c->txn_offsets || !pos->owned)
        return rc;
    if (c->n_offs == c->cap_offs) {
        size_t cap = c->cap_offs ? c->cap_offs * 2 : 16;
        tm_kafka_offset *o = tm_realloc(c->offs, cap * sizeof(*o));
        if (!o)
            return TM_ERR(err, TM_E_NOMEM, "kafka offsets");
        c->offs = o;
        c->cap_offs = cap;
    }
    const char *topic = NULL; // the manifest's copy outlives this commit
    for (size_t i = 0; i < c->man->n_kparts && !topic; i++)
        if (c->man->kparts[i].partition == pos->partition &&
            strcmp(c->man->kparts[i].topic, pos->topic) == 0)
            topic = c->man->kparts[i].topic;
    c->offs[c->n_offs++] =
        (tm_kafka_offset){.topic = topic, .partition = pos->partition, .offset = pos->next};
    return TM_OK;
}

// Before a commit's outputs commit (the writer's prepare): the records of this commit are
// written; the manifest gets every partition's done offsets (and a transaction the owned
// partitions' next offsets with the group metadata). A source without offsets does nothing here.
static tm_rc input_prepare(void *ctx, const uint64_t *seq_nos, size_t n, tm_manifest *man,
                           tm_sink_commit *ci, tm_err *err) {
    sink_input *c = ctx;
    c->man = man;
    c->n_offs = 0;
    tm_rc rc = tm_source_mark_written(c->src, seq_nos, n, err);
    if (!rc)
        rc = tm_source_positions(c->src, add_position, c, err);
    if (!rc && c->txn_offsets)
        rc = tm_source_group_md(c->src, &c->group_md, err);
    if (!rc && c->txn_offsets)
        *ci = (tm_sink_commit){.txn_offsets = true,
                               .offs = c->offs,
                               .n_offs = c->n_offs,
                               .group_md = c->group_md.data,
                               .n_md = c->group_md.len};
    return rc;
}

// After the outputs are durable: what of standard input the manifest covers (source.h).
static void input_seal(void *ctx, tm_manifest *man) {
    sink_input *c = ctx;
    if (!man->in_stdin.set)
        return;
    tm_source_stdin_fp fp;
    tm_source_stdin_fingerprint(c->src, &fp);
    man->in_stdin.n_bytes = fp.n_bytes;
    man->in_stdin.n_records = fp.n_records;
    man->in_stdin.xxh3 = fp.xxh3;
}

// The manifest is published: the records are durable.
static tm_rc input_ack(void *ctx, const uint64_t *seq_nos, size_t n, tm_err *err) {
    sink_input *c = ctx;
    return tm_source_ack(c->src, seq_nos, n, err);
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

// engine.backend "cuda" where no GPU answers: plainly that, the cause, then what to do instead.
// The cause: a CUDA build's error (no device, no driver), or that this build has no CUDA engine.
static const char *cuda_hint(const char *cause) {
    static _Thread_local char msg[sizeof(((tm_err *)0)->msg)];
    snprintf(msg, sizeof(msg),
             "--backend cuda (engine.backend \"cuda\") needs a GPU: %.*s; use \"cpu\", or \"auto\" "
             "(the CUDA engine when a GPU answers, else the CPU engine): --backend cpu|auto",
             (int)(sizeof(msg) / 2),
             tm_engine_cuda_built() ? "no GPU found"
                                    : "this build has no CUDA engine (cmake "
                                      "-DTM_CUDA=ON)");
    (void)cause;
    return msg;
}

// The engine the spec asks for, with eo (tm_job_engine_opts of the spec). auto: the CUDA engine
// when this build has it and a GPU answers, else the CPU engine. cpu with tp > 1: shards in one
// process (tests the sharding math). cuda (or auto with a GPU) with tp > 1: one process per GPU
// over NCCL (cmd/tp_run.h), which get eo from rank 0. The KV pool: the CUDA engine gets kv_blocks
// as given (0: it sizes the pool from free memory within gpu_memory_utilization), the CPU engine
// cpu_kv_blocks. eo->n_kv_block is the engine's count on success.
static tm_rc create_engine(const tm_job_spec *spec, const tm_model *m, tm_engine_opts *eo,
                           const char *path, const tm_tp_launch *launch, tm_engine **out,
                           tm_err *err) {
    tm_backend be = spec->engine.backend;
    const tm_engine_opts go = *eo; // the GPU engines' (kv_blocks as given)
    tm_rc rc;
    if (spec->engine.tp > 1 &&
        (be == TM_BACKEND_CUDA || (be == TM_BACKEND_AUTO && tm_engine_cuda_n_devices() > 0))) {
        const tm_tp_launch one_node = {
            .nnodes = 1, .local_rank = -1, .timeout_s = TM_TP_DEFAULT_TIMEOUT_S};
        rc = tm_tp_engine_create(launch ? launch : &one_node, path, m, &go, out, err);
        goto done;
    }
    if (be == TM_BACKEND_CUDA || (be == TM_BACKEND_AUTO && spec->engine.tp <= 1)) {
        rc = tm_engine_cuda_create(m, &go, out, err);
        if (rc == TM_OK || be == TM_BACKEND_CUDA)
            goto done;
        if (tm_engine_cuda_built() && tm_engine_cuda_n_devices() == 0)
            TM_LOG_INFO("job", "no GPU found: using the cpu engine");
        else if (tm_engine_cuda_built())
            TM_LOG_INFO("job", "the GPU did not start the cuda engine (%s): using the cpu engine",
                        err->msg);
        else
            TM_LOG_DEBUG("job", "built without CUDA: using the cpu engine");
    }
    eo->n_kv_block = cpu_kv_blocks(spec, &m->cfg);
    eo->gpu_mem_util = 0; // no GPU
    rc = tm_engine_cpu_tp_create(m, eo, out, err);
done:
    if (rc == TM_OK)
        eo->n_kv_block = (*out)->opts.n_kv_block;
    else if (be == TM_BACKEND_CUDA && tm_engine_cuda_n_devices() == 0)
        TM_ERR(err, rc, "%s", cuda_hint(err->msg));
    return rc;
}

typedef struct job_parts {
    tm_job_spec *spec;
    tm_model *model;
    tm_tokenizer *tok;
    int32_t *token_map; /* DeepSeek-V4.1 with Engram: the tokenizer's compressed map, else NULL */
    uint32_t n_token_map;
} job_parts;

static void parts_fini(job_parts *p) {
    tm_free(p->token_map);
    tm_tok_destroy(p->tok);
    tm_model_destroy(p->model);
    tm_job_spec_destroy(p->spec);
}

tm_rc tm_job_check_model_dir(const char *dir, tm_err *err) {
    static const char need[] = "tokenmill needs a local Hugging Face model folder (config.json, "
                               "tokenizer.json, *.safetensors)";
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        const char *slash = strchr(dir, '/');
        bool hf_id = dir[0] != '/' && dir[0] != '.' && slash && !strchr(slash + 1, '/') &&
                     slash[1] != '\0';
        if (hf_id)
            return TM_ERR(err, TM_E_IO,
                          "model %s: %s. It looks like a Hugging Face id: %s; download it first "
                          "(huggingface-cli download %s --local-dir models/NAME) and give that "
                          "folder",
                          dir, strerror(e), need, dir);
        return TM_ERR(err, TM_E_IO, "model %s: %s (%s)", dir, strerror(e), need);
    }
    if (!S_ISDIR(st.st_mode)) {
        size_t n = strlen(dir);
        bool gguf = n > 5 && strcmp(dir + n - 5, ".gguf") == 0;
        return TM_ERR(err, TM_E_IO, "model %s: a file, not a folder%s; %s", dir,
                      gguf ? " (GGUF checkpoints are not read; use the Hugging Face checkpoint it "
                             "was converted from)"
                           : "",
                      need);
    }
    char cfg[4096];
    snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
    if (stat(cfg, &st) != 0)
        return TM_ERR(err, TM_E_IO, "model %s: no config.json in this folder; %s", dir, need);
    return TM_OK;
}

static tm_rc parts_load(const char *path, const tm_job_run_opts *o, job_parts *p, tm_err *err) {
    tm_rc rc = o->spec_json ? tm_job_spec_load_text(path, NULL, o->spec_json, &p->spec, err)
                            : tm_job_spec_load(path, &p->spec, err);
    int64_t k = -1, n = 0;
    if (!rc && o->shard)
        rc = tm_shard_parse_arg(o->shard, &k, &n, err);
    if (!rc) // a sharded job becomes its shard here: identity and output folder (job_spec.h)
        rc = tm_job_spec_set_shard(p->spec, o->shard != NULL, k, n, NULL, err);
    if (rc)
        return rc;
    rc = tm_job_check_model_dir(p->spec->model, err);
    if (rc)
        return rc;
    rc = tm_model_load(p->spec->model, &p->model, err);
    if (rc)
        return rc;
    // engine.max_model_len caps the context (prompt + completion) below the model's, as vLLM's
    // --max-model-len; above it is an error, as there.
    uint32_t cap = p->spec->engine.max_model_len;
    if (cap && cap > p->model->cfg.n_ctx)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: engine.max_model_len %u is over the model's context length %u "
                      "(config.json)",
                      path, cap, p->model->cfg.n_ctx);
    if (cap)
        p->model->cfg.n_ctx = cap;
    // A record's own max_tokens that cannot fit is an error (context_length_exceeded); the job's
    // default is a bound, clipped at the context's end: said once per job.
    if ((p->spec->defaults.set & TM_SP_MAX_TOKENS) &&
        (uint64_t)p->spec->defaults.max_tokens >= p->model->cfg.n_ctx)
        TM_LOG_WARN("job",
                    "%s: defaults.max_tokens %d is not below the context length %u: a completion "
                    "ends where prompt + completion fill the context (finish_reason \"length\"); "
                    "a record's own max_tokens that cannot fit fails with "
                    "context_length_exceeded",
                    path, (int)p->spec->defaults.max_tokens, p->model->cfg.n_ctx);
    if (p->spec->engine.quantization == TM_JOB_QUANT_FP8) { // done in engine_setup
        rc = tm_model_quantize_fp8_check(p->model, err);
        if (rc)
            return tm_err_wrap(err, "%s: engine.quantization \"fp8\"", path);
    }
    rc = tm_tok_load(p->spec->model, &p->tok, err);
    if (rc)
        return rc;
    if (tm_tok_n_vocab(p->tok) > p->model->cfg.n_vocab)
        return TM_ERR(err, TM_E_INVAL,
                      "%s: the tokenizer has %u ids but the model's vocab_size is %u",
                      p->spec->model, tm_tok_n_vocab(p->tok), p->model->cfg.n_vocab);
    // DeepSeek-V4.1's Engram hashes n-grams of compressed token ids: the map is built here, where
    // the tokenizer and the model meet, and handed to the engine (tm_engine_opts.token_map)
    const tm_dsv41 *d41 = tm_model_dsv41(p->model);
    if (d41 && d41->cfg.n_engram) {
        uint32_t n_comp = 0;
        rc = tm_engram_map_from_tok(p->tok, &p->token_map, &p->n_token_map, &n_comp, err);
        if (rc)
            return tm_err_wrap(err, "%s: Engram compressed token map", p->spec->model);
        char where[4200];
        snprintf(where, sizeof(where), "%s/config.json", p->spec->model);
        rc = tm_engram_check_compressed_vocab(n_comp, d41->cfg.engram_compressed_vocab_size, where,
                                              err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

// What an earlier run left in the output folder, and what this run starts from.
typedef struct resume_state {
    tm_manifest_lk lk;
    const char *dir; /* the output folder (the spec's); NULL before resume_prepare */
    tm_manifest man; /* this run's manifest: identity now, progress carried over */
    tm_seqset skip;  /* records committed before this run */
    tm_manifest_counts earlier;
    uint64_t cut_bytes;
    bool resumed, finished_before;
    bool results_compare; /* output.results_file exists (finished job, no --restart): rewrite it
                           * only when it holds what the verified outputs give */
} resume_state;

// output.results_file exists when the job has not finished (or has no outputs yet): tokenmill
// writes it only when a job finishes, so it is someone else's file (issue 35).
static tm_rc results_not_ours(const tm_job_spec *spec, const char *again, tm_err *err) {
    return TM_ERR(err, TM_E_INVAL,
                  "output.results_file %s already exists, and it is not tokenmill's result for "
                  "this job (the job in %s has not finished): remove it or choose another "
                  "results path, or run `%s` to overwrite it",
                  spec->results_file, spec->output_dir, again);
}

static tm_rc remove_file(const char *dir, const char *name, tm_err *err) {
    char p[4096];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    if (unlink(p) != 0 && errno != ENOENT)
        return TM_ERR(err, TM_E_IO, "removing %s: %s", p, strerror(errno));
    return TM_OK;
}

// An input of the same job (same spec, same path) that is larger now than when the job started:
// it grew after being read up to its size at start (ingest/source.h). NULL if none.
static const tm_manifest_file *grown_input(const tm_manifest *old, const tm_manifest *cur) {
    if (strcmp(old->spec_hash, cur->spec_hash) != 0 || old->n_inputs != cur->n_inputs)
        return NULL;
    for (size_t k = 0; k < cur->n_inputs; k++)
        if (old->inputs[k].size >= 0 && cur->inputs[k].size > old->inputs[k].size &&
            strcmp(old->inputs[k].name, cur->inputs[k].name) == 0)
            return &old->inputs[k];
    return NULL;
}

static int64_t grown_size(const tm_manifest *cur, const tm_manifest_file *f) {
    for (size_t k = 0; k < cur->n_inputs; k++)
        if (strcmp(cur->inputs[k].name, f->name) == 0)
            return cur->inputs[k].size;
    return -1;
}

// "PATH: " before an error message that does not begin with it already (the job loader's
// messages name the job themselves); static storage, for one log line at a time.
static const char *named(const char *path, const char *msg) {
    static __thread char pre[1100];
    size_t n = strlen(path);
    if (!strncmp(msg, path, n) && msg[n] == ':')
        return "";
    snprintf(pre, sizeof(pre), "%s: ", path);
    return pre;
}

// The command that runs this job again from the start: the one-command line as given plus
// --restart (o->restart_cmd), else `tokenmill run --restart JOB.json`; in buf (n bytes).
static const char *restart_cmd(const tm_job_run_opts *o, const char *path, char *buf, size_t n) {
    if (o->restart_cmd)
        return o->restart_cmd;
    snprintf(buf, n, "tokenmill run --restart %s", path);
    return buf;
}

// Lock the output folder, read its manifest and decide: fresh start, resume (data files cut to
// their committed lengths), nothing to do (finished), or refuse (another job; --restart wipes).
static tm_rc resume_prepare(const tm_job_spec *spec, const char *path, const tm_job_run_opts *o,
                            resume_state *rs, tm_err *err) {
    const char *dir = spec->output_dir;
    char cmd[4096]; // restart_cmd's
    rs->dir = dir;
    int64_t results_size = -1; // a link or FIFO there is refused when it is written
    if (spec->results_file && !o->restart &&
        tm_fs_check_out(spec->results_file, &results_size, err) != TM_OK)
        results_size = 0;
    tm_rc rc = tm_manifest_lock(dir, &rs->lk, err);
    if (!rc) // links, FIFOs and such under tokenmill's names: refused before anything opens them
        rc = tm_manifest_check_folder(dir, &rs->lk, false, err);
    if (!rc)
        rc = tm_manifest_identify(&rs->man, spec->canonical_json, path, spec->model, spec->inputs,
                                  spec->n_inputs, err);
    rs->man.completions_plain = spec->compression == TM_JOB_COMPRESSION_NONE;
    if (!rc && spec->kafka && !(rs->man.kafka_topic = tm_strdup(spec->kafka->topic)))
        rc = TM_ERR(err, TM_E_NOMEM, "manifest");
    if (rc)
        return rc;
    for (size_t i = 0; i < spec->n_inputs; i++)
        rs->man.in_stdin.set |= strcmp(spec->inputs[i], TM_JOB_STDIN) == 0;
    tm_manifest old;
    bool found = false;
    rc = tm_manifest_load(dir, &old, &found, err);
    if (rc && !o->restart)
        return rc;
    if (rc || (found && o->restart)) {
        // Start over: the old manifest goes first (and durably), so a crash while the data files
        // are emptied cannot leave a manifest naming bytes that are gone.
        if (found)
            tm_manifest_fini(&old);
        TM_LOG_INFO("job", "%s: --restart: discarding the outputs in %s", path, dir);
        rc = remove_file(dir, TM_MANIFEST_FILE, err);
        if (!rc)
            rc = tm_manifest_sync_dir(dir, err);
        return rc;
    }
    if (!found && !o->restart) // a fresh start must not overwrite files tokenmill did not write
        rc = tm_manifest_check_folder(dir, &rs->lk, true, err);
    if (!rc && !found && results_size >= 0)
        rc = results_not_ours(spec, restart_cmd(o, path, cmd, sizeof(cmd)), err);
    if (!found) // a fresh start; a temporary file of a crash before the first commit goes
        return rc ? rc : remove_file(dir, TM_MANIFEST_FILE ".tmp", err);
    char why[512];
    const tm_manifest_file *grown = grown_input(&old, &rs->man);
    if (grown) {
        rc = TM_ERR(err, TM_E_INVAL,
                    "input %s grew from %lld to %lld bytes since the job in %s started: tokenmill "
                    "reads each input up to the size it had when the job started, so the new "
                    "lines were not read and this output folder cannot take them. Put them in a "
                    "new file for a new job (or output.dir), or run `%s` to run the whole input "
                    "again",
                    grown->name, (long long)grown->size, (long long)grown_size(&rs->man, grown),
                    dir, restart_cmd(o, path, cmd, sizeof(cmd)));
        tm_manifest_fini(&old);
        return rc;
    }
    if (!tm_manifest_same_job(&old, &rs->man, why, sizeof(why))) {
        rc = TM_ERR(err, TM_E_INVAL,
                    "output folder %s holds another job's outputs: %s. Run "
                    "`%s` to discard them and start over, or choose another output folder",
                    dir, why, restart_cmd(o, path, cmd, sizeof(cmd)));
        tm_manifest_fini(&old);
        return rc;
    }
    // A Kafka or stdin job is never done: a rerun reads what is new (a stdin stream must start
    // with the bytes already answered, which the source checks).
    if (results_size >= 0 && !(old.finished && !spec->kafka_in && !rs->man.in_stdin.set)) {
        rc = results_not_ours(spec, restart_cmd(o, path, cmd, sizeof(cmd)), err);
        tm_manifest_fini(&old);
        return rc;
    }
    if (old.finished && !spec->kafka_in && !rs->man.in_stdin.set) {
        // Nothing is derived from outputs that changed since (the results file): issue 35.
        rc = tm_manifest_verify(dir, &old, err);
        if (rc) {
            tm_err_wrap(err,
                        "the finished job in %s has damaged outputs (nothing was written; "
                        "`%s` runs the job again)",
                        dir, restart_cmd(o, path, cmd, sizeof(cmd)));
            tm_manifest_fini(&old);
            return rc;
        }
        rs->results_compare = results_size >= 0;
        rs->finished_before = true;
        rs->earlier = old.counts;
        printf("tokenmill: %s already finished in %s (%llu records: %llu ok, %llu failed); "
               "nothing to do (`%s` runs it again)\n",
               path, dir, (unsigned long long)(old.counts.n_ok + old.counts.n_failed),
               (unsigned long long)old.counts.n_ok, (unsigned long long)old.counts.n_failed,
               restart_cmd(o, path, cmd, sizeof(cmd)));
        tm_manifest_fini(&old);
        return TM_OK;
    }
    rc = tm_manifest_recover(dir, &old, &rs->cut_bytes, err);
    // Kafka input: seq_nos follow consumption order, so what carries over is the partitions'
    // done offsets (the source skips them), not the done set.
    if (!rc && !spec->kafka_in)
        rc = tm_seqset_copy(&rs->skip, &old.done, err);
    if (!rc && !spec->kafka_in)
        rc = tm_seqset_copy(&rs->man.done, &old.done, err);
    for (size_t i = 0; !rc && spec->kafka_in && i < old.n_kparts; i++) {
        const tm_manifest_kpart *k = &old.kparts[i];
        rc = tm_manifest_kpart_set(&rs->man, k->topic, k->partition, k->next, k->ranges,
                                   k->n_ranges, err);
        if (!rc)
            tm_manifest_kpart_set_fp(&rs->man, k->topic, k->partition, k->fp_offset, k->fp_ts);
    }
    // The cluster the done offsets belong to (io_open checks it against the brokers').
    if (!rc && spec->kafka_in && old.kafka_in_cluster &&
        !(rs->man.kafka_in_cluster = tm_strdup(old.kafka_in_cluster)))
        rc = TM_ERR(err, TM_E_NOMEM, "manifest");
    if (!rc && rs->man.in_stdin.set) {
        rs->man.in_stdin = old.in_stdin;
        rs->man.in_stdin.set = true;
        if (!old.in_stdin.set && tm_seqset_count(&old.done) > 0)
            TM_LOG_WARN("job",
                        "%s: the manifest in %s has no fingerprint of standard input (an older "
                        "tokenmill wrote it): this run cannot check that it is the same stream",
                        path, dir);
    }
    if (!rc) {
        rs->resumed = true;
        rs->earlier = old.counts;
        rs->man.counts = old.counts;
        rs->man.bytes_completions = old.bytes_completions;
        rs->man.bytes_errors = old.bytes_errors;
        rs->man.n_commits = old.n_commits;
        rs->man.n_runs = old.n_runs;
        // A Kafka job's done set covers its last run only (records are numbered in consumption
        // order): its counts carry the whole job.
        TM_LOG_INFO("job",
                    "%s: resuming in %s: %llu records committed by %u earlier run(s); "
                    "%llu torn bytes cut off",
                    path, dir,
                    (unsigned long long)(spec->kafka_in ? old.counts.n_ok + old.counts.n_failed
                                                        : tm_seqset_count(&old.done)),
                    old.n_runs, (unsigned long long)rs->cut_bytes);
    }
    tm_manifest_fini(&old);
    return rc;
}

// A shard's shard.json (TM_SHARD_FILE): what `tokenmill merge` needs to find the job again
// without the job file: the canonical spec (the shard's identity) and the folder its relative
// paths resolve against. Written at each run's start, replaced whole.
static tm_rc write_shard_file(const tm_job_spec *spec, const char *path, bool from_text,
                              tm_err *err) {
    char base[4096];
    const char *slash = strrchr(path, '/');
    if (from_text || !slash)
        snprintf(base, sizeof(base), ".");
    else
        snprintf(base, sizeof(base), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    char *abs = tm_fs_canon(base), *cwd = tm_fs_canon(".");
    json_t *doc = json_pack("{s:i, s:I, s:I, s:s, s:s, s:s, s:s, s:s}", "version", 1, "index",
                            (json_int_t)spec->shard.index, "count", (json_int_t)spec->shard.count,
                            "by", tm_shard_by_name(spec->shard.by), "job", path, "base_dir",
                            abs ? abs : ".", "cwd", cwd ? cwd : ".", "canonical",
                            spec->canonical_json);
    tm_free(cwd);
    char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(doc);
    tm_free(abs);
    char *file = tm_fs_path_join(spec->output_dir, TM_SHARD_FILE);
    tm_rc rc = TM_OK;
    if (!text || !file) {
        rc = TM_ERR(err, TM_E_NOMEM, "shard.json");
    } else {
        const char *parts[] = {text, "\n"};
        rc = tm_fs_replace(file, parts, 2, &(tm_fs_replace_opts){.mode = 0666, .durable = true},
                           err);
    }
    free(text); // jansson's allocation
    tm_free(file);
    return rc;
}

static void resume_fini(resume_state *rs) {
    tm_manifest_fini(&rs->man);
    tm_seqset_fini(&rs->skip);
    if (rs->dir)
        tm_manifest_unlock_tidy(rs->dir, &rs->lk);
    else
        tm_manifest_unlock(&rs->lk);
}

// Everything one run of a job holds, from loading to the summary; run_job's helpers share it.
typedef struct job_run {
    const char *path;            /* the job file; borrowed */
    const tm_job_run_opts *opts; /* borrowed */
    double t0_ms;                /* when the run started */
    job_parts p;
    resume_state rs;
    tm_engine_opts eo; /* the engine's settings (n_kv_block as the engine has it) */
    tm_engine *eng;
    tm_metrics *metrics;
    tm_progress *progress;
    tm_source *src;
    tm_sink_writer *writer; /* the sink thread: the outputs (files, output.kafka) and commits */
    tm_queue *q_in, *q_out; /* source -> runner -> sink */
    bool src_started, sink_started;
    pthread_t src_thread;
    source_ctx sc; /* the source thread's; read after it is joined */
    sink_input si; /* the writer's input side (the source) */
    tm_runner_stats stats;
    _Atomic uint64_t live_tok_gen, live_tok_prompt; /* runner -> progress line, as computed */
} job_run;

// The engine the spec asks for, with the job's limits; logs what was made.
static tm_rc engine_setup(job_run *j, tm_err *err) {
    const tm_job_spec *spec = j->p.spec;
    const tm_model_cfg *mc = &j->p.model->cfg;
    j->eo = tm_job_engine_opts(&spec->engine);
    tm_rc rc;
    if (spec->engine.quantization == TM_JOB_QUANT_FP8) {
        const double t0 = tm_now_ms();
        rc = tm_model_quantize_fp8(j->p.model, j->eo.n_threads, err);
        if (rc)
            return tm_err_wrap(err, "%s: engine.quantization \"fp8\"", j->path);
        TM_LOG_INFO("job", "%s: linears quantized to fp8 e4m3 per channel in %.2f s (%u threads)",
                    j->path, (tm_now_ms() - t0) / 1000.0, j->eo.n_threads);
    }
    j->eo.token_map = j->p.token_map;
    j->eo.n_token_map = j->p.n_token_map;
    rc = create_engine(spec, j->p.model, &j->eo, j->path, j->opts->tp, &j->eng, err);
    if (rc)
        return rc;
    const tm_engine_opts *eo = &j->eo;
    TM_LOG_INFO("job",
                "%s: model %s (%s, %u layers, hidden %u, vocab %u), %s engine, tp %u, "
                "%u threads, %u KV blocks of %u tokens",
                j->path, spec->model, tm_model_arch_name(j->p.model), mc->n_layer, mc->n_embd,
                mc->n_vocab, j->eng->ops->name, TM_MAX(eo->tp_size, 1u), eo->n_threads,
                eo->n_kv_block, eo->block_size);
    return TM_OK;
}

// What metrics.json, the report's series and the textfile call the job: output.job_name, else
// the job file's path, else (a one-command job) its output folder, which tells such jobs apart.
static const char *job_name(const job_run *j) {
    const tm_job_spec *spec = j->p.spec;
    if (spec->job_name)
        return spec->job_name;
    return j->opts->spec_json ? spec->output_dir : j->path;
}

// metrics.json's settings, job and earlier-runs sections.
static tm_rc metrics_setup(job_run *j, tm_err *err) {
    const tm_job_spec *spec = j->p.spec;
    const tm_engine_opts *eo = &j->eo;
    const char *backend = j->eng->ops->name;
    tm_rc rc = tm_metrics_create(&j->metrics, err);
    if (rc)
        return rc;
    tm_metrics_settings ms = {
        .backend = backend,
        .tp = TM_MAX(eo->tp_size, 1u),
        .max_seqs = eo->max_seqs,
        .max_batched_tokens = eo->max_batched_tokens,
        .block_size = eo->block_size,
        .kv_blocks = eo->n_kv_block,
        .kv_dtype = tm_engine_kv_dtype_name(j->eng),
        .quantization = tm_job_quant_name(spec->engine.quantization),
        .prefix_cache = spec->engine.prefix_cache,
        .threads = eo->n_threads,
        .model_path = spec->model,
        .model_arch = tm_model_arch_name(j->p.model),
    };
    rc = tm_metrics_set_settings(j->metrics, &ms, err);
    if (rc)
        return rc;
    rc = tm_metrics_set_job(j->metrics, job_name(j), err);
    if (rc)
        return rc;
    const tm_manifest_counts *e = &j->rs.earlier;
    tm_metrics_add_earlier(j->metrics, &(tm_metrics_earlier){
                                           .n_ok = e->n_ok,
                                           .n_failed = e->n_failed,
                                           .n_err_by_code = e->n_err_by_code,
                                           .n_tok_prompt = e->n_tok_prompt,
                                           .n_tok_cached = e->n_tok_cached,
                                           .n_tok_gen = e->n_tok_gen,
                                       });
    return TM_OK;
}

#define KLAG_MAX 256 /* partitions in the figures */

// Kafka figures for the progress line and textfile (tm_progress_kafka_fn over the source).
static size_t progress_kafka(void *ctx, tm_progress_kpart *out, size_t cap,
                             tm_progress_ktotals *tot) {
    tm_source_klag k[KLAG_MAX];
    size_t n = tm_source_kafka_lag(ctx, k, KLAG_MAX);
    for (size_t i = 0; i < n && i < cap && i < KLAG_MAX; i++)
        out[i] = (tm_progress_kpart){.topic = k[i].topic,
                                     .partition = k[i].partition,
                                     .committed = k[i].committed,
                                     .lag = k[i].lag,
                                     .read_ahead = k[i].read_ahead};
    tm_source_kskips sk;
    tm_source_kafka_skips(ctx, &sk);
    *tot =
        (tm_progress_ktotals){.commits = sk.commits, .errors = sk.errors, .released = sk.released};
    return n < KLAG_MAX ? n : KLAG_MAX;
}

// metrics.json's "kafka" section: the partitions' figures and the messages without a record.
static tm_rc metrics_kafka(job_run *j, bool log_skips, tm_err *err) {
    tm_source_klag k[KLAG_MAX];
    tm_metrics_kpart mk[KLAG_MAX];
    size_t n = tm_source_kafka_lag(j->src, k, KLAG_MAX);
    if (n > KLAG_MAX)
        n = KLAG_MAX;
    for (size_t i = 0; i < n; i++)
        mk[i] = (tm_metrics_kpart){.topic = k[i].topic,
                                   .partition = k[i].partition,
                                   .committed = k[i].committed,
                                   .position = k[i].position,
                                   .high = k[i].high,
                                   .lag = k[i].lag};
    tm_source_kskips sk;
    tm_source_kafka_skips(j->src, &sk);
    if (log_skips && (sk.tombstones || sk.empty))
        TM_LOG_INFO("job",
                    "%s: %llu tombstone(s) (null values) and %llu empty value(s) made no record "
                    "(metrics.json kafka.tombstones, kafka.empty_values)",
                    j->path, (unsigned long long)sk.tombstones, (unsigned long long)sk.empty);
    return tm_metrics_set_kafka(j->metrics,
                                &(tm_metrics_kafka){.parts = mk,
                                                    .n_parts = n,
                                                    .tombstones = sk.tombstones,
                                                    .empty = sk.empty,
                                                    .done_before = sk.done,
                                                    .released = sk.released,
                                                    .commits = sk.commits,
                                                    .errors = sk.errors},
                                err);
}

// The progress line, the source (resumed at the manifest's Kafka positions), the sink (appending
// when resumed), the Kafka producer and the two queues.
static tm_rc io_open(job_run *j, tm_err *err) {
    const tm_job_spec *spec = j->p.spec;
    tm_rc rc = tm_progress_create(
        &(tm_progress_cfg){.job_name = job_name(j), .textfile = spec->prometheus_textfile},
        &j->progress, err);
    if (rc)
        return rc;
    tm_progress_set_live(j->progress, &j->live_tok_gen, &j->live_tok_prompt);
    tm_progress_set_max_tokens(j->progress, (uint32_t)spec->defaults.max_tokens);
    tm_progress_set_earlier(j->progress, j->rs.earlier.n_ok, j->rs.earlier.n_failed);
    rc = tm_source_open(spec, &j->src, err);
    if (rc)
        return rc;
    if (spec->kafka_in)
        tm_progress_set_kafka(j->progress, progress_kafka, j->src);
    // Each file is read up to the size the manifest recorded at start; a resumed stdin stream
    // must start with the committed prefix, checked here (before anything is written) when stdin
    // is the first input.
    int64_t *sizes = tm_malloc((j->rs.man.n_inputs + 1) * sizeof(*sizes));
    if (!sizes)
        return TM_ERR(err, TM_E_NOMEM, "input sizes");
    for (size_t i = 0; i < j->rs.man.n_inputs; i++)
        sizes[i] = j->rs.man.inputs[i].size;
    if (!spec->kafka_in)
        rc = tm_source_set_input_sizes(j->src, sizes, j->rs.man.n_inputs, err);
    tm_free(sizes);
    if (!rc && j->rs.resumed && j->rs.man.in_stdin.set) {
        const tm_manifest_stdin *in = &j->rs.man.in_stdin;
        tm_source_stdin_resume(j->src, &j->rs.skip,
                               &(tm_source_stdin_fp){.n_bytes = in->n_bytes,
                                                     .n_records = in->n_records,
                                                     .xxh3 = in->xxh3});
        rc = tm_source_stdin_check(j->src, err);
    }
    for (size_t i = 0; i < j->rs.man.n_kparts && !rc; i++) {
        const tm_manifest_kpart *k = &j->rs.man.kparts[i];
        rc = tm_source_resume_positions(j->src,
                                        &(tm_source_kpos){.topic = k->topic,
                                                          .partition = k->partition,
                                                          .next = (int64_t)k->next,
                                                          .ranges = k->ranges,
                                                          .n_ranges = k->n_ranges,
                                                          .fp_offset = k->fp_offset,
                                                          .fp_ts = k->fp_ts},
                                        err);
    }
    // A resumed Kafka job: its done offsets must still name the records they named (never skip
    // a recreated topic's records); then the manifest keeps the cluster they belong to.
    if (!rc && spec->kafka_in && j->rs.man.n_kparts > 0) {
        rc = tm_source_check_resume(j->src, j->rs.man.kafka_in_cluster, err);
        if (rc)
            return tm_err_wrap(err, "output folder %s", spec->output_dir);
    }
    const char *cluster = spec->kafka_in ? tm_source_cluster_id(j->src) : NULL;
    if (!rc && cluster) {
        tm_free(j->rs.man.kafka_in_cluster);
        if (!(j->rs.man.kafka_in_cluster = tm_strdup(cluster)))
            rc = TM_ERR(err, TM_E_NOMEM, "manifest");
    }
    if (rc)
        return rc;
    const bool txn_offsets = spec->kafka_in && spec->kafka && spec->kafka->transactional_id;
    tm_source_set_txn(j->src, txn_offsets);
    // A revoked partition's records not started yet go back to the group (the runner asks the
    // source before it starts each record: run_records).
    tm_source_set_release(j->src, true);
    // The sink thread's writer; each output it gets as soon as it is open (it closes them).
    j->si = (sink_input){.src = j->src, .txn_offsets = txn_offsets};
    rc = tm_sink_writer_create(
        &(tm_sink_writer_cfg){.man = &j->rs.man,
                              .dir = spec->output_dir,
                              .commit_every_ms = spec->commit_every_s * 1e3,
                              .commit_every_records = spec->commit_every_records,
                              .metrics = j->metrics,
                              .progress = j->progress,
                              .input = {.ctx = &j->si,
                                        .prepare = input_prepare,
                                        .seal = input_seal,
                                        .ack = input_ack}},
        &j->writer, err);
    if (rc)
        return rc;
    tm_sink *files = NULL;
    rc = tm_sink_open(spec->output_dir,
                      &(tm_sink_opts){.append = j->rs.resumed,
                                      .plain = spec->compression == TM_JOB_COMPRESSION_NONE},
                      &files, err);
    if (rc)
        return rc;
    // errors.jsonl always; the completions unless output.kafka takes them
    tm_sink_writer_add(j->writer, tm_sink_as_out(files),
                       TM_SINK_ROUTE_ERR | (spec->kafka ? 0 : TM_SINK_ROUTE_OK));
    if (spec->kafka) {
        tm_kafka_out_cfg kcfg = {
            .brokers = spec->kafka->brokers,
            .topic = spec->kafka->topic,
            .config = spec->kafka->config,
            .n_config = spec->kafka->n_config,
            .transactional_id = spec->kafka->transactional_id,
            .startup_timeout_s = spec->kafka->startup_timeout_s,
            .by_input_partition = spec->kafka->by_input_partition,
            .error_topic = spec->kafka->error_topic,
        };
        tm_kafka_out *kafka = NULL;
        rc = tm_kafka_out_open(&kcfg, &kafka, err);
        if (rc)
            return rc;
        tm_sink_writer_add(j->writer, tm_kafka_out_as_out(kafka),
                           TM_SINK_ROUTE_OK | (spec->kafka->error_topic ? TM_SINK_ROUTE_ERR : 0));
    }
    rc = tm_queue_create(QUEUE_CAP, &j->q_in, err);
    if (rc)
        return rc;
    return tm_queue_create(QUEUE_CAP, &j->q_out, err);
}

// Start the source and sink threads around the queues.
static tm_rc threads_start(job_run *j, tm_err *err) {
    j->sc = (source_ctx){.src = j->src,
                         .q = j->q_in,
                         .progress = j->progress,
                         .skip = j->rs.resumed ? &j->rs.skip : NULL};
    if (pthread_create(&j->src_thread, NULL, source_main, &j->sc) != 0)
        return TM_ERR(err, TM_E_INTERNAL, "cannot start the source thread");
    j->src_started = true;
    tm_rc rc = tm_sink_writer_start(j->writer, j->q_out, err);
    if (rc)
        return rc;
    j->sink_started = true;
    return TM_OK;
}

// The runner on this thread, from q_in to q_out, until the input is drained.
// The runner's tm_runner_cfg.start over the source (a Kafka source may have released the record).
static bool start_record(void *ctx, uint64_t seq_no) { return tm_source_start(ctx, seq_no); }

static tm_rc run_records(job_run *j, tm_err *err) {
    const tm_job_spec *spec = j->p.spec;
    tm_runner_cfg rcfg = {
        .max_seqs = j->eo.max_seqs,
        .max_batched_tokens = j->eo.max_batched_tokens,
        .block_size = j->eo.block_size,
        .n_kv_block = j->eo.n_kv_block,
        .n_ctx = j->p.model->cfg.n_ctx,
        .defaults = spec->defaults,
        .prefix_cache = spec->engine.prefix_cache,
        .policy = spec->engine.schedule_fcfs ? TM_SCHED_FCFS : TM_SCHED_PREFIX,
        .lookahead = spec->engine.lookahead,
        .chat_template = spec->chat_template,
        .live_tok_gen = &j->live_tok_gen,
        .live_tok_prompt = &j->live_tok_prompt,
        .stop_on_signal = spec->kafka_in == NULL,
        .start = spec->kafka_in ? start_record : NULL,
        .start_ctx = j->src,
        .admit_early = spec->kafka_in != NULL || j->rs.man.in_stdin.set,
        .spec_k = spec->engine.spec_k,
        .spec_lookup_min = spec->engine.spec_lookup_min,
        .spec_lookup_max = spec->engine.spec_lookup_max,
        .spec_mtp = spec->engine.spec_mtp,
        .spec_dspark = spec->engine.spec_dspark,
        .spec_conf_threshold = (float)spec->engine.spec_conf_threshold,
    };
    tm_rc rc = tm_runner_run(&rcfg, j->eng, j->p.tok, j->q_in, j->q_out, &j->stats, err);
    if (j->eng->ops->forward_greedy)
        TM_LOG_INFO("job",
                    "%s: %llu of %llu steps were greedy on the engine (only token ids "
                    "came back), %llu sampled on the engine",
                    j->path, (unsigned long long)j->stats.n_step_greedy,
                    (unsigned long long)j->stats.n_step,
                    (unsigned long long)j->stats.n_step_sampled);
    return rc;
}

// Stop and join the stages (closing q_in stops the source if the runner ended early; the sink
// drains q_out), then take the first stage error into *rc / *err unless there is one already.
static void drain(job_run *j, tm_rc *rc, tm_err *err) {
    if (j->q_in)
        tm_queue_close(j->q_in);
    // The sink first: a source that read to the end lingers (its consumer commits the offsets
    // of the records the sink makes durable) until the outputs are final. A source still
    // reading ends by itself: its queue is closed.
    if (j->q_out)
        tm_queue_close(j->q_out);
    if (j->sink_started) {
        tm_sink_writer_join(j->writer);
        tm_progress_finish(j->progress);
    }
    atomic_store(&j->sc.outputs_final, true);
    if (j->src_started) {
        pthread_join(j->src_thread, NULL);
        void *item;
        while (tm_queue_try_pop(j->q_in, &item) == TM_OK)
            tm_job_destroy(item);
    }
    if (*rc == TM_OK && j->sc.rc) {
        *err = j->sc.err;
        *rc = j->sc.rc;
    }
    tm_err kerr = {0};
    tm_rc krc = j->sink_started ? tm_sink_writer_status(j->writer, &kerr) : TM_OK;
    if (*rc == TM_OK && krc) {
        *err = kerr;
        *rc = krc;
    }
}

// The last commit: whatever was written, unless writing failed (then the last manifest stands
// and the next run cuts the files back to it). The job is finished when the whole input was read
// and every record is done; metrics.json goes first, so a finished manifest always has its
// metrics. Then the sinks close. The first error lands in *rc / *err unless there is one already.
static void finish_outputs(job_run *j, tm_rc *rc, tm_err *err) {
    resume_state *rs = &j->rs;
    tm_err kerr = {0};
    bool final_commit = j->sink_started && tm_sink_writer_status(j->writer, &kerr) == TM_OK;
    tm_sink_writer_stats ks = {0};
    if (j->writer)
        tm_sink_writer_get_stats(j->writer, &ks);
    if (final_commit) {
        rs->man.n_records = tm_source_n_records(j->src);
        rs->man.total_known = j->sc.eof;
        rs->man.finished = *rc == TM_OK && j->sc.eof && j->sc.rc == TM_OK &&
                           tm_seqset_count(&rs->man.done) == rs->man.n_records;
    }
    if (j->metrics && j->p.spec && j->sink_started)
        tm_metrics_set_durability(j->metrics,
                                  &(tm_metrics_durability){
                                      .commits = ks.n_commits + final_commit,
                                      .commits_total = rs->man.n_commits + final_commit,
                                      .commit_ms_total = ks.commit_ms_total,
                                      .commit_ms_max = ks.commit_ms_max,
                                      .runs = rs->man.n_runs + (final_commit && ks.n_commits == 0),
                                      .resumed_records = j->sc.n_skipped,
                                      .cut_bytes = rs->cut_bytes,
                                  });
    if (j->metrics && j->p.spec && j->sink_started && j->p.spec->kafka_in && j->src) {
        tm_err merr = {0};
        tm_rc mrc = metrics_kafka(j, true, &merr);
        if (*rc == TM_OK && mrc) {
            *err = merr;
            *rc = mrc;
        }
    }
    if (j->metrics && j->p.spec && j->sink_started) {
        tm_run_metrics_add_engine(j->metrics, &j->stats, j->p.spec->engine.spec_k);
        tm_metrics_end(j->metrics);
        char mpath[4096];
        snprintf(mpath, sizeof(mpath), "%s/metrics.json", j->p.spec->output_dir);
        tm_err merr = {0};
        tm_rc mrc = tm_metrics_write_json(j->metrics, mpath, &merr);
        if (*rc == TM_OK && mrc) {
            *err = merr;
            *rc = mrc;
        }
        final_commit = final_commit && mrc == TM_OK;
    }
    if (final_commit) {
        tm_err cerr = {0};
        tm_rc crc = tm_sink_writer_commit(j->writer, &cerr);
        if (*rc == TM_OK && crc) {
            *err = cerr;
            *rc = crc;
        }
    }
    tm_err close_err = {0};
    tm_rc close_rc = tm_sink_writer_close(j->writer, &close_err); // output.kafka, then the files
    if (*rc == TM_OK && close_rc) {
        *err = close_err;
        *rc = close_rc;
    }
}

// A Kafka input after the last commit: the consumer commits the offsets that commit made durable
// (synchronously, bounded) and metrics.json and the Prometheus textfile are written again with the
// figures that follow, so their committed offsets and lags are the run's last. A failure here is
// logged, not the job's.
static void kafka_final_figures(job_run *j) {
    if (!j->p.spec || !j->p.spec->kafka_in || !j->src || !j->metrics || !j->sink_started)
        return;
    tm_err e = {0};
    tm_rc rc = tm_source_linger(j->src, 0, &e);
    if (!rc)
        rc = metrics_kafka(j, false, &e);
    char mpath[4096];
    snprintf(mpath, sizeof(mpath), "%s/metrics.json", j->p.spec->output_dir);
    if (!rc)
        rc = tm_metrics_write_json(j->metrics, mpath, &e);
    if (!rc && j->progress) // the textfile's last word too (a no-op without one)
        rc = tm_progress_write_textfile(j->progress, tm_now_ms(), 1, &e);
    if (rc)
        TM_LOG_WARN("job", "%s: the Kafka figures after the last commit: %s", j->path, e.msg);
}

// The summary a successful run prints on stdout.
static void print_summary(const job_run *j) {
    const tm_runner_stats *st = &j->stats;
    tm_sink_writer_stats ks;
    tm_sink_writer_get_stats(j->writer, &ks);
    double wall_s = (tm_now_ms() - j->t0_ms) / 1e3;
    uint64_t n_ok = j->rs.man.counts.n_ok, n_err = j->rs.man.counts.n_failed;
    if (tm_stop_requested() && !j->rs.man.finished)
        printf("tokenmill: %s stopped by signal %d after %.1f s; what was done is committed "
               "(run it again to go on)\n",
               j->path, tm_stop_signal(), wall_s);
    else
        printf("tokenmill: %s done in %.1f s\n", j->path, wall_s);
    // One accounting with the progress line and metrics.json: records and tokens of the whole job
    // (a resumed job: earlier runs included), this run's beside them; speeds are this run's work
    // over this run's wall time.
    const tm_manifest_counts *e = &j->rs.earlier, *all = &j->rs.man.counts;
    bool resumed = j->rs.resumed && e->n_ok + e->n_failed > 0;
    printf("  records   %llu in, %llu ok, %llu failed", (unsigned long long)(n_ok + n_err),
           (unsigned long long)n_ok, (unsigned long long)n_err);
    if (resumed)
        printf(" (all runs; this run %llu in, %llu ok, %llu failed)",
               (unsigned long long)(n_ok + n_err - e->n_ok - e->n_failed),
               (unsigned long long)(n_ok - e->n_ok), (unsigned long long)(n_err - e->n_failed));
    printf("\n");
    if (resumed)
        printf("  tokens    %llu prompt, %llu completion (all runs; this run %llu prompt, %llu "
               "completion); %llu steps, %llu preemptions this run\n",
               (unsigned long long)all->n_tok_prompt, (unsigned long long)all->n_tok_gen,
               (unsigned long long)ks.n_tok_prompt, (unsigned long long)ks.n_tok_gen,
               (unsigned long long)st->n_step, (unsigned long long)st->n_preempt);
    else
        printf("  tokens    %llu prompt, %llu completion; %llu steps, %llu preemptions\n",
               (unsigned long long)ks.n_tok_prompt, (unsigned long long)ks.n_tok_gen,
               (unsigned long long)st->n_step, (unsigned long long)st->n_preempt);
    printf("  speed     prefill %.0f tok/s, decode %.1f tok/s, output %.1f tok/s overall%s\n",
           st->prefill_s > 0 ? st->n_tok_prefill / st->prefill_s : 0.0,
           st->decode_s > 0 ? st->n_tok_decode / st->decode_s : 0.0, ks.n_tok_gen / wall_s,
           resumed ? " (this run's tokens / this run's wall time)" : "");
    printf("  outputs   %s/{%s,errors.jsonl,metrics.json}\n", j->p.spec->output_dir,
           j->rs.man.completions_plain ? TM_SINK_COMPLETIONS_PLAIN_FILE : TM_SINK_COMPLETIONS_FILE);
    if (j->p.spec->results_file && j->rs.man.finished)
        printf("  results   %s (every answer line, as vLLM's run-batch -o)\n",
               j->p.spec->results_file);
}

// Append the file at path to out: as it is, or (lz4) its LZ4 frames decoded.
static tm_rc copy_into(FILE *out, const char *out_path, const char *path, bool lz4, tm_err *err) {
    FILE *in = fopen(path, "rb");
    if (!in)
        return errno == ENOENT ? TM_OK
                               : TM_ERR(err, TM_E_IO, "opening %s: %s", path, strerror(errno));
    LZ4F_dctx *dctx = NULL;
    tm_rc rc = TM_OK;
    if (lz4 && LZ4F_isError(LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION)))
        rc = TM_ERR(err, TM_E_NOMEM, "LZ4 decompression context");
    static _Thread_local char src[1 << 16], dst[1 << 16];
    size_t n;
    for (int eof = 0; !rc && !eof;) {
        n = fread(src, 1, sizeof(src), in);
        eof = n == 0;
        if (!lz4) {
            if (n && fwrite(src, 1, n, out) != n)
                rc = TM_ERR(err, TM_E_IO, "writing %s: %s", out_path, strerror(errno));
            continue;
        }
        // at the end, calls with no input drain what the context still holds
        for (size_t off = 0, dst_n = 1; !rc && (off < n || (eof && dst_n));) {
            size_t src_n = n - off;
            dst_n = sizeof(dst);
            size_t r = LZ4F_decompress(dctx, dst, &dst_n, src + off, &src_n, NULL);
            if (LZ4F_isError(r))
                rc = TM_ERR(err, TM_E_PARSE, "%s: %s", path, LZ4F_getErrorName(r));
            off += src_n;
            if (!rc && dst_n && fwrite(dst, 1, dst_n, out) != dst_n)
                rc = TM_ERR(err, TM_E_IO, "writing %s: %s", out_path, strerror(errno));
        }
    }
    if (!rc && ferror(in))
        rc = TM_ERR(err, TM_E_IO, "reading %s: %s", path, strerror(errno));
    LZ4F_freeDecompressionContext(dctx);
    fclose(in);
    return rc;
}

// Whether the files a and b hold the same bytes (b may be missing: false).
static tm_rc same_content(const char *a, const char *b, bool *same, tm_err *err) {
    *same = false;
    FILE *fa = NULL, *fb = NULL;
    tm_rc rc = tm_fs_fopen_in(a, "results", &fa, err);
    if (!rc && tm_fs_fopen_in(b, "output.results_file", &fb, err) != TM_OK) {
        fclose(fa);
        return errno == ENOENT ? TM_OK : err->rc;
    }
    if (rc)
        return rc;
    static _Thread_local char ba[1 << 16], bb[1 << 16];
    for (;;) {
        size_t na = fread(ba, 1, sizeof(ba), fa), nb = fread(bb, 1, sizeof(bb), fb);
        if (na != nb || memcmp(ba, bb, na) != 0)
            break;
        if (na == 0) {
            *same = !ferror(fa) && !ferror(fb);
            break;
        }
    }
    fclose(fa);
    fclose(fb);
    return TM_OK;
}

// output.results_file of a finished job: every answer line in one plain JSONL file (the
// completions, then the error lines), as vLLM's run-batch writes its -o file; PATH.tmp, then a
// rename, so the file is whole or absent. Completions sent to Kafka are not in it.
static tm_rc same_content(const char *a, const char *b, bool *same, tm_err *err);

// ---- output.order "input": the results file in input order ----

// The key an answer line is found by: "id:" + its id's compact JSON (custom_id for OpenAI lines),
// or "at:" + file + ":" + line (error lines carry them; an id may repeat: duplicate_id).
static char *order_key_id(const json_t *id) {
    char *t = id ? json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    if (!t)
        return NULL;
    size_t n = strlen(t) + 4;
    char *k = malloc(n);
    if (k)
        snprintf(k, n, "id:%s", t);
    free(t);
    return k;
}

static void order_key_at(char *buf, size_t n, const char *file, uint64_t line) {
    snprintf(buf, n, "at:%s:%llu", file ? file : "", (unsigned long long)line);
}

typedef struct ordered_line {
    uint64_t pos; /* the record's position in the input; UINT64_MAX: not found (kept at the end) */
    size_t at;    /* position in the file as written (the tie-break: a stable order) */
    char *text;   /* the line with its "\n"; owned */
} ordered_line;

static int cmp_ordered(const void *a, const void *b) {
    const ordered_line *x = a, *y = b;
    if (x->pos != y->pos)
        return x->pos < y->pos ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

// Rewrite the results file at tmp with its lines in input order: the inputs are read again by
// the job's own source (every format it reads), each record's position noted under its id and
// its file:line; each answer line takes the position of its file:line (error lines) or id.
// Lines found by neither stay at the end as they were. Holds the results in memory.
static tm_rc sort_results(const tm_job_spec *spec, const char *tmp, tm_err *err) {
    bool stream = spec->kafka_in != NULL;
    for (size_t i = 0; i < spec->n_inputs; i++)
        stream |= strcmp(spec->inputs[i], TM_JOB_STDIN) == 0;
    if (stream) // what was read cannot be read again
        return TM_ERR(err, TM_E_INVAL,
                      "output.order \"input\" needs file inputs (standard input and Kafka are read "
                      "once); use \"completion\"");
    json_t *pos = json_object(); // key -> position
    tm_source *src = NULL;
    tm_rc rc = pos ? tm_source_open(spec, &src, err) : TM_ERR(err, TM_E_NOMEM, "output.order");
    char at[4200];
    for (uint64_t n = 0; !rc; n++) {
        tm_job *job = NULL;
        rc = tm_source_next(src, &job, err);
        if (rc)
            break;
        order_key_at(at, sizeof(at), job->file, job->line);
        json_object_set_new(pos, at, json_integer((json_int_t)n));
        json_t *id = job->id_json ? json_loads(job->id_json, JSON_DECODE_ANY, NULL) : NULL;
        char *k = order_key_id(id);
        if (k && !json_object_get(pos, k)) // the first record of an id; repeats are errors
            json_object_set_new(pos, k, json_integer((json_int_t)n));
        free(k);
        json_decref(id);
        tm_job_destroy(job);
    }
    tm_source_destroy(src);
    if (rc == TM_E_EOF)
        rc = TM_OK;
    ordered_line *v = NULL;
    size_t nv = 0, cap = 0;
    FILE *in = rc ? NULL : fopen(tmp, "rb");
    if (!rc && !in)
        rc = TM_ERR(err, TM_E_IO, "output.order: reading %s: %s", tmp, strerror(errno));
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while (!rc && (len = getline(&line, &lcap, in)) > 0) {
        if (nv == cap) {
            cap = cap ? 2 * cap : 1024;
            ordered_line *nl = realloc(v, cap * sizeof(*v));
            if (!nl) {
                rc = TM_ERR(err, TM_E_NOMEM, "output.order");
                break;
            }
            v = nl;
        }
        ordered_line *o = &v[nv];
        o->at = nv;
        o->pos = UINT64_MAX;
        if (!(o->text = strdup(line))) {
            rc = TM_ERR(err, TM_E_NOMEM, "output.order");
            break;
        }
        nv++;
        json_t *j = json_loads(line, 0, NULL);
        const json_t *p = NULL;
        const char *file = json_string_value(json_object_get(j, "file"));
        json_t *ln = json_object_get(j, "line");
        if (file && json_is_integer(ln)) {
            order_key_at(at, sizeof(at), file, (uint64_t)json_integer_value(ln));
            p = json_object_get(pos, at);
        }
        if (!p) {
            json_t *id = json_object_get(j, "custom_id");
            char *k = order_key_id(id ? id : json_object_get(j, "id"));
            p = k ? json_object_get(pos, k) : NULL;
            free(k);
        }
        if (p)
            o->pos = (uint64_t)json_integer_value(p);
        json_decref(j);
    }
    free(line);
    if (in)
        fclose(in);
    json_decref(pos);
    if (!rc) {
        qsort(v, nv, sizeof(*v), cmp_ordered);
        int fd = -1;
        if (tm_fs_open_out(tmp, O_WRONLY | O_TRUNC, 0666, NULL, &fd, err))
            rc = tm_err_wrap(err, "output.results_file");
        FILE *out = rc ? NULL : fdopen(fd, "wb");
        if (!rc && !out) {
            close(fd);
            rc = TM_ERR(err, TM_E_IO, "output.order: opening %s: %s", tmp, strerror(errno));
        }
        for (size_t i = 0; !rc && i < nv; i++)
            if (fputs(v[i].text, out) == EOF)
                rc = TM_ERR(err, TM_E_IO, "writing %s: %s", tmp, strerror(errno));
        if (out && fflush(out) != 0 && !rc)
            rc = TM_ERR(err, TM_E_IO, "writing %s: %s", tmp, strerror(errno));
        if (out && !rc && fsync(fileno(out)) != 0)
            rc = TM_ERR(err, TM_E_IO, "fsync %s: %s", tmp, strerror(errno));
        if (out)
            fclose(out);
    }
    for (size_t i = 0; i < nv; i++)
        free(v[i].text);
    free(v);
    return rc;
}

static tm_rc write_results_file(const tm_job_spec *spec, bool plain, bool compare, tm_err *err) {
    char tmp[4096], comp[4096], errs[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", spec->results_file);
    snprintf(comp, sizeof(comp), "%s/%s", spec->output_dir,
             plain ? TM_SINK_COMPLETIONS_PLAIN_FILE : TM_SINK_COMPLETIONS_FILE);
    snprintf(errs, sizeof(errs), "%s/%s", spec->output_dir, TM_SINK_ERRORS_FILE);
    int fd = -1; // never through a link, never a FIFO (base/fsutil.h)
    if (tm_fs_open_out(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666, NULL, &fd, err))
        return tm_err_wrap(err, "output.results_file");
    FILE *out = fdopen(fd, "wb");
    if (!out) {
        close(fd);
        return TM_ERR(err, TM_E_IO, "output.results_file: opening %s: %s", tmp, strerror(errno));
    }
    tm_rc rc = spec->kafka ? TM_OK : copy_into(out, tmp, comp, !plain, err);
    if (!rc)
        rc = copy_into(out, tmp, errs, false, err);
    if (fflush(out) != 0 && !rc)
        rc = TM_ERR(err, TM_E_IO, "writing %s: %s", tmp, strerror(errno));
    if (!rc && fsync(fileno(out)) != 0)
        rc = TM_ERR(err, TM_E_IO, "fsync %s: %s", tmp, strerror(errno));
    fclose(out);
    if (!rc && spec->results_input_order)
        rc = sort_results(spec, tmp, err);
    bool same = true;
    if (!rc && compare)
        rc = same_content(tmp, spec->results_file, &same, err);
    if (!rc && !same)
        rc = TM_ERR(err, TM_E_INVAL,
                    "output.results_file %s differs from the finished job's outputs in %s: it is "
                    "not tokenmill's result for this job (edited or replaced since); it was left "
                    "as it is. Remove it or choose another results path, or run with --restart "
                    "to run the job again and overwrite it",
                    spec->results_file, spec->output_dir);
    if (!rc && rename(tmp, spec->results_file) != 0)
        rc = TM_ERR(err, TM_E_IO, "renaming %s to %s: %s", tmp, spec->results_file,
                    strerror(errno));
    if (rc)
        unlink(tmp);
    return rc;
}

static void job_run_fini(job_run *j) {
    tm_queue_destroy(j->q_in);
    tm_queue_destroy(j->q_out);
    tm_source_destroy(j->src);
    tm_metrics_destroy(j->metrics);
    tm_progress_destroy(j->progress);
    tm_engine_destroy(j->eng);
    tm_sink_writer_destroy(j->writer);
    tm_free(j->si.offs);
    tm_buf_fini(&j->si.group_md);
    resume_fini(&j->rs);
    parts_fini(&j->p);
}

// One run of a job: load, check what the output folder holds (resume, or nothing to do), make the
// engine, open the inputs and outputs, run the three stages, drain them, commit and summarize.
static tm_rc run_job(const char *path, const tm_job_run_opts *opts, tm_err *err) {
    job_run j = {
        .path = path, .opts = opts, .t0_ms = tm_now_ms(), .rs = {.lk = TM_MANIFEST_LK_INIT}};
    tm_stop_install(); // SIGINT/SIGTERM: stop gracefully (base/stop.h); a second one kills
    tm_rc rc = parts_load(path, opts, &j.p, err);
    if (rc == TM_OK)
        rc = resume_prepare(j.p.spec, path, opts, &j.rs, err);
    if (rc == TM_OK && j.p.spec->shard.active)
        rc = write_shard_file(j.p.spec, path, opts->spec_json != NULL, err);
    if (rc == TM_OK && !j.rs.finished_before) {
        rc = engine_setup(&j, err);
        if (rc == TM_OK)
            rc = metrics_setup(&j, err);
        if (rc == TM_OK)
            rc = io_open(&j, err);
        if (rc == TM_OK)
            rc = threads_start(&j, err);
        if (rc == TM_OK)
            rc = run_records(&j, err);
    }
    drain(&j, &rc, err);
    finish_outputs(&j, &rc, err);
    if (rc == TM_OK)
        kafka_final_figures(&j);
    bool finished = j.rs.finished_before || (j.sink_started && j.rs.man.finished);
    if (rc == TM_OK && finished && j.p.spec->results_file)
        rc = write_results_file(j.p.spec, j.rs.man.completions_plain, j.rs.results_compare, err);
    if (rc == TM_OK && j.sink_started)
        print_summary(&j);
    if (opts->result) {
        *opts->result = (tm_job_run_result){
            .n_ok = j.rs.finished_before ? j.rs.earlier.n_ok : j.rs.man.counts.n_ok,
            .n_failed = j.rs.finished_before ? j.rs.earlier.n_failed : j.rs.man.counts.n_failed,
            .fail_on_error = j.p.spec && j.p.spec->fail_on_error_records};
    }
    if (opts->stop_signal)
        *opts->stop_signal = j.sink_started && !j.p.spec->kafka_in && !j.rs.man.finished
                                 ? tm_stop_signal()
                                 : 0;
    job_run_fini(&j);
    return rc;
}

tm_rc tm_job_run(const char *path) { return tm_job_run_with(path, &(tm_job_run_opts){0}); }

tm_rc tm_job_run_with(const char *path, const tm_job_run_opts *opts) {
    tm_err err = {0};
    tm_rc rc = run_job(path, opts, &err);
    if (rc)
        TM_LOG_ERROR("job", "%s%s", named(path, err.msg), err.msg);
    return rc;
}

// validate: run's per-record checks (ingest's, then the runner's: tokenize, chat template,
// context length against the model and the KV pool run would make) and the engine's
// availability, without an engine.
static tm_rc validate_job(const char *path, const tm_job_run_opts *opts, tm_err *err) {
    job_parts p = {0};
    tm_source *src = NULL;
    tm_buf line = {0};
    tm_chat_tpl *chat = NULL;
    uint64_t n_ok = 0, n_bad = 0;
    tm_rc rc = parts_load(path, opts, &p, err);
    if (rc == TM_OK && p.spec->engine.backend == TM_BACKEND_CUDA && tm_engine_cuda_n_devices() == 0)
        rc = TM_ERR(err, TM_E_INVAL, "%s", cuda_hint(NULL));
    if (rc == TM_OK && p.spec->kafka_in) { // reading would join the group and move its offsets
        printf("tokenmill: %s is valid: model %s (%s); input is Kafka (group %s), whose records "
               "validate does not read\n",
               path, p.spec->model, tm_model_arch_name(p.model), p.spec->kafka_in->group);
        parts_fini(&p);
        return TM_OK;
    }
    // The KV pool run would make: the CPU engine's is known here; a GPU's is sized from free
    // memory at run time (kv_blocks 0), so there only the context length limits a prompt.
    uint32_t n_kv_block = p.spec ? p.spec->engine.kv_blocks : 0;
    if (rc == TM_OK && !n_kv_block && p.spec->engine.backend == TM_BACKEND_CPU)
        n_kv_block = cpu_kv_blocks(p.spec, &p.model->cfg);
    tm_runner_cfg rcfg = {0};
    if (rc == TM_OK) {
        rcfg = (tm_runner_cfg){.n_ctx = p.model->cfg.n_ctx,
                               .n_kv_block = n_kv_block,
                               .block_size = p.spec->engine.block_size,
                               .defaults = p.spec->defaults,
                               .chat_template = p.spec->chat_template};
        rc = tm_chat_tpl_create(p.tok, p.spec->chat_template, &chat, err); // once, not per record
        rcfg.chat_tpl = chat;
        if (rc == TM_OK)
            rc = tm_source_open(p.spec, &src, err);
    }
    while (rc == TM_OK) {
        tm_job *job = NULL;
        rc = tm_source_next(src, &job, err);
        if (rc)
            break;
        tm_errcode code = TM_ERRCODE_NONE;
        tm_err rec_err = {0};
        tm_rc crc = tm_runner_check_record(&rcfg, p.tok, job, &code, &rec_err);
        if (crc == TM_OK) {
            n_ok++;
        } else if (crc == TM_E_RECORD) {
            n_bad++;
            // The line run would write to errors.jsonl: the record's own format (an OpenAI
            // line's error in the Batch API's shape, with run's id), its source metadata.
            tm_completion c = {.seq_no = job->seq_no,
                               .format = job->format,
                               .file = job->file,
                               .line = job->line,
                               .id_json = job->id_json,
                               .src_meta_json = job->src_meta_json,
                               .err_code = code,
                               .err_msg = rec_err.msg};
            tm_buf_clear(&line);
            rc = tm_sink_format_error(&line, &c, err);
            if (rc == TM_OK)
                fputs(line.data, stdout);
        } else {
            *err = rec_err;
            rc = crc;
        }
        tm_job_destroy(job);
    }
    tm_source_destroy(src); // the unknown-key summary (ingest) goes out here
    src = NULL;
    if (rc == TM_E_EOF) {
        rc = TM_OK;
        printf("tokenmill: %s is valid: model %s (%s), %llu records ok, %llu rejected%s\n", path,
               p.spec->model, tm_model_arch_name(p.model), (unsigned long long)n_ok,
               (unsigned long long)n_bad, n_bad ? " (listed above)" : "");
    }
    if (opts->result)
        *opts->result = (tm_job_run_result){.n_ok = n_ok,
                                            .n_failed = n_bad,
                                            .fail_on_error = p.spec &&
                                                             p.spec->fail_on_error_records};
    tm_buf_fini(&line);
    tm_chat_tpl_destroy(chat);
    parts_fini(&p);
    return rc;
}

tm_rc tm_job_validate(const char *path) {
    return tm_job_validate_with(path, &(tm_job_run_opts){0});
}

tm_rc tm_job_validate_with(const char *path, const tm_job_run_opts *opts) {
    tm_err err = {0};
    tm_rc rc = validate_job(path, opts, &err);
    if (rc)
        TM_LOG_ERROR("validate", "%s%s", named(path, err.msg), err.msg);
    return rc;
}
