/* ingest/shard.c - the partition of a sharded job (shard.h): a record's key, hashed (XXH3-64,
 * stable across hosts and runs of one tokenmill version) modulo the shard count; and the index and
 * count from the command line, the job file or the scheduler's environment. */
#include "ingest/shard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"

const char *tm_shard_by_name(tm_shard_by by) { return by == TM_SHARD_BY_ID ? "id" : "prefix"; }

// Feed the streaming hash at most *left bytes of p[0..n).
static void feed(tm_hash_stream *st, const char *p, size_t n, size_t *left) {
    if (n > *left)
        n = *left;
    tm_hash_stream_update(st, p, n);
    *left -= n;
}

static uint64_t position_key(const tm_job *job) {
    const char *file = job->file ? job->file : "";
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    tm_hash_stream st;
    tm_hash_stream_init(&st);
    tm_hash_stream_update(&st, "pos", 4);
    tm_hash_stream_update(&st, base, strlen(base) + 1);
    tm_hash_stream_update(&st, &job->line, sizeof(job->line));
    return tm_hash_stream_digest64(&st);
}

uint32_t tm_shard_of(const tm_job *job, const tm_job_shard *sh) {
    TM_ASSERT(sh->count >= 1);
    uint64_t h;
    if (job->err_code != TM_ERRCODE_NONE) {
        h = position_key(job);
    } else if (sh->by == TM_SHARD_BY_ID) {
        h = job->id_json ? tm_hash64(job->id_json, strlen(job->id_json)) : position_key(job);
    } else if (job->prompt) {
        size_t n = strlen(job->prompt);
        h = tm_hash64(job->prompt, n < sh->prefix_bytes ? n : sh->prefix_bytes);
    } else if (job->messages && job->n_messages > 0) {
        // The conversation's context: every message but the last (the one that varies), or the
        // only one; roles and contents separated by bytes that JSON text cannot hold raw.
        tm_hash_stream st;
        tm_hash_stream_init(&st);
        size_t left = sh->prefix_bytes;
        uint32_t n_ctx = job->n_messages > 1 ? job->n_messages - 1 : 1;
        for (uint32_t i = 0; i < n_ctx && left > 0; i++) {
            const tm_message *m = &job->messages[i];
            feed(&st, m->role ? m->role : "", m->role ? strlen(m->role) : 0, &left);
            feed(&st, "\x1f", 1, &left);
            feed(&st, m->content ? m->content : "", m->content ? strlen(m->content) : 0, &left);
            feed(&st, "\x1e", 1, &left);
        }
        h = tm_hash_stream_digest64(&st);
    } else {
        h = position_key(job);
    }
    return (uint32_t)(tm_hash_mix64(h) % (uint64_t)sh->count);
}

// A decimal integer in [lo, hi] filling the whole of s; false otherwise.
static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s)
        return false;
    for (const char *p = s; *p; p++)
        if ((*p < '0' || *p > '9') && !(p == s && *p == '-'))
            return false;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

tm_rc tm_shard_parse_arg(const char *arg, int64_t *index, int64_t *count, tm_err *err) {
    *index = -1;
    *count = 0;
    if (strcmp(arg, "auto") == 0)
        return TM_OK;
    const char *slash = strchr(arg, '/');
    char head[32];
    if (!slash || (size_t)(slash - arg) >= sizeof(head) ||
        !parse_int(slash + 1, 1, TM_SHARD_MAX_COUNT, count))
        return TM_ERR(err, TM_E_INVAL,
                      "--shard %s: expected K/N (0 <= K < N <= %d), auto/N or auto", arg,
                      TM_SHARD_MAX_COUNT);
    memcpy(head, arg, (size_t)(slash - arg));
    head[slash - arg] = '\0';
    if (strcmp(head, "auto") == 0)
        return TM_OK;
    if (!parse_int(head, 0, *count - 1, index))
        return TM_ERR(err, TM_E_INVAL, "--shard %s: the index must be a number from 0 to %lld", arg,
                      (long long)(*count - 1));
    return TM_OK;
}

static const char *plain_getenv(const char *name) { return getenv(name); }

// An environment variable as a number in [lo, hi]: 1 read, 0 unset, -1 bad (err filled).
static int env_int(const char *(*get)(const char *), const char *name, int64_t lo, int64_t hi,
                   int64_t *out, tm_err *err) {
    const char *v = get(name);
    if (!v || !*v)
        return 0;
    if (!parse_int(v, lo, hi, out)) {
        TM_ERR(err, TM_E_INVAL, "shard: %s=%s is not a number from %lld to %lld", name, v,
               (long long)lo, (long long)hi);
        return -1;
    }
    return 1;
}

tm_rc tm_shard_resolve(tm_job_shard *sh, int64_t cli_index, int64_t cli_count,
                       const char *(*getenv_fn)(const char *name), tm_err *err) {
    const char *(*get)(const char *) = getenv_fn ? getenv_fn : plain_getenv;
    int64_t index = cli_index >= 0 ? cli_index : sh->index;
    int64_t count = cli_count > 0 ? cli_count : sh->count;
    const char *index_from = cli_index >= 0 ? "--shard" : "input.shard.index";
    const char *count_from = cli_count > 0 ? "--shard" : "input.shard.count";

    // What the scheduler says: Slurm's array, then Kubernetes' completion index.
    int64_t s_id = 0, s_min = 0, s_count = 0, s_step = 1, k_index = 0;
    const int64_t big = INT64_C(1) << 40;
    int r_id = env_int(get, "SLURM_ARRAY_TASK_ID", 0, big, &s_id, err);
    int r_min = r_id > 0 ? env_int(get, "SLURM_ARRAY_TASK_MIN", 0, big, &s_min, err) : 0;
    int r_count = r_id > 0 ? env_int(get, "SLURM_ARRAY_TASK_COUNT", 1, big, &s_count, err) : 0;
    int r_step = r_id > 0 ? env_int(get, "SLURM_ARRAY_TASK_STEP", 1, big, &s_step, err) : 0;
    int r_k = env_int(get, "JOB_COMPLETION_INDEX", 0, big, &k_index, err);
    if (r_id < 0 || r_min < 0 || r_count < 0 || r_step < 0 || r_k < 0)
        return err->rc;
    bool have_slurm = r_id > 0, have_k8s = r_k > 0;
    int64_t env_index = -1, env_count = 0;
    const char *env_name = NULL;
    if (have_slurm) {
        if (s_step != 1)
            return TM_ERR(err, TM_E_INVAL,
                          "shard: SLURM_ARRAY_TASK_STEP=%lld: a job array with a step leaves "
                          "gaps in the shard indices; use --array=0-%s (no step)",
                          (long long)s_step, "N-1");
        if (s_id < s_min)
            return TM_ERR(err, TM_E_INVAL,
                          "shard: SLURM_ARRAY_TASK_ID=%lld is below SLURM_ARRAY_TASK_MIN=%lld",
                          (long long)s_id, (long long)s_min);
        env_index = s_id - s_min;
        env_count = r_count > 0 ? s_count : 0;
        env_name = "SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN";
        if (env_count > 0 && env_index >= env_count)
            return TM_ERR(err, TM_E_INVAL,
                          "shard: SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN = %lld is not below "
                          "SLURM_ARRAY_TASK_COUNT=%lld (an array with holes, such as "
                          "--array=0,2,5, cannot be shards; use --array=0-N-1)",
                          (long long)env_index, (long long)env_count);
        if (have_k8s && k_index != env_index)
            return TM_ERR(err, TM_E_INVAL,
                          "shard: the environment disagrees: Slurm says shard %lld, "
                          "JOB_COMPLETION_INDEX says %lld",
                          (long long)env_index, (long long)k_index);
    } else if (have_k8s) {
        env_index = k_index;
        env_name = "JOB_COMPLETION_INDEX";
    }

    if (index >= 0 && env_index >= 0 && index != env_index)
        return TM_ERR(err, TM_E_INVAL,
                      "shard: %s gives index %lld but the environment says %lld (%s); drop one of "
                      "them or make them agree",
                      index_from, (long long)index, (long long)env_index, env_name);
    if (count > 0 && env_count > 0 && count != env_count)
        return TM_ERR(err, TM_E_INVAL,
                      "shard: %s gives count %lld but SLURM_ARRAY_TASK_COUNT=%lld; drop one of "
                      "them or make them agree",
                      count_from, (long long)count, (long long)env_count);
    if (index < 0)
        index = env_index;
    if (count <= 0)
        count = env_count;
    if (count <= 0)
        return TM_ERR(err, TM_E_INVAL,
                      "shard: no shard count: give --shard K/N (or auto/N), input.shard.count, or "
                      "run as a Slurm job array (SLURM_ARRAY_TASK_COUNT)%s",
                      have_k8s ? "; a Kubernetes Indexed Job gives only the index "
                                 "(JOB_COMPLETION_INDEX): give the count with --shard auto/N"
                               : "");
    if (index < 0)
        return TM_ERR(err, TM_E_INVAL,
                      "shard: no shard index: give --shard K/%lld or input.shard.index, or run as "
                      "a Slurm job array (SLURM_ARRAY_TASK_ID) or a Kubernetes Indexed Job "
                      "(JOB_COMPLETION_INDEX)",
                      (long long)count);
    if (count > TM_SHARD_MAX_COUNT)
        return TM_ERR(err, TM_E_INVAL, "shard: %lld shards, more than the %d allowed",
                      (long long)count, TM_SHARD_MAX_COUNT);
    if (index >= count)
        return TM_ERR(err, TM_E_INVAL, "shard: index %lld is not below the count %lld",
                      (long long)index, (long long)count);
    sh->on = true;
    sh->index = index;
    sh->count = count;
    sh->active = true;
    return TM_OK;
}
