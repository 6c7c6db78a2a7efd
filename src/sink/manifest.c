/* sink/manifest.c - manifest.json: fingerprints (xxh3), jansson read/write, atomic publish,
 * recovery of torn data files and the output folder's lock. */
#include "sink/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <lz4frame.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/utf8.h"
#include "base/clock.h"
#include "base/fault_io.h"
#include "base/fsutil.h"
#include "base/hash.h"
#include "base/log.h"
#include "sink/sink.h"

#define FORMAT_NAME "tokenmill.manifest"
#define HASH_CHUNK (1u << 20)

// ---- small helpers ----

static void file_fini(tm_manifest_file *f) { tm_free(f->name); }

void tm_manifest_fini(tm_manifest *m) {
    tm_free(m->job_path);
    free(m->spec_json); // json_dumps' or strdup's
    for (size_t i = 0; i < m->n_model_files; i++)
        file_fini(&m->model_files[i]);
    tm_free(m->model_files);
    for (size_t i = 0; i < m->n_inputs; i++)
        file_fini(&m->inputs[i]);
    tm_free(m->inputs);
    tm_seqset_fini(&m->done);
    tm_free(m->kafka_topic);
    for (size_t i = 0; i < m->n_kparts; i++) {
        tm_free(m->kparts[i].topic);
        tm_free(m->kparts[i].ranges);
    }
    tm_free(m->kparts);
    tm_free(m->kafka_in_cluster);
    memset(m, 0, sizeof(*m));
}

tm_rc tm_manifest_kpart_set(tm_manifest *m, const char *topic, int32_t partition, uint64_t next,
                            const uint64_t *ranges, size_t n_ranges, tm_err *err) {
    tm_manifest_kpart *k = NULL;
    for (size_t i = 0; i < m->n_kparts && !k; i++)
        if (m->kparts[i].partition == partition && strcmp(m->kparts[i].topic, topic) == 0)
            k = &m->kparts[i];
    if (!k) {
        if (m->n_kparts == m->cap_kparts) {
            size_t cap = m->cap_kparts ? m->cap_kparts * 2 : 8;
            tm_manifest_kpart *p = tm_realloc(m->kparts, cap * sizeof(*p));
            if (!p)
                return TM_ERR(err, TM_E_NOMEM, "manifest kafka partitions");
            m->kparts = p;
            m->cap_kparts = cap;
        }
        k = &m->kparts[m->n_kparts];
        memset(k, 0, sizeof(*k));
        k->topic = tm_strdup(topic);
        if (!k->topic)
            return TM_ERR(err, TM_E_NOMEM, "manifest kafka partitions");
        k->partition = partition;
        k->fp_offset = -1;
        m->n_kparts++;
    }
    uint64_t *r = NULL;
    if (n_ranges) {
        r = tm_malloc(2 * n_ranges * sizeof(*r));
        if (!r)
            return TM_ERR(err, TM_E_NOMEM, "manifest kafka offsets");
        memcpy(r, ranges, 2 * n_ranges * sizeof(*r));
    }
    tm_free(k->ranges);
    k->ranges = r;
    k->n_ranges = n_ranges;
    k->next = next;
    return TM_OK;
}

tm_rc tm_manifest_sync_dir(const char *dir, tm_err *err) {
    return tm_fs_sync_dir(dir, TM_FS_HOOKS_ON, err);
}

// ---- fingerprints ----

// f->sample of the input at path (see tm_manifest_file): at most 8 MiB read, whatever its size.
static tm_rc sample_input(const char *path, tm_manifest_file *f, tm_err *err) {
    int fd = -1;
    struct stat st;
    tm_rc rc = tm_fs_open_in(path, "input", &fd, &st, err);
    if (rc)
        return rc;
    char *buf = tm_malloc(HASH_CHUNK);
    if (!buf) {
        close(fd);
        return TM_ERR(err, TM_E_NOMEM, "sampling %s", path);
    }
    tm_hash_stream xs;
    tm_hash_stream_init(&xs);
    uint64_t size = (uint64_t)st.st_size;
    tm_hash_stream_update(&xs, &size, sizeof(size));
    // the (offset, length) pieces to read, in order
    enum { BLK = 64u << 10 };
    uint64_t n_piece = size <= TM_MANIFEST_SAMPLE_WHOLE ? 1 : 2 + TM_MANIFEST_SAMPLE_N;
    for (uint64_t k = 0; k < n_piece && !rc; k++) {
        uint64_t off, len;
        if (n_piece == 1)
            off = 0, len = size;
        else if (k == 0)
            off = 0, len = HASH_CHUNK;
        else if (k == n_piece - 1)
            off = size - HASH_CHUNK, len = HASH_CHUNK;
        else { // block k of TM_MANIFEST_SAMPLE_N between the first and last MiB
            uint64_t span = size - 2 * (uint64_t)HASH_CHUNK - BLK;
            off = HASH_CHUNK + span / (TM_MANIFEST_SAMPLE_N - 1) * (k - 1);
            len = BLK;
        }
        while (len > 0 && !rc) {
            size_t want = len < HASH_CHUNK ? (size_t)len : HASH_CHUNK;
            ssize_t got = pread(fd, buf, want, (off_t)off);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                rc = TM_ERR(err, TM_E_IO, "reading %s: %s", path,
                            got < 0 ? strerror(errno) : "it shrank while it was read");
                break;
            }
            tm_hash_stream_update(&xs, buf, (size_t)got);
            off += (uint64_t)got, len -= (uint64_t)got;
        }
    }
    snprintf(f->sample, sizeof(f->sample), "%016llx",
             (unsigned long long)tm_hash_stream_digest64(&xs));
    tm_free(buf);
    close(fd);
    f->inode = (uint64_t)st.st_ino;
    f->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
    return rc;
}

static tm_rc stat_file(const char *path, const char *name, bool hash, tm_manifest_file *f,
                       tm_err *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return TM_ERR(err, TM_E_IO, "%s: %s", path, strerror(errno));
    f->name = tm_strdup(name);
    if (!f->name)
        return TM_ERR(err, TM_E_NOMEM, "manifest file name");
    f->size = (int64_t)st.st_size;
    f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    if (!hash)
        return TM_OK;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return TM_ERR(err, TM_E_IO, "%s: %s", path, strerror(errno));
    tm_hash_stream xs;
    char *buf = tm_malloc(HASH_CHUNK);
    tm_rc rc = TM_OK;
    if (!buf) {
        rc = TM_ERR(err, TM_E_NOMEM, "hashing %s", path);
    } else {
        tm_hash_stream_init(&xs);
        size_t n;
        while ((n = fread(buf, 1, HASH_CHUNK, fp)) > 0)
            tm_hash_stream_update(&xs, buf, n);
        if (ferror(fp))
            rc = TM_ERR(err, TM_E_IO, "reading %s: %s", path, strerror(errno));
        snprintf(f->xxh3, sizeof(f->xxh3), "%016llx",
                 (unsigned long long)tm_hash_stream_digest64(&xs));
    }
    tm_free(buf);
    fclose(fp);
    return rc;
}

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

static int cmp_file_name(const void *a, const void *b) {
    return strcmp(((const tm_manifest_file *)a)->name, ((const tm_manifest_file *)b)->name);
}

static tm_rc add_model_file(tm_manifest *m, const char *dir, const char *name, bool hash,
                            size_t *cap, tm_err *err) {
    if (m->n_model_files == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        tm_manifest_file *p = tm_realloc(m->model_files, c * sizeof(*p));
        if (!p)
            return TM_ERR(err, TM_E_NOMEM, "model file list");
        m->model_files = p;
        *cap = c;
    }
    char *path = tm_fs_path_join(dir, name);
    if (!path)
        return TM_ERR(err, TM_E_NOMEM, "model file path");
    tm_manifest_file *f = &m->model_files[m->n_model_files];
    memset(f, 0, sizeof(*f));
    tm_rc rc = stat_file(path, name, hash, f, err);
    tm_free(path);
    if (rc) {
        file_fini(f);
        return rc;
    }
    m->n_model_files++;
    return TM_OK;
}

tm_rc tm_manifest_identify(tm_manifest *m, const char *canonical_json, const char *job_path,
                           const char *model_dir, char *const *inputs, size_t n_inputs,
                           tm_err *err) {
    tm_h128 h = tm_hash128(canonical_json, strlen(canonical_json));
    snprintf(m->spec_hash, sizeof(m->spec_hash), "%016llx%016llx", (unsigned long long)h.hi,
             (unsigned long long)h.lo);
    m->job_path = tm_strdup(job_path);
    m->spec_json = strdup(canonical_json);
    if (!m->job_path || !m->spec_json)
        return TM_ERR(err, TM_E_NOMEM, "manifest");
    // Model: the small JSON files by content; weights by name, size and mtime (hashing hundreds
    // of GB at every start is not affordable).
    DIR *d = opendir(model_dir);
    if (!d)
        return TM_ERR(err, TM_E_IO, "%s: %s", model_dir, strerror(errno));
    size_t cap = 0;
    tm_rc rc = TM_OK;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        bool small = !strcmp(n, "config.json") || !strcmp(n, "tokenizer.json") ||
                     !strcmp(n, "tokenizer_config.json") || !strcmp(n, "generation_config.json");
        bool weights = has_suffix(n, ".safetensors") || has_suffix(n, ".safetensors.index.json");
        if (small || weights)
            rc = add_model_file(m, model_dir, n, small, &cap, err);
    }
    closedir(d);
    if (rc)
        return rc;
    if (m->n_model_files)
        qsort(m->model_files, m->n_model_files, sizeof(*m->model_files), cmp_file_name);
    m->inputs = tm_calloc(n_inputs ? n_inputs : 1, sizeof(*m->inputs));
    if (!m->inputs)
        return TM_ERR(err, TM_E_NOMEM, "manifest inputs");
    for (size_t i = 0; i < n_inputs; i++) {
        tm_manifest_file *f = &m->inputs[i];
        if (!strcmp(inputs[i], "-")) {
            f->name = tm_strdup("-");
            f->size = -1;
            if (!f->name)
                return TM_ERR(err, TM_E_NOMEM, "manifest inputs");
        } else {
            rc = stat_file(inputs[i], inputs[i], false, f, err);
            if (rc == TM_OK)
                rc = sample_input(inputs[i], f, err);
            if (rc)
                return rc;
        }
        m->n_inputs++;
    }
    return TM_OK;
}

// The fields of two job specs that differ, as "defaults.max_tokens 8 -> 9" (at most 3, then
// "..."), appended to buf at *len (n bytes).
static void spec_diff(const json_t *a, const json_t *b, const char *path, char *buf, size_t n,
                      size_t *len, int *count) {
    if (json_is_object(a) && json_is_object(b)) {
        const char *k;
        json_t *v;
        char sub[160];
        json_object_foreach((json_t *)a, k, v) {
            snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", k);
            spec_diff(v, json_object_get(b, k), sub, buf, n, len, count);
        }
        json_object_foreach((json_t *)b, k, v) {
            if (json_object_get(a, k))
                continue;
            snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", k);
            spec_diff(NULL, v, sub, buf, n, len, count);
        }
        return;
    }
    if (a && b && json_equal((json_t *)a, (json_t *)b))
        return;
    if (++*count > 3) {
        if (*count == 4 && *len < n)
            *len += (size_t)snprintf(buf + *len, n - *len, ", ...");
        return;
    }
    char *x = a ? json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    char *y = b ? json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    if (*len < n)
        *len += (size_t)snprintf(buf + *len, n - *len, "%s%s %.40s -> %.40s",
                                 *count > 1 ? ", " : "", path, x ? x : "(unset)",
                                 y ? y : "(unset)");
    free(x);
    free(y);
}

bool tm_manifest_same_job(const tm_manifest *old, const tm_manifest *cur, char *why, size_t n) {
    if (strcmp(old->spec_hash, cur->spec_hash) != 0) {
        json_t *a = old->spec_json ? json_loads(old->spec_json, 0, NULL) : NULL;
        json_t *b = cur->spec_json ? json_loads(cur->spec_json, 0, NULL) : NULL;
        size_t len = 0;
        int count = 0;
        if (a && b) {
            len = (size_t)snprintf(why, n, "the job changed: ");
            spec_diff(a, b, "", why, n, &len, &count);
        }
        if (!count)
            snprintf(why, n, "the job spec changed (spec hash %.12s -> %.12s)", old->spec_hash,
                     cur->spec_hash);
        json_decref(a);
        json_decref(b);
        return false;
    }
    // Model: every hashed file by content, weights by name and size (a copied model keeps them).
    size_t i = 0, j = 0;
    while (i < old->n_model_files || j < cur->n_model_files) {
        const tm_manifest_file *a = i < old->n_model_files ? &old->model_files[i] : NULL;
        const tm_manifest_file *b = j < cur->n_model_files ? &cur->model_files[j] : NULL;
        int c = !a ? 1 : !b ? -1 : strcmp(a->name, b->name);
        if (c != 0) {
            snprintf(why, n, "model file %s %s", c < 0 ? a->name : b->name,
                     c < 0 ? "is gone" : "is new");
            return false;
        }
        if (a->size != b->size || strcmp(a->xxh3, b->xxh3) != 0) {
            snprintf(why, n, "model file %s changed (size %lld -> %lld%s)", a->name,
                     (long long)a->size, (long long)b->size,
                     strcmp(a->xxh3, b->xxh3) ? ", content differs" : "");
            return false;
        }
        i++;
        j++;
    }
    if (old->n_inputs != cur->n_inputs) {
        snprintf(why, n, "the input list changed (%zu files -> %zu)", old->n_inputs, cur->n_inputs);
        return false;
    }
    // Inputs: seq_nos are positions in the input, so the files must be the very same bytes.
    for (size_t k = 0; k < cur->n_inputs; k++) {
        const tm_manifest_file *a = &old->inputs[k], *b = &cur->inputs[k];
        if (strcmp(a->name, b->name) != 0) {
            snprintf(why, n, "input %zu changed (%s -> %s)", k + 1, a->name, b->name);
            return false;
        }
        if (a->size != b->size || a->mtime_ns != b->mtime_ns) {
            snprintf(why, n, "input %s changed (size %lld -> %lld, or its mtime)", a->name,
                     (long long)a->size, (long long)b->size);
            return false;
        }
        // Same size and mtime (cp -p, touch -r, mv of a prepared file keep them): issue 35.
        if (a->inode && b->inode && a->inode != b->inode) {
            snprintf(why, n,
                     "input %s was replaced by another file of the same size and mtime (inode "
                     "%llu -> %llu)",
                     a->name, (unsigned long long)a->inode, (unsigned long long)b->inode);
            return false;
        }
        if (a->sample[0] && b->sample[0] && strcmp(a->sample, b->sample) != 0) {
            snprintf(why, n, "input %s changed: same size and mtime, other content", a->name);
            return false;
        }
        if (a->ctime_ns && b->ctime_ns && a->ctime_ns != b->ctime_ns) {
            snprintf(why, n,
                     "input %s changed: same size and mtime, but it was written, touched, "
                     "renamed or had its permissions changed since the last run (ctime)",
                     a->name);
            return false;
        }
    }
    return true;
}

// ---- JSON ----

static json_t *file_json(const tm_manifest_file *f, bool with_hash) {
    char *name = tm_path_escape(f->name); // any bytes, losslessly (base/utf8.h)
    json_t *o = name ? json_pack("{s:s, s:I, s:I}", "path", name, "size", (json_int_t)f->size,
                                 "mtime_ns", (json_int_t)f->mtime_ns)
                     : NULL;
    tm_free(name);
    if (o && f->sample[0] &&
        (json_object_set_new(o, "inode", json_integer((json_int_t)f->inode)) != 0 ||
         json_object_set_new(o, "ctime_ns", json_integer((json_int_t)f->ctime_ns)) != 0 ||
         json_object_set_new(o, "sample_xxh3", json_string(f->sample)) != 0)) {
        json_decref(o);
        return NULL;
    }
    if (o && with_hash &&
        json_object_set_new(o, "xxh3", f->xxh3[0] ? json_string(f->xxh3) : json_null()) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *files_json(const tm_manifest_file *fs, size_t n, bool with_hash) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, file_json(&fs[i], with_hash)) != 0) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

// done_above as [first, last] ranges (inclusive): out-of-order stretches are runs of seq_nos.
static json_t *ranges_json(const tm_seqset *s) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < s->n_above;) {
        size_t k = i;
        while (k + 1 < s->n_above && s->above[k + 1] == s->above[k] + 1)
            k++;
        if (json_array_append_new(
                a, json_pack("[I, I]", (json_int_t)s->above[i], (json_int_t)s->above[k])) != 0) {
            json_decref(a);
            a = NULL;
        }
        i = k + 1;
    }
    return a;
}

static json_t *counts_json(const tm_manifest_counts *c) {
    json_t *by_code = json_object();
    for (int i = 1; by_code && i < TM_ERRCODE_COUNT; i++)
        if (c->n_err_by_code[i] &&
            json_object_set_new(by_code, tm_errcode_name((tm_errcode)i),
                                json_integer((json_int_t)c->n_err_by_code[i])) != 0) {
            json_decref(by_code);
            by_code = NULL;
        }
    return json_pack("{s:I, s:I, s:o, s:{s:I, s:I, s:I}}", "ok", (json_int_t)c->n_ok, "failed",
                     (json_int_t)c->n_failed, "errors_by_code", by_code, "tokens", "prompt",
                     (json_int_t)c->n_tok_prompt, "cached", (json_int_t)c->n_tok_cached,
                     "completion", (json_int_t)c->n_tok_gen);
}

// input_kafka: {"partitions": [{"topic", "partition", "next", "done_above": [[a, b], ...]}]}.
static json_t *kparts_json(const tm_manifest *m) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < m->n_kparts; i++) {
        const tm_manifest_kpart *k = &m->kparts[i];
        json_t *rs = json_array();
        for (size_t j = 0; rs && j < k->n_ranges; j++)
            if (json_array_append_new(rs, json_pack("[I, I]", (json_int_t)k->ranges[2 * j],
                                                    (json_int_t)k->ranges[2 * j + 1])) != 0) {
                json_decref(rs);
                rs = NULL;
            }
        json_t *o = json_pack("{s:s, s:i, s:I, s:o}", "topic", k->topic, "partition",
                              (int)k->partition, "next", (json_int_t)k->next, "done_above", rs);
        if (o && k->fp_offset >= 0 &&
            json_object_set_new(o, "check",
                                json_pack("{s:I, s:I}", "offset", (json_int_t)k->fp_offset,
                                          "timestamp", (json_int_t)k->fp_ts)) != 0) {
            json_decref(o);
            o = NULL;
        }
        if (json_array_append_new(a, o) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    json_t *ik = a ? json_pack("{s:o}", "partitions", a) : NULL;
    if (ik && m->kafka_in_cluster &&
        json_object_set_new(ik, "cluster_id", json_string(m->kafka_in_cluster)) != 0) {
        json_decref(ik);
        return NULL;
    }
    return ik;
}

static json_t *to_json(const tm_manifest *m) {
    json_t *root = NULL;
    char now[32];
    tm_utc_now_str(now, sizeof(now));
    json_t *kafka = m->kafka_topic ? json_pack("{s:s}", "topic", m->kafka_topic) : json_null();
    char *job_path = tm_path_escape(m->job_path ? m->job_path : "");
    root = json_pack("{s:s, s:i, s:s, s:{s:s, s:s}, s:{s:o}, s:o, s:{s:{s:I}, s:{s:I}}, s:o,"
                     " s:{s:I, s:o, s:o, s:b}, s:o, s:{s:I, s:I}}",
                     "format", FORMAT_NAME, "version", TM_MANIFEST_VERSION, "updated_utc", now,
                     "job", "spec_hash", m->spec_hash, "path", job_path ? job_path : "", "model",
                     "files", files_json(m->model_files, m->n_model_files, true), "inputs",
                     files_json(m->inputs, m->n_inputs, false), "outputs",
                     m->completions_plain ? TM_SINK_COMPLETIONS_PLAIN_FILE
                                          : TM_SINK_COMPLETIONS_FILE,
                     "bytes", (json_int_t)m->bytes_completions, TM_SINK_ERRORS_FILE, "bytes",
                     (json_int_t)m->bytes_errors, "kafka", kafka, "records", "watermark",
                     (json_int_t)m->done.watermark, "done_above", ranges_json(&m->done), "total",
                     m->total_known ? json_integer((json_int_t)m->n_records) : json_null(),
                     "finished", (int)m->finished, "counts", counts_json(&m->counts), "commits",
                     "n", (json_int_t)m->n_commits, "runs", (json_int_t)m->n_runs);
    tm_free(job_path);
    json_t *spec = m->spec_json ? json_loads(m->spec_json, 0, NULL) : NULL;
    if (root && spec && json_object_set_new(json_object_get(root, "job"), "spec", spec) != 0) {
        json_decref(root);
        return NULL;
    }
    if (!root)
        json_decref(spec);
    if (root && m->n_kparts && json_object_set_new(root, "input_kafka", kparts_json(m)) != 0) {
        json_decref(root);
        return NULL;
    }
    if (root && m->in_stdin.set) {
        const tm_manifest_stdin *in = &m->in_stdin;
        char h[33];
        snprintf(h, sizeof(h), "%016llx%016llx", (unsigned long long)in->xxh3.hi,
                 (unsigned long long)in->xxh3.lo);
        if (json_object_set_new(root, "stdin",
                                json_pack("{s:I, s:I, s:s}", "bytes", (json_int_t)in->n_bytes,
                                          "records", (json_int_t)in->n_records, "xxh3", h)) != 0) {
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

typedef struct reader {
    const char *path;
    tm_err *err;
    tm_rc rc;
} reader;

static void bad(reader *r, const char *field) {
    if (!r->rc)
        r->rc = TM_ERR(r->err, TM_E_PARSE,
                       "%s: %s: missing or of the wrong type (not a manifest "
                       "this tokenmill understands; rerun with --restart to start over)",
                       r->path, field);
}

static uint64_t get_u64(reader *r, const json_t *o, const char *key, const char *field) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        bad(r, field);
        return 0;
    }
    return (uint64_t)json_integer_value(v);
}

static tm_rc files_from_json(reader *r, const json_t *a, bool with_hash, const char *field,
                             tm_manifest_file **out, size_t *n_out) {
    if (!json_is_array(a)) {
        bad(r, field);
        return r->rc;
    }
    size_t n = json_array_size(a);
    tm_manifest_file *fs = tm_calloc(n ? n : 1, sizeof(*fs));
    if (!fs)
        return TM_ERR(r->err, TM_E_NOMEM, "manifest files");
    *out = fs;
    for (size_t i = 0; i < n && !r->rc; i++) {
        const json_t *o = json_array_get(a, i);
        const char *name = json_string_value(json_object_get(o, "path"));
        const json_t *size = json_object_get(o, "size"), *mt = json_object_get(o, "mtime_ns");
        if (!name || !json_is_integer(size) || !json_is_integer(mt)) {
            bad(r, field);
            break;
        }
        fs[i].name = tm_path_unescape(name); // written by tm_path_escape
        if (!fs[i].name)
            return TM_ERR(r->err, TM_E_NOMEM, "manifest files");
        *n_out = i + 1;
        fs[i].size = json_integer_value(size);
        fs[i].mtime_ns = json_integer_value(mt);
        const char *h = with_hash ? json_string_value(json_object_get(o, "xxh3")) : NULL;
        if (h)
            snprintf(fs[i].xxh3, sizeof(fs[i].xxh3), "%s", h);
        // the replacement check's fields (issue 35); absent in older manifests: not compared
        const char *smp = json_string_value(json_object_get(o, "sample_xxh3"));
        const json_t *ino = json_object_get(o, "inode"), *ct = json_object_get(o, "ctime_ns");
        if (smp && json_is_integer(ino) && json_is_integer(ct)) {
            snprintf(fs[i].sample, sizeof(fs[i].sample), "%s", smp);
            fs[i].inode = (uint64_t)json_integer_value(ino);
            fs[i].ctime_ns = json_integer_value(ct);
        }
    }
    return r->rc;
}

void tm_manifest_kpart_set_fp(tm_manifest *m, const char *topic, int32_t partition,
                              int64_t fp_offset, int64_t fp_ts) {
    for (size_t i = 0; i < m->n_kparts; i++)
        if (m->kparts[i].partition == partition && strcmp(m->kparts[i].topic, topic) == 0) {
            m->kparts[i].fp_offset = fp_offset;
            m->kparts[i].fp_ts = fp_ts;
        }
}

static tm_rc kparts_from_json(reader *r, const json_t *ik, tm_manifest *m) {
    if (!ik || json_is_null(ik))
        return TM_OK; // a file job, or a manifest of a tokenmill without Kafka input
    const json_t *parts = json_object_get(ik, "partitions");
    if (!json_is_array(parts)) {
        bad(r, "input_kafka.partitions");
        return r->rc;
    }
    for (size_t i = 0; i < json_array_size(parts) && !r->rc; i++) {
        const json_t *o = json_array_get(parts, i);
        const char *topic = json_string_value(json_object_get(o, "topic"));
        const json_t *pa = json_object_get(o, "partition"),
                     *above = json_object_get(o, "done_above");
        uint64_t next = get_u64(r, o, "next", "input_kafka.partitions[].next");
        if (!topic || !json_is_integer(pa) || json_integer_value(pa) < 0 ||
            json_integer_value(pa) > INT32_MAX || !json_is_array(above)) {
            bad(r, "input_kafka.partitions[]");
            break;
        }
        size_t n = json_array_size(above);
        uint64_t *rs = tm_malloc((2 * n + 1) * sizeof(*rs));
        if (!rs)
            return TM_ERR(r->err, TM_E_NOMEM, "manifest kafka offsets");
        uint64_t prev = next;
        for (size_t j = 0; j < n && !r->rc; j++) {
            const json_t *pair = json_array_get(above, j);
            const json_t *a = json_array_get(pair, 0), *b = json_array_get(pair, 1);
            if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
                (uint64_t)json_integer_value(a) <= prev ||
                json_integer_value(b) < json_integer_value(a)) {
                bad(r, "input_kafka.partitions[].done_above");
                break;
            }
            rs[2 * j] = (uint64_t)json_integer_value(a);
            rs[2 * j + 1] = (uint64_t)json_integer_value(b);
            prev = rs[2 * j + 1] + 1;
        }
        if (!r->rc &&
            tm_manifest_kpart_set(m, topic, (int32_t)json_integer_value(pa), next, rs, n, r->err)) {
            tm_free(rs);
            return r->err->rc;
        }
        tm_free(rs);
        const json_t *ck = json_object_get(o, "check"); // optional: absent before it was kept
        if (!r->rc && ck) {
            const json_t *co = json_object_get(ck, "offset"),
                         *ct = json_object_get(ck, "timestamp");
            if (!json_is_integer(co) || json_integer_value(co) < 0 || !json_is_integer(ct)) {
                bad(r, "input_kafka.partitions[].check");
                break;
            }
            tm_manifest_kpart_set_fp(m, topic, (int32_t)json_integer_value(pa),
                                     (int64_t)json_integer_value(co),
                                     (int64_t)json_integer_value(ct));
        }
    }
    const char *cid = json_string_value(json_object_get(ik, "cluster_id")); // optional
    if (!r->rc && cid && !(m->kafka_in_cluster = tm_strdup(cid)))
        return TM_ERR(r->err, TM_E_NOMEM, "manifest");
    return r->rc;
}

static tm_rc from_json(reader *r, const json_t *root, tm_manifest *m) {
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, FORMAT_NAME) != 0) {
        bad(r, "format");
        return r->rc;
    }
    if (get_u64(r, root, "version", "version") != TM_MANIFEST_VERSION) {
        bad(r, "version");
        return r->rc;
    }
    const json_t *job = json_object_get(root, "job");
    const char *hash = json_string_value(json_object_get(job, "spec_hash"));
    const char *jp = json_string_value(json_object_get(job, "path"));
    if (!hash || strlen(hash) != 32 || !jp) {
        bad(r, "job");
        return r->rc;
    }
    memcpy(m->spec_hash, hash, 33);
    m->job_path = tm_path_unescape(jp);
    if (!m->job_path)
        return TM_ERR(r->err, TM_E_NOMEM, "manifest");
    const json_t *spec = json_object_get(job, "spec"); // optional: older manifests lack it
    if (json_is_object(spec) &&
        !(m->spec_json = json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17))))
        return TM_ERR(r->err, TM_E_NOMEM, "manifest");
    if (files_from_json(r, json_object_get(json_object_get(root, "model"), "files"), true,
                        "model.files", &m->model_files, &m->n_model_files))
        return r->rc;
    if (files_from_json(r, json_object_get(root, "inputs"), false, "inputs", &m->inputs,
                        &m->n_inputs))
        return r->rc;
    const json_t *outs = json_object_get(root, "outputs");
    m->completions_plain = json_object_get(outs, TM_SINK_COMPLETIONS_PLAIN_FILE) != NULL;
    if (m->completions_plain)
        m->bytes_completions = get_u64(r, json_object_get(outs, TM_SINK_COMPLETIONS_PLAIN_FILE),
                                       "bytes", "outputs." TM_SINK_COMPLETIONS_PLAIN_FILE ".bytes");
    else
        m->bytes_completions = get_u64(r, json_object_get(outs, TM_SINK_COMPLETIONS_FILE), "bytes",
                                       "outputs." TM_SINK_COMPLETIONS_FILE ".bytes");
    m->bytes_errors = get_u64(r, json_object_get(outs, TM_SINK_ERRORS_FILE), "bytes",
                              "outputs." TM_SINK_ERRORS_FILE ".bytes");
    const json_t *kafka = json_object_get(root, "kafka");
    const char *topic = json_string_value(json_object_get(kafka, "topic"));
    if (topic && !(m->kafka_topic = tm_strdup(topic)))
        return TM_ERR(r->err, TM_E_NOMEM, "manifest");
    const json_t *rec = json_object_get(root, "records");
    m->done.watermark = get_u64(r, rec, "watermark", "records.watermark");
    const json_t *above = json_object_get(rec, "done_above");
    if (!json_is_array(above))
        bad(r, "records.done_above");
    // The ranges are ascending and disjoint, as ranges_json writes them, and hold at most 2^26
    // members in all (more is not a window: damage). Checked first, then copied in one pass:
    // adding them one by one took minutes for overlapping ranges (fuzz_manifest timeout seeds).
    uint64_t n_mem = 0, last = m->done.watermark;
    for (size_t i = 0; !r->rc && i < json_array_size(above); i++) {
        const json_t *pair = json_array_get(above, i);
        const json_t *a = json_array_get(pair, 0), *b = json_array_get(pair, 1);
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(b) < json_integer_value(a) ||
            (uint64_t)json_integer_value(a) <= last ||
            (uint64_t)(json_integer_value(b) - json_integer_value(a)) >= (1u << 26) - n_mem) {
            bad(r, "records.done_above");
            break;
        }
        n_mem += (uint64_t)(json_integer_value(b) - json_integer_value(a)) + 1;
        last = (uint64_t)json_integer_value(b);
    }
    if (!r->rc && n_mem) {
        m->done.above = tm_malloc(n_mem * sizeof(*m->done.above));
        if (!m->done.above)
            return TM_ERR(r->err, TM_E_NOMEM, "manifest: %llu done records",
                          (unsigned long long)n_mem);
        m->done.cap_above = n_mem;
        for (size_t i = 0; i < json_array_size(above); i++) {
            const json_t *pair = json_array_get(above, i);
            uint64_t a = (uint64_t)json_integer_value(json_array_get(pair, 0));
            uint64_t b = (uint64_t)json_integer_value(json_array_get(pair, 1));
            for (uint64_t s = a; s <= b; s++)
                m->done.above[m->done.n_above++] = s;
        }
    }
    const json_t *total = json_object_get(rec, "total");
    m->total_known = json_is_integer(total);
    if (m->total_known)
        m->n_records = get_u64(r, rec, "total", "records.total");
    const json_t *fin = json_object_get(rec, "finished");
    if (!json_is_boolean(fin))
        bad(r, "records.finished");
    m->finished = json_is_true(fin);
    const json_t *c = json_object_get(root, "counts");
    m->counts.n_ok = get_u64(r, c, "ok", "counts.ok");
    m->counts.n_failed = get_u64(r, c, "failed", "counts.failed");
    const json_t *by = json_object_get(c, "errors_by_code");
    for (int i = 1; json_is_object(by) && i < TM_ERRCODE_COUNT; i++) {
        const json_t *v = json_object_get(by, tm_errcode_name((tm_errcode)i));
        if (json_is_integer(v) && json_integer_value(v) > 0)
            m->counts.n_err_by_code[i] = (uint64_t)json_integer_value(v);
    }
    const json_t *tok = json_object_get(c, "tokens");
    m->counts.n_tok_prompt = get_u64(r, tok, "prompt", "counts.tokens.prompt");
    m->counts.n_tok_cached = get_u64(r, tok, "cached", "counts.tokens.cached");
    m->counts.n_tok_gen = get_u64(r, tok, "completion", "counts.tokens.completion");
    const json_t *cm = json_object_get(root, "commits");
    m->n_commits = get_u64(r, cm, "n", "commits.n");
    m->n_runs = (uint32_t)get_u64(r, cm, "runs", "commits.runs");
    if (!r->rc)
        kparts_from_json(r, json_object_get(root, "input_kafka"), m);
    const json_t *in = json_object_get(root, "stdin");
    if (!r->rc && in) { // optional: a job reading standard input (absent before it was kept)
        const char *h = json_string_value(json_object_get(in, "xxh3"));
        unsigned long long hi = 0, lo = 0;
        m->in_stdin.n_bytes = get_u64(r, in, "bytes", "stdin.bytes");
        m->in_stdin.n_records = get_u64(r, in, "records", "stdin.records");
        if (!h || strlen(h) != 32 || strspn(h, "0123456789abcdef") != 32 ||
            sscanf(h, "%16llx%16llx", &hi, &lo) != 2)
            bad(r, "stdin.xxh3");
        m->in_stdin.xxh3 = (tm_h128){.lo = lo, .hi = hi};
        m->in_stdin.set = !r->rc;
    }
    return r->rc;
}

tm_rc tm_manifest_load(const char *dir, tm_manifest *m, bool *found, tm_err *err) {
    memset(m, 0, sizeof(*m));
    *found = false;
    char *path = tm_fs_path_join(dir, TM_MANIFEST_FILE);
    if (!path)
        return TM_ERR(err, TM_E_NOMEM, "manifest path");
    tm_rc rc = TM_OK;
    json_error_t jerr;
    json_t *root = NULL;
    int64_t size;
    rc = tm_fs_check_out(path, &size, err); // a link or a FIFO is refused, never opened
    if (rc || size < 0)
        goto done;
    root = json_load_file(path, 0, &jerr);
    if (!root) {
        rc = TM_ERR(err, TM_E_PARSE,
                    "%s: line %d: %s (a manifest is replaced atomically, so this "
                    "file was damaged outside tokenmill; rerun with --restart to start over)",
                    path, jerr.line, jerr.text);
        goto done;
    }
    reader r = {.path = path, .err = err};
    rc = from_json(&r, root, m);
    if (!rc)
        *found = true;
done:
    json_decref(root);
    if (rc)
        tm_manifest_fini(m);
    tm_free(path);
    return rc;
}

tm_rc tm_manifest_save(const char *dir, const tm_manifest *m, tm_err *err) {
    json_t *root = to_json(m);
    if (!root)
        return TM_ERR(err, TM_E_NOMEM, "manifest JSON");
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_COMPACT);
    json_decref(root);
    char *path = tm_fs_path_join(dir, TM_MANIFEST_FILE);
    tm_rc rc;
    if (!text || !path) {
        rc = TM_ERR(err, TM_E_NOMEM, "manifest JSON");
    } else {
        // The commit protocol (manifest.h): writes, fsyncs and rename hooked, named crash points.
        const char *parts[] = {text, "\n"};
        rc = tm_fs_replace(path, parts, 2,
                           &(tm_fs_replace_opts){
                               .mode = 0666,
                               .durable = true,
                               .hooks = TM_FS_HOOKS_ON,
                               .point_before_rename = "after_fsync_before_rename",
                               .point_before_dirsync = "after_rename_before_dirsync",
                           },
                           err);
    }
    if (!rc)
        tm_fault_point("after_commit");
    free(text); // jansson's allocation
    tm_free(path);
    return rc;
}

// ---- recovery and lock ----

static tm_rc cut_file(const char *dir, const char *name, uint64_t len, uint64_t *cut, tm_err *err) {
    char *path = tm_fs_path_join(dir, name);
    if (!path)
        return TM_ERR(err, TM_E_NOMEM, "output path");
    int64_t size;
    tm_rc rc = tm_fs_check_out(path, &size, err); // a link is refused, never cut
    if (!rc && size < 0 && len > 0)
        rc = TM_ERR(err, TM_E_IO,
                    "%s: %s, but the manifest commits %llu bytes of it "
                    "(the output folder was damaged; rerun with --restart to start over)",
                    path, strerror(ENOENT), (unsigned long long)len);
    if (rc || size < 0) {
        tm_free(path);
        return rc;
    }
    if ((uint64_t)size < len) {
        rc = TM_ERR(err, TM_E_IO,
                    "%s has %lld bytes but the manifest commits %llu (committed "
                    "bytes were lost: the output folder was damaged outside tokenmill; rerun "
                    "with --restart to start over)",
                    path, (long long)size, (unsigned long long)len);
    } else if ((uint64_t)size > len) {
        *cut += (uint64_t)size - len;
        int fd = -1;
        rc = tm_fs_open_out(path, O_WRONLY, 0, NULL, &fd, err);
        int e = rc ? 0 : tm_fault_io(TM_IO_TRUNCATE);
        if (!rc && (e || ftruncate(fd, (off_t)len) != 0))
            rc = TM_ERR(err, TM_E_IO, "cutting %s to its committed %llu bytes: %s", path,
                        (unsigned long long)len, strerror(e ? e : errno));
        e = rc ? 0 : tm_fault_io(TM_IO_FSYNC);
        if (!rc && (e || fsync(fd) != 0))
            rc = TM_ERR(err, TM_E_IO, "fsync %s: %s", path, strerror(e ? e : errno));
        if (fd >= 0)
            close(fd);
    }
    tm_free(path);
    return rc;
}

// Check one data file of a finished job against its committed length len: the file holds exactly
// len bytes; an LZ4 file decodes to its end with every frame whole and its content checksum
// right; a plain JSONL file ends with a newline.
static tm_rc verify_file(const char *dir, const char *name, uint64_t len, bool lz4, tm_err *err) {
    char *path = tm_fs_path_join(dir, name);
    if (!path)
        return TM_ERR(err, TM_E_NOMEM, "output path");
    int64_t size;
    tm_rc rc = tm_fs_check_out(path, &size, err); // a link or FIFO is refused, never read
    if (!rc && size < 0 && len > 0)
        rc = TM_ERR(err, TM_E_IO, "%s is missing, but the manifest commits %llu bytes of it", path,
                    (unsigned long long)len);
    else if (!rc && size >= 0 && (uint64_t)size < len)
        rc = TM_ERR(err, TM_E_IO,
                    "%s has %lld bytes, but the manifest commits %llu: it was truncated or "
                    "emptied after the job wrote it",
                    path, (long long)size, (unsigned long long)len);
    else if (!rc && size >= 0 && (uint64_t)size > len)
        rc = TM_ERR(err, TM_E_IO,
                    "%s has %lld bytes, but the manifest commits %llu: something wrote to it "
                    "after the job finished",
                    path, (long long)size, (unsigned long long)len);
    if (rc || len == 0) {
        tm_free(path);
        return rc;
    }
    FILE *fp = NULL;
    rc = tm_fs_fopen_in(path, "output", &fp, err);
    LZ4F_dctx *dctx = NULL;
    char *src = NULL, *dst = NULL;
    enum { CH = 1 << 16 };
    if (!rc && lz4 && LZ4F_isError(LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION)))
        rc = TM_ERR(err, TM_E_NOMEM, "LZ4 decompression context");
    if (!rc && (!(src = tm_malloc(CH)) || !(dst = tm_malloc(CH))))
        rc = TM_ERR(err, TM_E_NOMEM, "verifying %s", path);
    uint64_t at = 0;  // bytes of the file read
    size_t hint = 1;  // LZ4F's: 0 when the last frame ended
    char last = '\n'; // a plain file's last byte
    while (!rc && at < len) {
        size_t n = fread(src, 1, (size_t)TM_MIN((uint64_t)CH, len - at), fp);
        if (n == 0) {
            rc = TM_ERR(err, TM_E_IO, "reading %s: %s", path,
                        ferror(fp) ? strerror(errno) : "it shrank while it was read");
            break;
        }
        if (!lz4)
            last = src[n - 1];
        for (size_t off = 0; lz4 && off < n;) {
            size_t in = n - off, out = CH;
            hint = LZ4F_decompress(dctx, dst, &out, src + off, &in, NULL);
            if (LZ4F_isError(hint)) {
                rc = TM_ERR(err, TM_E_IO,
                            "%s: the LZ4 data is damaged near byte %llu (%s): it changed after "
                            "the job wrote it",
                            path, (unsigned long long)(at + off), LZ4F_getErrorName(hint));
                break;
            }
            off += in;
        }
        at += n;
    }
    if (!rc && lz4 && hint != 0)
        rc = TM_ERR(err, TM_E_IO,
                    "%s: the committed %llu bytes end inside an LZ4 frame: it was cut or changed "
                    "after the job wrote it",
                    path, (unsigned long long)len);
    if (!rc && !lz4 && last != '\n')
        rc = TM_ERR(err, TM_E_IO,
                    "%s: its last line has no newline: it changed after the job "
                    "wrote it",
                    path);
    if (dctx)
        LZ4F_freeDecompressionContext(dctx);
    tm_free(src);
    tm_free(dst);
    if (fp)
        fclose(fp);
    tm_free(path);
    return rc;
}

tm_rc tm_manifest_verify(const char *dir, const tm_manifest *m, tm_err *err) {
    tm_rc rc = verify_file(
        dir, m->completions_plain ? TM_SINK_COMPLETIONS_PLAIN_FILE : TM_SINK_COMPLETIONS_FILE,
        m->bytes_completions, !m->completions_plain, err);
    if (!rc)
        rc = verify_file(dir, TM_SINK_ERRORS_FILE, m->bytes_errors, false, err);
    return rc;
}

tm_rc tm_manifest_recover(const char *dir, const tm_manifest *m, uint64_t *cut_bytes, tm_err *err) {
    *cut_bytes = 0;
    static const char *const tmps[] = {TM_MANIFEST_FILE ".tmp", "metrics.json.tmp"};
    for (size_t i = 0; i < sizeof(tmps) / sizeof(tmps[0]); i++) {
        char *p = tm_fs_path_join(dir, tmps[i]);
        if (!p)
            return TM_ERR(err, TM_E_NOMEM, "output path");
        unlink(p); // a leftover of a crash; never read
        tm_free(p);
    }
    tm_rc rc = cut_file(
        dir, m->completions_plain ? TM_SINK_COMPLETIONS_PLAIN_FILE : TM_SINK_COMPLETIONS_FILE,
        m->bytes_completions, cut_bytes, err);
    if (!rc)
        rc = cut_file(dir, TM_SINK_ERRORS_FILE, m->bytes_errors, cut_bytes, err);
    return rc;
}

static tm_rc held_elsewhere(const char *dir, const char *what, tm_err *err) {
    return TM_ERR(err, TM_E_AGAIN,
                  "another tokenmill process is running a job in %s (it holds %s); wait for it "
                  "to end",
                  dir, what);
}

tm_rc tm_manifest_lock(const char *dir, tm_manifest_lk *lk, tm_err *err) {
    *lk = (tm_manifest_lk)TM_MANIFEST_LK_INIT;
    tm_rc rc = tm_fs_mkdir_p(dir, err);
    if (rc)
        return rc;
    // The folder itself first: unlike a file in it, it cannot be deleted and made anew under a
    // running job (rm of tokenmill.lock let a second writer in, issue 24).
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    if (d < 0)
        return TM_ERR(err, TM_E_IO, "opening %s: %s", dir, strerror(errno));
    if (flock(d, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(d);
        d = -1;
        if (e == EWOULDBLOCK)
            return held_elsewhere(dir, "a lock on the folder", err);
        TM_LOG_WARN("manifest",
                    "cannot lock the folder %s itself (%s): only %s guards it, so deleting that "
                    "file while a job runs would let a second one in",
                    dir, strerror(e), TM_MANIFEST_LOCK_FILE);
    }
    lk->dir_fd = d;
    char *path = tm_fs_path_join(dir, TM_MANIFEST_LOCK_FILE);
    if (!path) {
        rc = TM_ERR(err, TM_E_NOMEM, "lock path");
        goto fail;
    }
    rc = tm_fs_open_out(path, O_RDONLY | O_CREAT, 0666, &lk->created, &lk->file_fd, err);
    if (!rc && flock(lk->file_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        rc = e == EWOULDBLOCK ? held_elsewhere(dir, path, err)
                              : TM_ERR(err, TM_E_IO, "locking %s: %s", path, strerror(e));
    }
    tm_free(path);
    if (rc)
        goto fail;
    return TM_OK;
fail:
    tm_manifest_unlock(lk);
    return rc;
}

void tm_manifest_unlock(tm_manifest_lk *lk) {
    if (lk->file_fd >= 0)
        close(lk->file_fd); // drops the flock
    if (lk->dir_fd >= 0)
        close(lk->dir_fd);
    lk->file_fd = lk->dir_fd = -1;
}

void tm_manifest_unlock_tidy(const char *dir, tm_manifest_lk *lk) {
    if (lk->file_fd >= 0 && lk->dir_fd >= 0) {
        struct stat st;
        if (fstatat(lk->dir_fd, TM_MANIFEST_FILE, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode) && unlinkat(lk->dir_fd, TM_MANIFEST_LOCK_FILE, 0) != 0 &&
            errno != ENOENT)
            TM_LOG_WARN("manifest", "removing %s/%s: %s", dir, TM_MANIFEST_LOCK_FILE,
                        strerror(errno));
    }
    tm_manifest_unlock(lk);
}

tm_rc tm_manifest_check_folder(const char *dir, const tm_manifest_lk *lk, bool fresh, tm_err *err) {
    static const char *const names[] = {
        TM_MANIFEST_FILE,    TM_SINK_COMPLETIONS_FILE, TM_SINK_COMPLETIONS_PLAIN_FILE,
        TM_SINK_ERRORS_FILE, "metrics.json",           TM_MANIFEST_FILE ".tmp",
        "metrics.json.tmp"};
    char found[512] = "";
    size_t n_found = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char *p = tm_fs_path_join(dir, names[i]);
        if (!p)
            return TM_ERR(err, TM_E_NOMEM, "output path");
        int64_t size;
        tm_rc rc = tm_fs_check_out(p, &size, err);
        tm_free(p);
        if (rc)
            return rc;
        if (size >= 0) {
            size_t len = strlen(found);
            snprintf(found + len, sizeof(found) - len, "%s%s", n_found ? ", " : "", names[i]);
            n_found++;
        }
    }
    if (!fresh || !lk->created || n_found == 0)
        return TM_OK;
    char *lock = tm_fs_path_join(dir, TM_MANIFEST_LOCK_FILE);
    if (lock)
        unlink(lock); // made by this run a moment ago; the next run must find the folder as it was
    tm_free(lock);
    return TM_ERR(err, TM_E_INVAL,
                  "output folder %s holds %s but no %s or %s: these files were not written by "
                  "tokenmill, and a new job would overwrite them. Move them away or choose "
                  "another output.dir (tokenmill run --restart overwrites them)",
                  dir, found, TM_MANIFEST_FILE, TM_MANIFEST_LOCK_FILE);
}
