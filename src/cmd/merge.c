/* cmd/merge.c - `tokenmill merge`: checks a sharded job's shard folders, proves that every input
 * line was answered exactly once and writes one results file and one metrics.json (merge.h says
 * what and how). Reads the shards' manifest.json, shard.json, metrics.json, errors.jsonl and
 * completions up to their committed lengths; never writes inside a shard folder. */
#include "cmd/merge.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <lz4frame.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/fsutil.h"
#include "base/hash.h"
#include "base/log.h"
#include "cmd/job_run.h"
#include "ingest/job_spec.h"
#include "ingest/shard.h"
#include "ingest/source.h"
#include "sink/manifest.h"
#include "sink/metrics.h"
#include "sink/sink.h"

static const char merge_usage[] =
    "usage: tokenmill merge OUT [-o FILE.jsonl] [--partial]\n"
    "\n"
    "Joins the shards of a sharded job (tokenmill run --shard K/N wrote OUT/shard-K-of-N) into\n"
    "one results file and OUT/metrics.json, after proving that every input line was answered by\n"
    "exactly one shard. Refuses (exit 1) while a shard is missing or unfinished, naming it, and a\n"
    "shard of another job.\n"
    "\n"
    "  -o FILE.jsonl   the results file: every answer line in input order (default\n"
    "                  OUT/results.jsonl)\n"
    "  --partial       merge what the shards committed so far; the lines still unanswered go to\n"
    "                  OUT/missing.jsonl\n";

enum { MAX_REPORTED = 10 };

// One input line of the job, in input order.
typedef struct mline {
    uint32_t shard;   /* the shard the partition gives it */
    uint32_t file_ix; /* index into the canonical input paths */
    uint64_t line;    /* 1-based line in its file */
    char *id_json;    /* owned; NULL when unreadable */
    tm_rec_format format;
    bool parse_err;           /* ingest made it an error record */
    int64_t next_same;        /* the next line with the same id, or -1 */
    char *answer;             /* owned answer line ("...\n"), or NULL */
    int32_t ans_shard;        /* the shard whose answer is kept, or -1 */
    uint32_t n_answers;       /* answers seen */
    bool ok;                  /* the kept answer is a completion */
    double ttft_ms, total_ms; /* its timing; NAN when the line carries none */
    uint64_t n_tok_gen;
} mline;

typedef struct shard_st {
    int64_t k;
    char *dir;       /* owned: OUT/shard-K-of-N */
    bool present;    /* the folder exists */
    json_t *info;    /* shard.json, or NULL */
    json_t *metrics; /* metrics.json, or NULL */
    tm_manifest man; /* valid when have_man */
    bool have_man;
    char *cwd; /* the folder its run resolved relative file names against (owned) */
} shard_st;

typedef struct merge {
    const char *out_dir;
    int64_t n;
    shard_st *sh; /* [n] */
    tm_job_spec *spec;
    char **canon_inputs; /* [spec->n_inputs] owned canonical paths */
    mline *lines;
    size_t n_lines, cap_lines;
    int64_t *id_head; /* [id_cap] open addressing: first line of an id, -1 empty */
    uint64_t *id_hash;
    size_t id_cap;
    uint64_t n_dup_answers, n_wrong_shard, n_stray, n_dup_ids;
} merge;

static void report_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report_line(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("tokenmill merge: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

// ---- the shard folders ----

// The canonical spec without input.shard.index: what all shards of one job share.
static char *group_text(const char *canonical) {
    json_error_t jerr;
    json_t *c = json_loads(canonical, 0, &jerr);
    if (!c)
        return NULL;
    json_object_del(json_object_get(json_object_get(c, "input"), "shard"), "index");
    char *t = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    json_decref(c);
    return t;
}

// Count N of the shard folders in out_dir; TM_E_INVAL when none or several counts.
static tm_rc find_count(const char *out_dir, int64_t *n, tm_err *err) {
    DIR *d = opendir(out_dir);
    if (!d)
        return TM_ERR(err, TM_E_IO, "%s: %s", out_dir, strerror(errno));
    *n = 0;
    char first[300] = "", other[300] = "";
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long k, c;
        char back[300];
        if (sscanf(e->d_name, "shard-%lld-of-%lld", &k, &c) != 2)
            continue;
        snprintf(back, sizeof(back), TM_SHARD_DIR_FMT, k, c);
        if (strcmp(back, e->d_name) != 0 || c < 1 || k < 0 || k >= c)
            continue;
        if (*n == 0) {
            *n = c;
            snprintf(first, sizeof(first), "%s", e->d_name);
        } else if (c != *n && !other[0]) {
            snprintf(other, sizeof(other), "%s", e->d_name);
        }
    }
    closedir(d);
    if (*n == 0)
        return TM_ERR(err, TM_E_INVAL,
                      "%s holds no shard folders (shard-K-of-N): run the job with "
                      "`tokenmill run --shard K/N` first",
                      out_dir);
    if (other[0])
        return TM_ERR(err, TM_E_INVAL,
                      "%s holds shards of different counts (%s and %s): one sharded job per "
                      "output folder",
                      out_dir, first, other);
    return TM_OK;
}

static tm_rc load_shards(merge *m, tm_err *err) {
    m->sh = tm_calloc((size_t)m->n, sizeof(*m->sh));
    if (!m->sh)
        return TM_ERR(err, TM_E_NOMEM, "shards");
    for (int64_t k = 0; k < m->n; k++) {
        shard_st *s = &m->sh[k];
        s->k = k;
        char name[96];
        snprintf(name, sizeof(name), TM_SHARD_DIR_FMT, (long long)k, (long long)m->n);
        s->dir = tm_fs_path_join(m->out_dir, name);
        if (!s->dir)
            return TM_ERR(err, TM_E_NOMEM, "shards");
        struct stat st;
        s->present = stat(s->dir, &st) == 0 && S_ISDIR(st.st_mode);
        if (!s->present)
            continue;
        char *p = tm_fs_path_join(s->dir, TM_SHARD_FILE);
        json_error_t jerr;
        s->info = p ? json_load_file(p, 0, &jerr) : NULL;
        tm_free(p);
        p = tm_fs_path_join(s->dir, "metrics.json");
        s->metrics = p ? json_load_file(p, 0, &jerr) : NULL;
        tm_free(p);
        bool found = false;
        tm_rc rc = tm_manifest_load(s->dir, &s->man, &found, err);
        if (rc)
            return rc;
        s->have_man = found;
        const char *cwd = s->info ? json_string_value(json_object_get(s->info, "cwd")) : NULL;
        s->cwd = tm_strdup(cwd ? cwd : ".");
        if (!s->cwd)
            return TM_ERR(err, TM_E_NOMEM, "shards");
    }
    return TM_OK;
}

// Every present shard must be a shard of the reference's job. Refuses the first that is not.
static tm_rc check_same_job(merge *m, const shard_st *ref, tm_err *err) {
    const char *ref_canon = json_string_value(json_object_get(ref->info, "canonical"));
    char *ref_group = ref_canon ? group_text(ref_canon) : NULL;
    if (!ref_group)
        return TM_ERR(err, TM_E_PARSE, "%s/%s: no readable canonical spec", ref->dir,
                      TM_SHARD_FILE);
    tm_rc rc = TM_OK;
    for (int64_t k = 0; !rc && k < m->n; k++) {
        const shard_st *s = &m->sh[k];
        if (!s->present || !s->info)
            continue;
        const char *canon = json_string_value(json_object_get(s->info, "canonical"));
        char *group = canon ? group_text(canon) : NULL;
        json_int_t idx = json_integer_value(json_object_get(s->info, "index"));
        json_int_t cnt = json_integer_value(json_object_get(s->info, "count"));
        if (idx != k || cnt != m->n)
            rc = TM_ERR(err, TM_E_INVAL,
                        "%s belongs to another job: its shard.json says shard %lld of %lld", s->dir,
                        (long long)idx, (long long)cnt);
        else if (!group || strcmp(group, ref_group) != 0)
            rc = TM_ERR(err, TM_E_INVAL,
                        "%s belongs to another job: its job spec differs from %s's (apart from "
                        "the shard index); merge only the shards of one job",
                        s->dir, ref->dir);
        free(group); // jansson's allocation
        if (rc || !s->have_man || !ref->have_man || s == ref)
            continue;
        // Same model and inputs (names, sizes, times), compared as resume compares them.
        tm_manifest cur = s->man;
        memcpy(cur.spec_hash, ref->man.spec_hash, sizeof(cur.spec_hash));
        char why[512];
        if (!tm_manifest_same_job(&ref->man, &cur, why, sizeof(why)))
            rc = TM_ERR(err, TM_E_INVAL, "%s belongs to another job: %s (compared with %s)", s->dir,
                        why, ref->dir);
    }
    free(ref_group);
    return rc;
}

// ---- the input lines ----

static uint64_t id_hash(const char *id) { return tm_hash64(id, strlen(id)) | 1; }

static tm_rc id_index_build(merge *m, tm_err *err) {
    size_t cap = 16;
    while (cap < 2 * m->n_lines + 2)
        cap *= 2;
    m->id_head = tm_malloc(cap * sizeof(*m->id_head));
    m->id_hash = tm_calloc(cap, sizeof(*m->id_hash));
    if (!m->id_head || !m->id_hash)
        return TM_ERR(err, TM_E_NOMEM, "id index");
    m->id_cap = cap;
    int64_t *last = tm_malloc(cap * sizeof(*last));
    if (!last)
        return TM_ERR(err, TM_E_NOMEM, "id index");
    for (size_t i = 0; i < cap; i++)
        m->id_head[i] = last[i] = -1;
    for (size_t g = 0; g < m->n_lines; g++) {
        mline *l = &m->lines[g];
        l->next_same = -1;
        if (!l->id_json)
            continue;
        uint64_t h = id_hash(l->id_json);
        size_t i = h & (cap - 1);
        while (m->id_hash[i] &&
               !(m->id_hash[i] == h && strcmp(m->lines[m->id_head[i]].id_json, l->id_json) == 0))
            i = (i + 1) & (cap - 1);
        if (!m->id_hash[i]) {
            m->id_hash[i] = h;
            m->id_head[i] = (int64_t)g;
        } else {
            m->lines[last[i]].next_same = (int64_t)g;
        }
        last[i] = (int64_t)g;
    }
    tm_free(last);
    return TM_OK;
}

static int64_t id_first(const merge *m, const char *id) {
    uint64_t h = id_hash(id);
    for (size_t i = h & (m->id_cap - 1); m->id_hash[i]; i = (i + 1) & (m->id_cap - 1))
        if (m->id_hash[i] == h && strcmp(m->lines[m->id_head[i]].id_json, id) == 0)
            return m->id_head[i];
    return -1;
}

static int64_t input_ix(const merge *m, const char *canon) {
    for (size_t i = 0; i < m->spec->n_inputs; i++)
        if (strcmp(m->canon_inputs[i], canon) == 0)
            return (int64_t)i;
    return -1;
}

// The line of file (canonical input index) and line number: lines are in file, then line order.
static int64_t pos_find(const merge *m, uint32_t file_ix, uint64_t line) {
    size_t lo = 0, hi = m->n_lines;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const mline *l = &m->lines[mid];
        if (l->file_ix < file_ix || (l->file_ix == file_ix && l->line < line))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < m->n_lines && m->lines[lo].file_ix == file_ix && m->lines[lo].line == line)
        return (int64_t)lo;
    return -1;
}

// Load the job from the reference shard and read every input record, in order, as the shards
// did (up to the input sizes their manifest recorded).
static tm_rc read_inputs(merge *m, const shard_st *ref, tm_err *err) {
    const char *canon = json_string_value(json_object_get(ref->info, "canonical"));
    const char *job_path = json_string_value(json_object_get(ref->info, "job"));
    const char *base = json_string_value(json_object_get(ref->info, "base_dir"));
    tm_rc rc = tm_job_spec_load_text(job_path ? job_path : "(job)", base ? base : ".", canon,
                                     &m->spec, err);
    if (rc)
        return tm_err_wrap(err, "%s/%s", ref->dir, TM_SHARD_FILE);
    tm_job_spec *spec = m->spec;
    if (spec->shard.count != m->n)
        return TM_ERR(err, TM_E_INVAL, "%s: the spec says %lld shards, the folders %lld", ref->dir,
                      (long long)spec->shard.count, (long long)m->n);
    if (spec->n_inputs != ref->man.n_inputs)
        return TM_ERR(err, TM_E_INVAL,
                      "the job's inputs now expand to %zu files; the shards read %zu (%s)",
                      spec->n_inputs, ref->man.n_inputs, ref->dir);
    m->canon_inputs = tm_calloc(spec->n_inputs, sizeof(*m->canon_inputs));
    int64_t *sizes = tm_calloc(spec->n_inputs, sizeof(*sizes));
    if (!m->canon_inputs || !sizes) {
        tm_free(sizes);
        return TM_ERR(err, TM_E_NOMEM, "inputs");
    }
    for (size_t i = 0; i < spec->n_inputs; i++) {
        m->canon_inputs[i] = tm_fs_canon(spec->inputs[i]);
        sizes[i] = ref->man.inputs[i].size;
        if (!m->canon_inputs[i]) {
            tm_free(sizes);
            return TM_ERR(err, TM_E_NOMEM, "inputs");
        }
    }
    tm_source *src = NULL;
    rc = tm_source_open(spec, &src, err); // spec->shard is not active: every record comes
    if (!rc)
        rc = tm_source_set_input_sizes(src, sizes, spec->n_inputs, err);
    tm_free(sizes);
    uint64_t *next_seq = tm_calloc((size_t)m->n, sizeof(*next_seq));
    if (!rc && !next_seq)
        rc = TM_ERR(err, TM_E_NOMEM, "inputs");
    char *last_file = NULL;
    int64_t last_ix = -1;
    while (!rc) {
        tm_job *job = NULL;
        rc = tm_source_next(src, &job, err);
        if (rc)
            break;
        if (m->n_lines == m->cap_lines) {
            size_t cap = m->cap_lines ? 2 * m->cap_lines : 1024;
            mline *nl = tm_realloc(m->lines, cap * sizeof(*nl));
            if (!nl) {
                tm_job_destroy(job);
                rc = TM_ERR(err, TM_E_NOMEM, "input lines");
                break;
            }
            m->lines = nl;
            m->cap_lines = cap;
        }
        if (!last_file || strcmp(last_file, job->file) != 0) {
            tm_free(last_file);
            last_file = tm_strdup(job->file);
            char *c = tm_fs_canon(job->file);
            last_ix = c ? input_ix(m, c) : -1;
            tm_free(c);
        }
        mline *l = &m->lines[m->n_lines];
        *l = (mline){.shard = tm_shard_of(job, &spec->shard),
                     .file_ix = (uint32_t)(last_ix < 0 ? 0 : last_ix),
                     .line = job->line,
                     .id_json = job->id_json ? tm_strdup(job->id_json) : NULL,
                     .format = job->format,
                     .parse_err = job->err_code != TM_ERRCODE_NONE,
                     .ans_shard = -1,
                     .ttft_ms = NAN,
                     .total_ms = NAN};
        next_seq[l->shard]++;
        tm_job_destroy(job);
        m->n_lines++;
        if (last_ix < 0)
            rc = TM_ERR(err, TM_E_INTERNAL, "input %s is not among the job's inputs", last_file);
    }
    if (rc == TM_E_EOF)
        rc = TM_OK;
    // Each shard's manifest counts the records its partition gave it.
    for (int64_t k = 0; !rc && k < m->n; k++) {
        const shard_st *s = &m->sh[k];
        if (s->have_man && s->man.finished && s->man.total_known && s->man.n_records != next_seq[k])
            rc = TM_ERR(err, TM_E_INVAL,
                        "%s: its manifest counts %llu records, the partition gives it %llu: the "
                        "inputs changed since it ran",
                        s->dir, (unsigned long long)s->man.n_records,
                        (unsigned long long)next_seq[k]);
    }
    tm_free(next_seq);
    tm_free(last_file);
    tm_source_destroy(src);
    return rc ? rc : id_index_build(m, err);
}

// ---- the answers ----

// The first n bytes of path, decoded from LZ4 frames when lz4; into out (NUL added, not counted).
static tm_rc read_committed(const char *path, uint64_t n, bool lz4, tm_buf *out, tm_err *err) {
    tm_buf_clear(out);
    if (n == 0)
        return tm_buf_append(out, "", 1, err) ? err->rc : (out->len = 0, TM_OK);
    FILE *f = fopen(path, "rb");
    if (!f)
        return TM_ERR(err, TM_E_IO, "%s: %s", path, strerror(errno));
    tm_buf raw = {0};
    tm_rc rc = TM_OK;
    char chunk[65536];
    while (!rc && raw.len < n) {
        size_t want = n - raw.len < sizeof(chunk) ? (size_t)(n - raw.len) : sizeof(chunk);
        size_t got = fread(chunk, 1, want, f);
        if (got == 0) {
            rc = TM_ERR(err, TM_E_IO, "%s: shorter than its committed %llu bytes", path,
                        (unsigned long long)n);
            break;
        }
        rc = tm_buf_append(&raw, chunk, got, err);
    }
    fclose(f);
    if (!rc && !lz4)
        rc = tm_buf_append(out, raw.data, raw.len, err);
    if (!rc && lz4) {
        LZ4F_dctx *dctx = NULL;
        if (LZ4F_isError(LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION)))
            rc = TM_ERR(err, TM_E_NOMEM, "LZ4 context");
        size_t off = 0;
        while (!rc && off < raw.len) {
            size_t src_n = raw.len - off, dst_n = sizeof(chunk);
            size_t r = LZ4F_decompress(dctx, chunk, &dst_n, raw.data + off, &src_n, NULL);
            if (LZ4F_isError(r)) {
                rc = TM_ERR(err, TM_E_PARSE, "%s: %s", path, LZ4F_getErrorName(r));
                break;
            }
            off += src_n;
            if (dst_n)
                rc = tm_buf_append(out, chunk, dst_n, err);
            if (!rc && src_n == 0 && dst_n == 0)
                rc = TM_ERR(err, TM_E_PARSE, "%s: LZ4 stream makes no progress", path);
        }
        LZ4F_freeDecompressionContext(dctx);
    }
    tm_buf_fini(&raw);
    if (!rc) {
        size_t len = out->len;
        rc = tm_buf_append(out, "", 1, err);
        out->len = len;
    }
    return rc;
}

// The id of an answer line as compact JSON text (native "id", OpenAI "custom_id"); NULL if none.
static char *answer_id(const json_t *a) {
    const json_t *id = json_object_get(a, "custom_id");
    if (!id || json_is_null(id))
        id = json_object_get(a, "id");
    if (!id || !(json_is_string(id) || json_is_integer(id)))
        return NULL;
    return json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY);
}

static void take_answer(merge *m, mline *l, const shard_st *s, const char *text, size_t n, bool ok,
                        const json_t *a) {
    int64_t g = l - m->lines;
    l->n_answers++;
    if (l->ans_shard >= 0) {
        m->n_dup_answers++;
        if (m->n_dup_answers <= MAX_REPORTED)
            report_line("%s line %llu (id %s) is answered by shard %d and by shard %lld",
                        m->spec->inputs[l->file_ix], (unsigned long long)l->line,
                        l->id_json ? l->id_json : "none", l->ans_shard, (long long)s->k);
        // Keep the answer of the shard the partition gives the line, else the lower shard's.
        if (l->ans_shard == (int32_t)l->shard || s->k > l->ans_shard)
            return;
    }
    if ((uint32_t)s->k != l->shard) {
        m->n_wrong_shard++;
        if (m->n_wrong_shard <= MAX_REPORTED)
            report_line(
                "%s line %llu is answered by shard %lld; the partition gives it to shard %u",
                m->spec->inputs[l->file_ix], (unsigned long long)l->line, (long long)s->k,
                l->shard);
    }
    (void)g;
    tm_free(l->answer);
    l->answer = tm_strndup(text, n);
    l->ans_shard = (int32_t)s->k;
    l->ok = ok;
    l->ttft_ms = l->total_ms = NAN;
    l->n_tok_gen = 0;
    const json_t *timing = json_object_get(a, "timing");
    if (ok && timing) {
        l->ttft_ms = json_number_value(json_object_get(timing, "ttft_ms"));
        l->total_ms = json_number_value(json_object_get(timing, "total_ms"));
        l->n_tok_gen = (uint64_t)json_integer_value(
            json_object_get(json_object_get(a, "usage"), "completion_tokens"));
    }
}

// Match one answer line of shard s (ok: from the completions) to its input line.
static tm_rc match_answer(merge *m, const shard_st *s, const char *text, size_t n, bool ok,
                          tm_err *err) {
    json_error_t jerr;
    json_t *a = json_loadb(text, n, 0, &jerr);
    if (!a || !json_is_object(a)) {
        json_decref(a);
        return TM_ERR(err, TM_E_PARSE, "%s: an answer line is not a JSON object: %s", s->dir,
                      jerr.text);
    }
    int64_t g = -1;
    const char *file = json_string_value(json_object_get(a, "file"));
    const json_t *line = json_object_get(a, "line");
    if (file && json_is_integer(line)) {
        char *abs = file[0] == '/' ? tm_strdup(file) : tm_fs_path_join(s->cwd, file);
        char *c = abs ? tm_fs_canon(abs) : NULL;
        int64_t ix = c ? input_ix(m, c) : -1;
        tm_free(abs);
        tm_free(c);
        if (ix >= 0)
            g = pos_find(m, (uint32_t)ix, (uint64_t)json_integer_value(line));
    } else {
        char *id = answer_id(a);
        int64_t first = id ? id_first(m, id) : -1;
        free(id); // jansson's allocation
        // Among the lines of this id: this shard's first unanswered, any unanswered, the first.
        for (int64_t i = first; i >= 0 && g < 0; i = m->lines[i].next_same)
            if (m->lines[i].shard == (uint32_t)s->k && m->lines[i].n_answers == 0)
                g = i;
        for (int64_t i = first; i >= 0 && g < 0; i = m->lines[i].next_same)
            if (m->lines[i].n_answers == 0)
                g = i;
        if (g < 0)
            g = first;
    }
    if (g < 0) {
        m->n_stray++;
        if (m->n_stray <= MAX_REPORTED)
            report_line("%s: an answer matches no input line: %.*s", s->dir,
                        (int)(n > 200 ? 200 : n), text);
    } else {
        take_answer(m, &m->lines[g], s, text, n, ok, a);
    }
    json_decref(a);
    return TM_OK;
}

static tm_rc read_answers(merge *m, const shard_st *s, tm_err *err) {
    tm_buf b = {0};
    tm_rc rc = TM_OK;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        bool ok = pass == 0;
        const char *name = !ok                        ? TM_SINK_ERRORS_FILE
                           : s->man.completions_plain ? TM_SINK_COMPLETIONS_PLAIN_FILE
                                                      : TM_SINK_COMPLETIONS_FILE;
        char *p = tm_fs_path_join(s->dir, name);
        if (!p)
            return TM_ERR(err, TM_E_NOMEM, "answers");
        rc = read_committed(p, ok ? s->man.bytes_completions : s->man.bytes_errors,
                            ok && !s->man.completions_plain, &b, err);
        tm_free(p);
        for (size_t off = 0; !rc && off < b.len;) {
            const char *nl = memchr(b.data + off, '\n', b.len - off);
            size_t end = nl ? (size_t)(nl - b.data) + 1 : b.len;
            if (end - off > 1)
                rc = match_answer(m, s, b.data + off, end - off, ok, err);
            off = end;
        }
    }
    tm_buf_fini(&b);
    return rc;
}

// An id answered ok on two input lines: the later lines get a duplicate_id error, as one job's
// parser gives them (the first line of an id wins).
static tm_rc resolve_dup_ids(merge *m, tm_err *err) {
    tm_buf b = {0};
    tm_rc rc = TM_OK;
    for (size_t g = 0; g < m->n_lines && !rc; g++) {
        mline *first = &m->lines[g];
        if (!first->id_json || !first->ok || id_first(m, first->id_json) != (int64_t)g)
            continue;
        bool seen_ok = true;
        for (int64_t i = first->next_same; i >= 0 && !rc; i = m->lines[i].next_same) {
            mline *l = &m->lines[i];
            if (!l->ok || !seen_ok)
                continue;
            m->n_dup_ids++;
            if (m->n_dup_ids <= MAX_REPORTED)
                report_line("id %s is answered on %s line %llu (shard %d) and line %llu (shard "
                            "%d): the later one becomes a duplicate_id error",
                            l->id_json, m->spec->inputs[first->file_ix],
                            (unsigned long long)first->line, first->ans_shard,
                            (unsigned long long)l->line, l->ans_shard);
            char msg[256];
            snprintf(msg, sizeof(msg), "id %s was used by an earlier record (line %llu)",
                     l->id_json, (unsigned long long)first->line);
            tm_completion c = {.file = m->spec->inputs[l->file_ix],
                               .line = l->line,
                               .id_json = l->id_json,
                               .format = l->format,
                               .err_code = TM_ERRCODE_DUPLICATE_ID,
                               .err_msg = msg};
            tm_buf_clear(&b);
            rc = tm_sink_format_error(&b, &c, err);
            if (!rc) {
                tm_free(l->answer);
                l->answer = tm_strndup(b.data, b.len);
                l->ok = false;
                l->ttft_ms = l->total_ms = NAN;
                if (!l->answer)
                    rc = TM_ERR(err, TM_E_NOMEM, "answer");
            }
        }
    }
    tm_buf_fini(&b);
    return rc;
}

// ---- outputs ----

static tm_rc write_parts(const char *path, const char *const *parts, size_t n, tm_err *err) {
    return tm_fs_replace(path, parts, n, &(tm_fs_replace_opts){.mode = 0666, .durable = true}, err);
}

static tm_rc write_results(merge *m, const char *path, tm_err *err) {
    const char **parts = tm_malloc((m->n_lines + 1) * sizeof(*parts));
    if (!parts)
        return TM_ERR(err, TM_E_NOMEM, "results");
    size_t n = 0;
    for (size_t g = 0; g < m->n_lines; g++)
        if (m->lines[g].answer)
            parts[n++] = m->lines[g].answer;
    tm_rc rc = write_parts(path, parts, n, err);
    tm_free(parts);
    return rc;
}

static tm_rc write_missing(merge *m, const char *path, tm_err *err) {
    tm_buf b = {0};
    tm_rc rc = TM_OK;
    for (size_t g = 0; g < m->n_lines && !rc; g++) {
        const mline *l = &m->lines[g];
        if (l->answer)
            continue;
        rc = tm_buf_printf(&b, err, "{\"shard\":%u,\"file\":", l->shard);
        const char *f = m->spec->inputs[l->file_ix];
        if (!rc)
            rc = tm_buf_append_json_str(&b, f, strlen(f), err);
        if (!rc)
            rc = tm_buf_printf(&b, err, ",\"line\":%llu%s%s}\n", (unsigned long long)l->line,
                               l->id_json ? ",\"id\":" : "", l->id_json ? l->id_json : "");
    }
    if (!rc) {
        const char *parts[] = {b.data ? b.data : ""};
        rc = write_parts(path, parts, 1, err);
    }
    tm_buf_fini(&b);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *summary(double *v, size_t n) {
    qsort(v, n, sizeof(*v), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    return json_pack(
        "{s:I, s:o, s:o, s:o, s:o, s:o}", "n", (json_int_t)n, "mean",
        num_or_null(n ? sum / (double)n : NAN), "p50", num_or_null(tm_metrics_percentile(v, n, 50)),
        "p90", num_or_null(tm_metrics_percentile(v, n, 90)), "p99",
        num_or_null(tm_metrics_percentile(v, n, 99)), "max", num_or_null(n ? v[n - 1] : NAN));
}

// dst.key += src.key for every number (arrays element-wise, objects recursively); keys only in
// src are copied.
static void sum_into(json_t *dst, const json_t *src) {
    const char *key;
    json_t *sv;
    json_object_foreach((json_t *)src, key, sv) {
        json_t *dv = json_object_get(dst, key);
        if (!dv || json_is_null(dv)) {
            json_object_set_new(dst, key, json_deep_copy(sv));
        } else if (json_is_integer(dv) && json_is_integer(sv)) {
            json_object_set_new(dst, key,
                                json_integer(json_integer_value(dv) + json_integer_value(sv)));
        } else if (json_is_number(dv) && json_is_number(sv)) {
            json_object_set_new(dst, key, json_real(json_number_value(dv) + json_number_value(sv)));
        } else if (json_is_object(dv) && json_is_object(sv)) {
            sum_into(dv, sv);
        } else if (json_is_array(dv) && json_is_array(sv) &&
                   json_array_size(dv) == json_array_size(sv)) {
            for (size_t i = 0; i < json_array_size(dv); i++) {
                json_t *a = json_array_get(dv, i), *b = json_array_get(sv, i);
                if (json_is_integer(a) && json_is_integer(b))
                    json_array_set_new(dv, i,
                                       json_integer(json_integer_value(a) + json_integer_value(b)));
                else if (json_is_number(a) && json_is_number(b))
                    json_array_set_new(dv, i,
                                       json_real(json_number_value(a) + json_number_value(b)));
            }
        }
    }
}

static double num(const json_t *o, const char *a, const char *b) {
    const json_t *v = json_object_get(o, a);
    if (b)
        v = json_object_get(v, b);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

static tm_rc write_metrics(merge *m, const shard_st *ref, tm_err *err) {
    json_t *out = json_deep_copy(ref->metrics);
    if (!out)
        return TM_ERR(err, TM_E_NOMEM, "metrics");
    // Sums over the shards that have metrics.
    json_t *tokens = json_object(), *engine = json_object(), *dur = json_object();
    json_t *spec_sum = NULL, *guided_sum = NULL, *list = json_array();
    double start = INFINITY, end = -INFINITY, fill_w = 0, run_w = 0, itl_n = 0, itl_sum = 0;
    double itl_max = NAN, commit_max = 0;
    for (int64_t k = 0; k < m->n; k++) {
        const shard_st *s = &m->sh[k];
        if (!s->metrics)
            continue;
        const json_t *sm = s->metrics;
        sum_into(tokens, json_object_get(sm, "tokens"));
        sum_into(engine, json_object_get(sm, "engine"));
        if (json_is_object(json_object_get(sm, "durability")))
            sum_into(dur, json_object_get(sm, "durability"));
        commit_max = fmax(commit_max, num(sm, "durability", "commit_ms_max"));
        const json_t *sp = json_object_get(sm, "speculative");
        if (json_is_object(sp)) {
            if (!spec_sum)
                spec_sum = json_object();
            sum_into(spec_sum, sp);
        }
        const json_t *gd = json_object_get(sm, "guided");
        if (json_is_object(gd)) {
            if (!guided_sum)
                guided_sum = json_object();
            sum_into(guided_sum, gd);
        }
        double steps = num(sm, "engine", "steps");
        fill_w += steps * num(sm, "engine", "mean_step_fill");
        run_w += steps * num(sm, "engine", "mean_running_seqs");
        start = fmin(start, num(sm, "time", "start_unix_s"));
        end = fmax(end, num(sm, "time", "end_unix_s"));
        const json_t *itl = json_object_get(json_object_get(sm, "latency_ms"), "itl");
        double n_itl = num(itl, "n", NULL);
        if (n_itl > 0) {
            itl_n += n_itl;
            itl_sum += n_itl * num(itl, "mean", NULL);
            itl_max = isnan(itl_max) ? num(itl, "max", NULL) : fmax(itl_max, num(itl, "max", NULL));
        }
        json_array_append_new(
            list, json_pack("{s:I, s:O, s:O, s:O, s:O}", "index", (json_int_t)k, "host",
                            json_object_get(json_object_get(sm, "host"), "hostname"), "wall_s",
                            json_object_get(json_object_get(sm, "time"), "wall_s"), "records",
                            json_object_get(json_object_get(sm, "records"), "in"), "output_tok_s",
                            json_object_get(json_object_get(sm, "throughput"), "output_tok_s")));
    }
    // Records from the merged answers; latencies from their per-record timing.
    uint64_t n_ok = 0, n_failed = 0, by_code[TM_ERRCODE_COUNT] = {0};
    double *ttft = tm_malloc((m->n_lines + 1) * sizeof(double));
    double *e2e = tm_malloc((m->n_lines + 1) * sizeof(double));
    double *tpot = tm_malloc((m->n_lines + 1) * sizeof(double));
    size_t n_ttft = 0, n_tpot = 0;
    for (size_t g = 0; ttft && e2e && tpot && g < m->n_lines; g++) {
        const mline *l = &m->lines[g];
        if (!l->answer)
            continue;
        if (l->ok) {
            n_ok++;
            if (isfinite(l->ttft_ms) && isfinite(l->total_ms)) {
                ttft[n_ttft] = l->ttft_ms;
                e2e[n_ttft++] = l->total_ms;
                if (l->n_tok_gen >= 2)
                    tpot[n_tpot++] = (l->total_ms - l->ttft_ms) / (double)(l->n_tok_gen - 1);
            }
            continue;
        }
        n_failed++;
        json_error_t jerr;
        json_t *a = json_loads(l->answer, 0, &jerr);
        const json_t *e = json_object_get(a, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        if (!code) // an OpenAI line the model could not serve: response.body.error.code
            code = json_string_value(json_object_get(
                json_object_get(json_object_get(json_object_get(a, "response"), "body"), "error"),
                "code"));
        for (int c = 1; code && c < TM_ERRCODE_COUNT; c++)
            if (strcmp(code, tm_errcode_name((tm_errcode)c)) == 0)
                by_code[c]++;
        json_decref(a);
    }
    json_t *codes = json_object();
    for (int c = 1; c < TM_ERRCODE_COUNT; c++)
        if (by_code[c])
            json_object_set_new(codes, tm_errcode_name((tm_errcode)c),
                                json_integer((json_int_t)by_code[c]));
    double wall_s = end - start;
    double gen = num(tokens, "completion", NULL), prompt = num(tokens, "prompt", NULL);
    double steps = num(engine, "steps", NULL);
    json_object_set_new(tokens, "prefix_cache_hit_rate",
                        num_or_null(ratio(num(tokens, "cached", NULL), prompt)));
    json_object_set_new(engine, "mean_step_fill", num_or_null(ratio(fill_w, steps)));
    json_object_set_new(engine, "mean_running_seqs", num_or_null(ratio(run_w, steps)));
    json_object_set(out, "tokens", tokens);
    json_object_set(out, "engine", engine);
    json_object_set_new(out, "records",
                        json_pack("{s:I, s:I, s:I, s:o}", "in", (json_int_t)(n_ok + n_failed), "ok",
                                  (json_int_t)n_ok, "failed", (json_int_t)n_failed,
                                  "errors_by_code", codes));
    json_t *time_o = json_object_get(out, "time");
    if (json_is_object(time_o) && isfinite(wall_s)) {
        json_object_set_new(time_o, "start_unix_s", json_real(start));
        json_object_set_new(time_o, "end_unix_s", json_real(end));
        json_object_set_new(time_o, "wall_s", json_real(wall_s));
        char ts[32];
        time_t t0 = (time_t)start, t1 = (time_t)end;
        strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t0));
        json_object_set_new(time_o, "start_utc", json_string(ts));
        strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", gmtime(&t1));
        json_object_set_new(time_o, "end_utc", json_string(ts));
    }
    json_object_set_new(
        out, "throughput",
        json_pack(
            "{s:o, s:o, s:o, s:o}", "prefill_tok_s",
            num_or_null(ratio(num(engine, "prefill_tokens", NULL), num(engine, "prefill_s", NULL))),
            "decode_tok_s",
            num_or_null(ratio(num(engine, "decode_tokens", NULL), num(engine, "decode_s", NULL))),
            "output_tok_s", num_or_null(ratio(gen, wall_s)), "records_per_s",
            num_or_null(ratio((double)(n_ok + n_failed), wall_s))));
    if (ttft && e2e && tpot)
        json_object_set_new(out, "latency_ms",
                            json_pack("{s:o, s:o, s:o, s:{s:I, s:o, s:o, s:o, s:o, s:o}}", "ttft",
                                      summary(ttft, n_ttft), "e2e", summary(e2e, n_ttft), "tpot",
                                      summary(tpot, n_tpot), "itl", "n", (json_int_t)itl_n, "mean",
                                      num_or_null(ratio(itl_sum, itl_n)), "p50", json_null(), "p90",
                                      json_null(), "p99", json_null(), "max",
                                      num_or_null(itl_max)));
    if (json_is_object(json_object_get(out, "durability"))) {
        json_object_set_new(dur, "commit_ms_max", json_real(commit_max));
        json_object_set(out, "durability", dur);
    }
    if (spec_sum) { // rates again from the summed counters
        double drafts = num(spec_sum, "num_drafts", NULL);
        double acc = num(spec_sum, "num_accepted_tokens", NULL);
        json_object_set(spec_sum, "num_speculative_tokens",
                        json_object_get(json_object_get(ref->metrics, "speculative"),
                                        "num_speculative_tokens"));
        json_object_set(spec_sum, "method",
                        json_object_get(json_object_get(ref->metrics, "speculative"), "method"));
        json_object_set_new(spec_sum, "acceptance_rate",
                            num_or_null(ratio(acc, num(spec_sum, "num_draft_tokens", NULL))));
        json_object_set_new(spec_sum, "mean_acceptance_length",
                            num_or_null(drafts > 0 ? 1 + acc / drafts : NAN));
        json_t *per = json_object_get(spec_sum, "num_accepted_tokens_per_pos");
        json_t *rates = json_array();
        for (size_t i = 0; json_is_array(per) && i < json_array_size(per); i++)
            json_array_append_new(
                rates, num_or_null(ratio(json_number_value(json_array_get(per, i)), drafts)));
        json_object_set_new(spec_sum, "acceptance_rate_per_pos", rates);
        json_object_set_new(out, "speculative", spec_sum);
    }
    if (guided_sum) {
        json_object_set_new(guided_sum, "mask_us_per_token",
                            num_or_null(ratio(num(guided_sum, "mask_s", NULL) * 1e6,
                                              num(guided_sum, "masks", NULL))));
        json_object_set_new(out, "guided", guided_sum);
    }
    json_t *missing = json_array();
    for (int64_t k = 0; k < m->n; k++)
        if (!m->sh[k].have_man || !m->sh[k].man.finished)
            json_array_append_new(missing, json_integer(k));
    json_object_set_new(
        out, "shards",
        json_pack("{s:I, s:s, s:I, s:o, s:o, s:s, s:s}", "count", (json_int_t)m->n, "by",
                  tm_shard_by_name(m->spec->shard.by), "prefix_bytes",
                  (json_int_t)m->spec->shard.prefix_bytes, "merged", list, "missing", missing,
                  "throughput",
                  "wall_s spans the first shard's start to the last shard's end (the shards run "
                  "at the same time); output_tok_s and records_per_s divide by it; prefill_tok_s "
                  "and decode_tok_s divide the summed tokens by the summed engine seconds (the "
                  "rate of one engine)",
                  "latency",
                  "ttft, e2e and tpot are recomputed from the answers' timing (native lines; "
                  "OpenAI lines carry none); itl keeps n, mean and max over the shards, its "
                  "percentiles are in each shard's metrics.json"));
    json_decref(tokens);
    json_decref(engine);
    json_decref(dur);
    tm_free(ttft);
    tm_free(e2e);
    tm_free(tpot);
    char *text = json_dumps(out, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(out);
    char *path = tm_fs_path_join(m->out_dir, "metrics.json");
    tm_rc rc = TM_OK;
    if (!text || !path) {
        rc = TM_ERR(err, TM_E_NOMEM, "metrics");
    } else {
        const char *parts[] = {text, "\n"};
        rc = write_parts(path, parts, 2, err);
    }
    free(text); // jansson's allocation
    tm_free(path);
    return rc;
}

// ---- the command ----

static void merge_fini(merge *m) {
    for (int64_t k = 0; m->sh && k < m->n; k++) {
        tm_free(m->sh[k].dir);
        tm_free(m->sh[k].cwd);
        json_decref(m->sh[k].info);
        json_decref(m->sh[k].metrics);
        if (m->sh[k].have_man)
            tm_manifest_fini(&m->sh[k].man);
    }
    tm_free(m->sh);
    for (size_t g = 0; g < m->n_lines; g++) {
        tm_free(m->lines[g].id_json);
        tm_free(m->lines[g].answer);
    }
    tm_free(m->lines);
    for (size_t i = 0; m->canon_inputs && i < m->spec->n_inputs; i++)
        tm_free(m->canon_inputs[i]);
    tm_free(m->canon_inputs);
    tm_free(m->id_head);
    tm_free(m->id_hash);
    tm_job_spec_destroy(m->spec);
}

static tm_rc run_merge(merge *m, const char *results, bool partial, tm_err *err) {
    tm_rc rc = find_count(m->out_dir, &m->n, err);
    if (!rc)
        rc = load_shards(m, err);
    if (rc)
        return rc;
    // What is missing or unfinished, by name.
    tm_buf miss = {0};
    const shard_st *ref = NULL;
    size_t n_miss = 0;
    for (int64_t k = 0; k < m->n && !rc; k++) {
        const shard_st *s = &m->sh[k];
        const char *why = !s->present                ? "no such folder"
                          : !s->have_man || !s->info ? "no committed run"
                          : !s->man.finished         ? "not finished"
                                                     : NULL;
        if (s->present && s->info && s->have_man && !ref)
            ref = s;
        if (!why)
            continue;
        n_miss++;
        if (s->have_man && !s->man.finished)
            rc = tm_buf_printf(&miss, err, "%s%s (not finished: %llu records committed)",
                               miss.len ? ", " : "", s->dir,
                               (unsigned long long)tm_seqset_count(&s->man.done));
        else
            rc = tm_buf_printf(&miss, err, "%s%s (%s)", miss.len ? ", " : "", s->dir, why);
    }
    if (!rc && !ref)
        rc = TM_ERR(err, TM_E_INVAL, "%s: no shard has committed anything yet: %s", m->out_dir,
                    miss.data ? miss.data : "");
    if (!rc)
        rc = check_same_job(m, ref, err);
    if (!rc && n_miss && !partial)
        rc = TM_ERR(err, TM_E_INVAL,
                    "%zu of %lld shards missing or unfinished: %s. Run them (tokenmill run "
                    "--shard K/%lld), or merge what exists with --partial",
                    n_miss, (long long)m->n, miss.data, (long long)m->n);
    if (!rc && n_miss)
        report_line("--partial: %zu of %lld shards missing or unfinished: %s", n_miss,
                    (long long)m->n, miss.data);
    tm_buf_fini(&miss);
    if (!rc)
        rc = read_inputs(m, ref, err);
    for (int64_t k = 0; k < m->n && !rc; k++)
        if (m->sh[k].have_man && m->sh[k].info)
            rc = read_answers(m, &m->sh[k], err);
    if (!rc)
        rc = resolve_dup_ids(m, err);
    if (rc)
        return rc;
    // The proof: every line of a finished shard answered exactly once.
    uint64_t n_unanswered = 0, n_unanswered_done = 0, n_answered = 0;
    for (size_t g = 0; g < m->n_lines; g++) {
        const mline *l = &m->lines[g];
        if (l->answer) {
            n_answered++;
            continue;
        }
        n_unanswered++;
        const shard_st *s = &m->sh[l->shard];
        if (s->have_man && s->man.finished) {
            n_unanswered_done++;
            if (n_unanswered_done <= MAX_REPORTED)
                report_line("%s line %llu (shard %u, finished) has no answer",
                            m->spec->inputs[l->file_ix], (unsigned long long)l->line, l->shard);
        }
    }
    if (n_unanswered_done || m->n_stray)
        return TM_ERR(err, TM_E_INVAL,
                      "NOT exactly once: %llu input lines of finished shards have no answer, "
                      "%llu answers match no input line; nothing written",
                      (unsigned long long)n_unanswered_done, (unsigned long long)m->n_stray);
    rc = write_results(m, results, err);
    if (!rc && partial) {
        char *p = tm_fs_path_join(m->out_dir, "missing.jsonl");
        rc = p ? write_missing(m, p, err) : TM_ERR(err, TM_E_NOMEM, "missing.jsonl");
        tm_free(p);
    }
    if (!rc)
        rc = write_metrics(m, ref, err);
    if (rc)
        return rc;
    printf("tokenmill merge: %s: %lld shards, %zu input lines, %llu answered exactly once%s "
           "(%llu answered twice, %llu by the wrong shard, %llu duplicate ids resolved)\n",
           m->out_dir, (long long)m->n, m->n_lines, (unsigned long long)n_answered,
           n_unanswered ? "" : " (all)", (unsigned long long)m->n_dup_answers,
           (unsigned long long)m->n_wrong_shard, (unsigned long long)m->n_dup_ids);
    if (n_unanswered)
        printf("  missing   %llu lines of unfinished shards, listed in %s/missing.jsonl\n",
               (unsigned long long)n_unanswered, m->out_dir);
    printf("  results   %s\n  metrics   %s/metrics.json\n", results, m->out_dir);
    return TM_OK;
}

int tm_merge_cmd(int argc, char **argv) {
    const char *out_dir = NULL, *results = NULL;
    bool partial = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(merge_usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--partial")) {
            partial = true;
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && i + 1 < argc) {
            results = argv[++i];
        } else if (a[0] == '-' || out_dir) {
            fprintf(stderr, "tokenmill merge: %s %s\n\n%s",
                    a[0] == '-' ? "unknown option" : "one output folder only, got also", a,
                    merge_usage);
            return 2;
        } else {
            out_dir = a;
        }
    }
    if (!out_dir) {
        fprintf(stderr, "tokenmill merge: no output folder\n\n%s", merge_usage);
        return 2;
    }
    char *dflt = results ? NULL : tm_fs_path_join(out_dir, "results.jsonl");
    merge m = {.out_dir = out_dir};
    tm_err err = {0};
    tm_rc rc = run_merge(&m, results ? results : dflt, partial, &err);
    if (rc)
        TM_LOG_ERROR("merge", "%s", err.msg);
    merge_fini(&m);
    tm_free(dflt);
    return rc ? 1 : 0;
}
