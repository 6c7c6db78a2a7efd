/* runner/model/engram_table.c - Engram tables read by rows with pread into a fixed row cache (see
 * the header for the format, the checks and the threading).
 *
 * The cache: n_slots slots of one stored row each (dim e4m3 bytes then dim / 32 e8m0 bytes), a
 * clock (second chance) over the slots, and an open-addressing index (linear probing, deletion by
 * backward shift) from row id to slot. A slot is EMPTY, LOADING (queued or being read: never
 * evicted), READY or FAILED (the read failed; the next get of that row reports it and frees the
 * slot). A get pins the slots it waits on (pin > 0: never evicted), so the rows it asked for
 * cannot vanish between the read and the dequantization. The read queue is a ring of slot ids;
 * every queued slot is LOADING, so the ring never holds more than n_slots entries.
 *
 * Everything is allocated at open: get and prefetch allocate nothing. A get takes rows in chunks
 * of GET_CHUNK (a fixed array on the stack): it queues the chunk's misses at once, helps the
 * reader threads drain the queue, then waits for the rest and dequantizes. A row that finds no
 * evictable slot (every slot pinned or loading) is read by the get itself into a stack buffer.
 * A get's misses enter the queue at its front, ahead of the prefetches queued before. */
#include "runner/model/engram_table.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/fsutil.h"
#include "runner/model/safetensors.h"
#include "runner/model/tensor.h"

#define GET_CHUNK 256
#define NO_SLOT UINT32_MAX

enum { SLOT_EMPTY = 0, SLOT_LOADING, SLOT_READY, SLOT_FAILED };

/* One of the two tensors, in its file. */
typedef struct part {
    char *path;      /* owned */
    char *label;     /* owned; the file's base name, for messages */
    char *tensor;    /* owned; the tensor's name */
    int fd;          /* owned; -1 when not open */
    uint64_t off;    /* file offset of row 0 */
    uint64_t stride; /* bytes per row */
} part;

struct tm_engram_table {
    part w, s; /* values (F8_E4M3 [rows][dim]) and scales (E8M0/U8 [rows][dim / 32]) */
    tm_engram_table_info info;
    uint64_t row_end;  /* min(row0 + n_rows, rows): shard rows at or past it read as zeros */
    uint32_t n_scale;  /* dim / 32 */
    float lut[256];    /* e4m3 byte -> f32 */
    size_t slot_bytes; /* dim + n_scale */

    pthread_mutex_t mu;     /* guards everything below but the slot bytes of LOADING slots */
    pthread_cond_t cv_work; /* the queue got entries, or stop */
    pthread_cond_t cv_done; /* a slot left LOADING */
    uint8_t *data;          /* owned; [n_slots][slot_bytes] */
    uint64_t *slot_row;     /* owned; [n_slots] the row a non-EMPTY slot holds */
    uint8_t *state;         /* owned; [n_slots] SLOT_* */
    uint8_t *ref;           /* owned; [n_slots] clock bit */
    uint16_t *pin;          /* owned; [n_slots] gets waiting on the slot */
    int32_t *fail;          /* owned; [n_slots] FAILED: errno (0: end of file), +1000 if scales */
    uint32_t hand;          /* clock hand */
    uint32_t *index;        /* owned; [index_mask + 1] slot ids, NO_SLOT where free */
    uint32_t index_mask;
    uint32_t *queue; /* owned; [n_slots] ring of LOADING slots waiting for a reader */
    uint32_t q_head, q_n;
    bool stop;
    pthread_t *threads; /* owned; [n_threads] */
    uint32_t n_threads; /* started */
    bool sync_ok;       /* mu and the condition variables were initialised */
    tm_engram_table_stats st;
};

/* ---- the value definition ------------------------------------------------------------------ */

void tm_engram_row_dequant(const uint8_t *vals, const uint8_t *scales, uint32_t dim, float *out) {
    for (uint32_t b = 0; b < dim / TM_ENGRAM_BLOCK; b++) {
        float sc = tm_e8m0_to_f32(scales[b]);
        for (uint32_t j = b * TM_ENGRAM_BLOCK; j < (b + 1) * TM_ENGRAM_BLOCK; j++)
            out[j] = tm_bf16_to_f32(tm_f32_to_bf16(tm_e4m3_to_f32(vals[j]) * sc));
    }
}

// The same with the table's lookup table for the e4m3 bytes (identical values). An e4m3 value has
// at most 4 significant bits, so with a scale of 2^-117 or more (byte >= 10) every product is an
// fp32 normal (or zero, inf, NaN) with at most 4 significant bits: exactly a bf16 value, and the
// rounding is the identity. Smaller scales (products that may be fp32 subnormals) and the NaN
// scale take the rounding path.
static void dequant_row(const tm_engram_table *t, const uint8_t *row, float *out) {
    const uint8_t *vals = row, *scales = row + t->info.dim;
    for (uint32_t b = 0; b < t->n_scale; b++) { // hot loop: one row of a get
        float sc = tm_e8m0_to_f32(scales[b]);
        const uint8_t *v = vals + (size_t)b * TM_ENGRAM_BLOCK;
        float *o = out + (size_t)b * TM_ENGRAM_BLOCK;
        if (scales[b] >= 10 && scales[b] != 0xff) {
            for (uint32_t j = 0; j < TM_ENGRAM_BLOCK; j++)
                o[j] = t->lut[v[j]] * sc;
        } else {
            for (uint32_t j = 0; j < TM_ENGRAM_BLOCK; j++)
                o[j] = tm_bf16_to_f32(tm_f32_to_bf16(t->lut[v[j]] * sc));
        }
    }
}

/* ---- header checks -------------------------------------------------------------------------- */

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static const char *file_kind(mode_t m) {
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a regular file";
}

/* The file must be exactly as long as its header describes; find name in it. */
static tm_rc find_sized(const tm_st_file *f, uint64_t file_bytes, const char *label,
                        const char *name, const tm_st_tensor **out, tm_err *err) {
    const tm_st_tensor *t = tm_st_file_find(f, name);
    if (!t)
        return TM_ERR(err, TM_E_PARSE, "%s: no tensor '%.100s' in its header", label, name);
    uint64_t want = tm_st_file_data_start(f) + tm_st_file_data_bytes(f);
    uint64_t t_end = tm_st_file_data_start(f) + t->offset + t->n_bytes;
    if (file_bytes < want)
        return TM_ERR(err, TM_E_IO,
                      "%s: file is %llu bytes but its header describes %llu (tensor '%.100s' "
                      "ends at byte %llu): truncated",
                      label, (unsigned long long)file_bytes, (unsigned long long)want, name,
                      (unsigned long long)t_end);
    if (file_bytes > want)
        return TM_ERR(err, TM_E_IO,
                      "%s: file is %llu bytes but its header describes %llu: %llu trailing bytes",
                      label, (unsigned long long)file_bytes, (unsigned long long)want,
                      (unsigned long long)(file_bytes - want));
    *out = t;
    return TM_OK;
}

static tm_rc check_weight(const tm_st_tensor *t, const char *label, uint64_t *rows, uint32_t *dim,
                          tm_err *err) {
    if (t->dtype != TM_DTYPE_F8_E4M3)
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': dtype %s, want F8_E4M3", label,
                      t->name, tm_dtype_name(t->dtype));
    if (t->n_dim != 2)
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': %u dimensions, want 2 [rows][dim]",
                      label, t->name, t->n_dim);
    if (t->shape[0] == 0 || t->shape[1] == 0 || t->shape[1] % TM_ENGRAM_BLOCK ||
        t->shape[1] > TM_ENGRAM_MAX_DIM)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: tensor '%.100s': shape [%llu, %llu], want rows >= 1 and dim a "
                      "multiple of %d in [%d, %d]",
                      label, t->name, (unsigned long long)t->shape[0],
                      (unsigned long long)t->shape[1], TM_ENGRAM_BLOCK, TM_ENGRAM_BLOCK,
                      TM_ENGRAM_MAX_DIM);
    *rows = t->shape[0];
    *dim = (uint32_t)t->shape[1];
    return TM_OK;
}

static tm_rc check_scale(const tm_st_tensor *t, const char *label, uint64_t rows, uint32_t dim,
                         tm_err *err) {
    if (t->dtype != TM_DTYPE_F8_E8M0 && t->dtype != TM_DTYPE_U8)
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': dtype %s, want F8_E8M0 or U8", label,
                      t->name, tm_dtype_name(t->dtype));
    if (t->n_dim != 2 || t->shape[0] != rows || t->shape[1] != dim / TM_ENGRAM_BLOCK)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: tensor '%.100s': shape %s[%llu, %llu], want [%llu, %u] (one scale per "
                      "%d values of the weight)",
                      label, t->name, t->n_dim == 2 ? "" : "not 2-D ",
                      (unsigned long long)(t->n_dim > 0 ? t->shape[0] : 0),
                      (unsigned long long)(t->n_dim > 1 ? t->shape[1] : 0),
                      (unsigned long long)rows, dim / TM_ENGRAM_BLOCK, TM_ENGRAM_BLOCK);
    return TM_OK;
}

tm_rc tm_engram_file_check(const void *head, size_t n_head, uint64_t file_bytes, const char *label,
                           const char *weight_name, const char *scale_name,
                           tm_engram_table_info *info, tm_err *err) {
    tm_st_file *f = NULL;
    tm_rc rc = tm_st_header_parse(head, n_head, label, &f, err);
    if (rc)
        return rc;
    const tm_st_tensor *tw = NULL, *ts = NULL;
    uint64_t rows = 0;
    uint32_t dim = 0;
    rc = find_sized(f, file_bytes, label, weight_name, &tw, err);
    if (!rc)
        rc = find_sized(f, file_bytes, label, scale_name, &ts, err);
    if (!rc)
        rc = check_weight(tw, label, &rows, &dim, err);
    if (!rc)
        rc = check_scale(ts, label, rows, dim, err);
    if (!rc) {
        memset(info, 0, sizeof(*info));
        info->rows = rows;
        info->dim = dim;
    }
    tm_st_file_close(f);
    return rc;
}

/* ---- opening the files ---------------------------------------------------------------------- */

static tm_rc path_join(const char *dir, const char *name, char **out, tm_err *err) {
    *out = tm_fs_path_join(dir, name); // base/fsutil.h
    return *out ? TM_OK : TM_ERR(err, TM_E_NOMEM, "path %s/%s", dir, name);
}

/* The file holding tensor name: path itself, or inside the folder path (through its index). */
static tm_rc resolve_file(const char *path, const char *name, char **out, tm_err *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return TM_ERR(err, TM_E_IO, "%s: stat: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        *out = tm_strdup(path);
        return *out ? TM_OK : TM_ERR(err, TM_E_NOMEM, "path %s", path);
    }
    char *index = NULL;
    tm_rc rc = path_join(path, "model.safetensors.index.json", &index, err);
    if (rc)
        return rc;
    if (access(index, F_OK) != 0) {
        tm_free(index);
        return path_join(path, "model.safetensors", out, err);
    }
    json_error_t je;
    json_t *root = json_load_file(index, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        rc = TM_ERR(err, TM_E_PARSE, "%s: not valid JSON: %s (line %d)", index, je.text, je.line);
        goto out;
    }
    json_t *map = json_object_get(root, "weight_map");
    json_t *shard = json_is_object(map) ? json_object_get(map, name) : NULL;
    if (!json_is_object(map))
        rc = TM_ERR(err, TM_E_PARSE, "%s: weight_map is missing or not an object", index);
    else if (!shard)
        rc = TM_ERR(err, TM_E_PARSE, "%s: weight_map has no tensor '%.100s'", index, name);
    else if (!json_is_string(shard) || !json_string_value(shard)[0] ||
             strchr(json_string_value(shard), '/') || !strcmp(json_string_value(shard), ".") ||
             !strcmp(json_string_value(shard), ".."))
        rc = TM_ERR(err, TM_E_PARSE,
                    "%s: weight_map['%.100s'] is not a plain file name in the model folder", index,
                    name);
    else
        rc = path_join(path, json_string_value(shard), out, err);
out:
    json_decref(root);
    tm_free(index);
    return rc;
}

// pread all of buf[0..n) at off; EINTR retried. Returns 0, an errno, or -1 at end of file.
static int pread_full(int fd, void *buf, size_t n, uint64_t off) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (got == 0)
            return -1;
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

/* Open p->path, check it is a regular file, read and validate its header, find the tensor and
 * check the file size. *tensor_out gets a copy of the tensor entry. */
static tm_rc part_open(part *p, const char *name, tm_st_tensor *tensor_out, tm_err *err) {
    p->label = tm_strdup(base_name(p->path));
    p->tensor = tm_strdup(name);
    if (!p->label || !p->tensor)
        return TM_ERR(err, TM_E_NOMEM, "%s: names", p->path);
    // O_NONBLOCK: a FIFO would otherwise block the open until a writer comes
    p->fd = open(p->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (p->fd < 0)
        return TM_ERR(err, TM_E_IO, "%s: open: %s", p->path, strerror(errno));
    struct stat st;
    if (fstat(p->fd, &st) != 0)
        return TM_ERR(err, TM_E_IO, "%s: stat: %s", p->path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return TM_ERR(err, TM_E_IO,
                      "%s: %s, not a regular file: Engram tables are read from regular files",
                      p->path, file_kind(st.st_mode));
    int fl = fcntl(p->fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(p->fd, F_SETFL, fl & ~O_NONBLOCK);
    uint64_t file_bytes = (uint64_t)st.st_size;
    uint8_t len8[8];
    if (file_bytes < 8)
        return TM_ERR(err, TM_E_PARSE, "%s: file is %llu bytes, too short for the header length",
                      p->path, (unsigned long long)file_bytes);
    int e = pread_full(p->fd, len8, 8, 0);
    if (e)
        return TM_ERR(err, TM_E_IO, "%s: read: %s", p->path, e < 0 ? "end of file" : strerror(e));
    uint64_t n_hdr = 0;
    for (int i = 7; i >= 0; i--)
        n_hdr = n_hdr << 8 | len8[i];
    if (n_hdr > TM_ST_MAX_HEADER_BYTES)
        return TM_ERR(err, TM_E_PARSE, "%s: header length %llu exceeds the %u-byte limit", p->path,
                      (unsigned long long)n_hdr, TM_ST_MAX_HEADER_BYTES);
    if (n_hdr > file_bytes - 8)
        return TM_ERR(err, TM_E_IO,
                      "%s: header length %llu runs past the end of the file (%llu bytes): "
                      "truncated",
                      p->path, (unsigned long long)n_hdr, (unsigned long long)file_bytes);
    size_t n_head = 8 + (size_t)n_hdr;
    uint8_t *head = tm_malloc(n_head);
    if (!head)
        return TM_ERR(err, TM_E_NOMEM, "%s: header of %zu bytes", p->path, n_head);
    memcpy(head, len8, 8);
    tm_rc rc = TM_OK;
    tm_st_file *f = NULL;
    e = pread_full(p->fd, head + 8, (size_t)n_hdr, 8);
    if (e) {
        rc = TM_ERR(err, TM_E_IO, "%s: read header: %s", p->path,
                    e < 0 ? "end of file" : strerror(e));
        goto out;
    }
    rc = tm_st_header_parse(head, n_head, p->label, &f, err);
    if (rc)
        goto out;
    const tm_st_tensor *t = NULL;
    rc = find_sized(f, file_bytes, p->label, name, &t, err);
    if (rc)
        goto out;
    *tensor_out = *t;
    tensor_out->name = NULL; // the entry's strings die with f
    tensor_out->file = NULL;
    p->off = tm_st_file_data_start(f) + t->offset;
    (void)posix_fadvise(p->fd, 0, 0, POSIX_FADV_RANDOM); // rows are random: no readahead
out:
    tm_st_file_close(f);
    tm_free(head);
    return rc;
}

static void part_fini(part *p) {
    if (p->fd >= 0)
        close(p->fd);
    tm_free(p->path);
    tm_free(p->label);
    tm_free(p->tensor);
}

/* ---- the cache ------------------------------------------------------------------------------ */

static uint32_t index_home(const tm_engram_table *t, uint64_t row) {
    return (uint32_t)((row * 0x9e3779b97f4a7c15ull) >> 32) & t->index_mask;
}

static uint32_t cache_find(const tm_engram_table *t, uint64_t row) {
    for (uint32_t i = index_home(t, row);; i = (i + 1) & t->index_mask) {
        uint32_t s = t->index[i];
        if (s == NO_SLOT)
            return NO_SLOT;
        if (t->slot_row[s] == row)
            return s;
    }
}

static void index_insert(tm_engram_table *t, uint32_t s) {
    uint32_t i = index_home(t, t->slot_row[s]);
    while (t->index[i] != NO_SLOT)
        i = (i + 1) & t->index_mask;
    t->index[i] = s;
}

// Remove slot s (present) from the index; shift later entries of its probe run back.
static void index_remove(tm_engram_table *t, uint32_t s) {
    uint32_t i = index_home(t, t->slot_row[s]);
    while (t->index[i] != s)
        i = (i + 1) & t->index_mask;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & t->index_mask;
        uint32_t sj = t->index[j];
        if (sj == NO_SLOT)
            break;
        uint32_t home = index_home(t, t->slot_row[sj]);
        // sj may move to the hole i unless its home lies cyclically in (i, j]
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            t->index[i] = sj;
            i = j;
        }
    }
    t->index[i] = NO_SLOT;
}

/* A slot for row (not cached): a free or evicted one, now LOADING, in the index, clock bit set.
 * NO_SLOT when every slot is pinned or loading. */
static uint32_t slot_take(tm_engram_table *t, uint64_t row) {
    uint32_t n = t->info.n_slots, s = NO_SLOT;
    for (uint64_t step = 0; step < 2ull * n + 1; step++) {
        uint32_t c = t->hand;
        t->hand = c + 1 == n ? 0 : c + 1;
        if (t->state[c] == SLOT_LOADING || t->pin[c])
            continue;
        if (t->state[c] != SLOT_EMPTY && t->ref[c]) {
            t->ref[c] = 0; // second chance
            continue;
        }
        s = c;
        break;
    }
    if (s == NO_SLOT)
        return NO_SLOT;
    if (t->state[s] != SLOT_EMPTY) {
        index_remove(t, s);
        t->st.evictions += t->state[s] == SLOT_READY;
    }
    t->slot_row[s] = row;
    t->state[s] = SLOT_LOADING;
    t->ref[s] = 1;
    index_insert(t, s);
    return s;
}

static void queue_push(tm_engram_table *t, uint32_t s) {
    TM_ASSERT(t->q_n < t->info.n_slots);
    uint32_t at = t->q_head + t->q_n;
    if (at >= t->info.n_slots)
        at -= t->info.n_slots;
    t->queue[at] = s;
    t->q_n++;
}

// A get's own misses go first: a get waits for them, a prefetch is only ahead of time.
static void queue_push_front(tm_engram_table *t, uint32_t s) {
    TM_ASSERT(t->q_n < t->info.n_slots);
    t->q_head = t->q_head == 0 ? t->info.n_slots - 1 : t->q_head - 1;
    t->queue[t->q_head] = s;
    t->q_n++;
}

static uint32_t queue_pop(tm_engram_table *t) {
    uint32_t s = t->queue[t->q_head];
    t->q_head = t->q_head + 1 == t->info.n_slots ? 0 : t->q_head + 1;
    t->q_n--;
    return s;
}

/* Read the stored row into buf (dim values then n_scale scales). 0, or a fail code: errno (0 for
 * end of file), plus 1000 when the scales' read failed. */
static int32_t read_row(const tm_engram_table *t, uint64_t row, uint8_t *buf) {
    int e = pread_full(t->w.fd, buf, t->info.dim, t->w.off + row * t->w.stride);
    if (e)
        return e < 0 ? 0 : e;
    e = pread_full(t->s.fd, buf + t->info.dim, t->n_scale, t->s.off + row * t->s.stride);
    if (e)
        return 1000 + (e < 0 ? 0 : e);
    return -1;
}

static tm_rc read_error(const tm_engram_table *t, uint64_t row, int32_t code, tm_err *err) {
    const part *p = code >= 1000 ? &t->s : &t->w;
    int e = code >= 1000 ? code - 1000 : code;
    uint64_t off = p->off + row * p->stride;
    if (e == 0)
        return TM_ERR(err, TM_E_IO,
                      "%s: tensor '%.100s': row %llu at offset %llu is past the end of the file "
                      "(the file shrank after it was opened)",
                      p->path, p->tensor, (unsigned long long)row, (unsigned long long)off);
    return TM_ERR(err, TM_E_IO, "%s: tensor '%.100s': pread of row %llu at offset %llu: %s",
                  p->path, p->tensor, (unsigned long long)row, (unsigned long long)off,
                  strerror(e));
}

/* Read the queued slot s (mutex held on entry and on return; released during the read). */
static void load_slot(tm_engram_table *t, uint32_t s) {
    uint64_t row = t->slot_row[s];
    uint8_t *buf = t->data + (size_t)s * t->slot_bytes;
    pthread_mutex_unlock(&t->mu);
    int32_t code = read_row(t, row, buf);
    pthread_mutex_lock(&t->mu);
    t->st.reads++;
    if (code < 0) {
        t->state[s] = SLOT_READY;
        t->st.bytes_read += t->slot_bytes;
    } else {
        t->state[s] = SLOT_FAILED;
        t->fail[s] = code;
    }
    pthread_cond_broadcast(&t->cv_done);
}

static void *reader_main(void *arg) {
    tm_engram_table *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        if (t->q_n == 0) {
            pthread_cond_wait(&t->cv_work, &t->mu);
            continue;
        }
        load_slot(t, queue_pop(t));
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static bool in_shard(const tm_engram_table *t, uint64_t row) {
    return row >= t->info.row0 && row < t->row_end;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static size_t slot_cost(size_t slot_bytes) {
    // row + slot_row 8 + state 1 + ref 1 + pin 2 + fail 4 + queue 4 + index <= 4 x 4
    return slot_bytes + 8 + 1 + 1 + 2 + 4 + 4 + 16;
}

tm_rc tm_engram_table_open(const tm_engram_table_cfg *cfg, tm_engram_table **out, tm_err *err) {
    if (!cfg->path || !cfg->weight_name || !cfg->scale_name)
        return TM_ERR(err, TM_E_INVAL, "engram table: path and tensor names are required");
    if (cfg->world == 0 || cfg->rank >= cfg->world)
        return TM_ERR(err, TM_E_INVAL, "engram table %s: rank %u of world %u", cfg->weight_name,
                      cfg->rank, cfg->world);
    tm_engram_table *t = tm_calloc(1, sizeof(*t));
    if (!t)
        return TM_ERR(err, TM_E_NOMEM, "engram table");
    t->w.fd = t->s.fd = -1;
    tm_rc rc = resolve_file(cfg->path, cfg->weight_name, &t->w.path, err);
    if (rc)
        goto fail;
    rc = resolve_file(cfg->path, cfg->scale_name, &t->s.path, err);
    if (rc)
        goto fail;
    tm_st_tensor tw, ts;
    rc = part_open(&t->w, cfg->weight_name, &tw, err);
    if (rc)
        goto fail;
    rc = part_open(&t->s, cfg->scale_name, &ts, err);
    if (rc)
        goto fail;
    tw.name = cfg->weight_name;
    ts.name = cfg->scale_name;
    uint64_t rows = 0;
    uint32_t dim = 0;
    rc = check_weight(&tw, t->w.label, &rows, &dim, err);
    if (rc)
        goto fail;
    rc = check_scale(&ts, t->s.label, rows, dim, err);
    if (rc)
        goto fail;
    t->info.rows = rows;
    t->info.dim = dim;
    t->n_scale = dim / TM_ENGRAM_BLOCK;
    t->w.stride = dim;
    t->s.stride = t->n_scale;
    t->info.n_rows = rows / cfg->world + (rows % cfg->world != 0);
    t->info.row0 = (uint64_t)cfg->rank * t->info.n_rows;
    t->row_end = t->info.row0 + t->info.n_rows < rows ? t->info.row0 + t->info.n_rows : rows;
    for (int b = 0; b < 256; b++)
        t->lut[b] = tm_e4m3_to_f32((uint8_t)b);

    // The cache: as many slots as cache_bytes pays for (bookkeeping included), at most the rows
    // of the shard.
    t->slot_bytes = (size_t)dim + t->n_scale;
    uint64_t n_slots = cfg->cache_bytes / slot_cost(t->slot_bytes);
    uint64_t shard_rows = t->row_end > t->info.row0 ? t->row_end - t->info.row0 : 0;
    if (n_slots > shard_rows)
        n_slots = shard_rows ? shard_rows : 1;
    if (n_slots > (1u << 30))
        n_slots = 1u << 30;
    if (n_slots == 0) {
        rc = TM_ERR(err, TM_E_INVAL,
                    "engram table %s: cache of %llu bytes holds no row (one takes %zu bytes)",
                    cfg->weight_name, (unsigned long long)cfg->cache_bytes,
                    slot_cost(t->slot_bytes));
        goto fail;
    }
    t->info.n_slots = (uint32_t)n_slots;
    uint32_t cap = 1;
    while (cap < 2 * t->info.n_slots)
        cap <<= 1;
    t->index_mask = cap - 1;
    t->data = tm_malloc((size_t)n_slots * t->slot_bytes);
    t->slot_row = tm_calloc(n_slots, sizeof(*t->slot_row));
    t->state = tm_calloc(n_slots, 1);
    t->ref = tm_calloc(n_slots, 1);
    t->pin = tm_calloc(n_slots, sizeof(*t->pin));
    t->fail = tm_calloc(n_slots, sizeof(*t->fail));
    t->queue = tm_calloc(n_slots, sizeof(*t->queue));
    t->index = tm_malloc((size_t)cap * sizeof(*t->index));
    uint32_t n_threads = cfg->n_io_threads ? cfg->n_io_threads : TM_ENGRAM_DEFAULT_IO_THREADS;
    t->threads = tm_calloc(n_threads, sizeof(*t->threads));
    if (!t->data || !t->slot_row || !t->state || !t->ref || !t->pin || !t->fail || !t->queue ||
        !t->index || !t->threads) {
        rc = TM_ERR(err, TM_E_NOMEM, "engram table %s: cache of %llu rows", cfg->weight_name,
                    (unsigned long long)n_slots);
        goto fail;
    }
    memset(t->index, 0xff, (size_t)cap * sizeof(*t->index));
    t->info.cache_bytes = (uint64_t)n_slots * t->slot_bytes +
                          (uint64_t)n_slots * (8 + 1 + 1 + 2 + 4 + 4) + (uint64_t)cap * 4;
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        rc = TM_ERR(err, TM_E_INTERNAL, "engram table: mutex");
        goto fail;
    }
    if (pthread_cond_init(&t->cv_work, NULL) != 0) {
        pthread_mutex_destroy(&t->mu);
        rc = TM_ERR(err, TM_E_INTERNAL, "engram table: condition variable");
        goto fail;
    }
    if (pthread_cond_init(&t->cv_done, NULL) != 0) {
        pthread_cond_destroy(&t->cv_work);
        pthread_mutex_destroy(&t->mu);
        rc = TM_ERR(err, TM_E_INTERNAL, "engram table: condition variable");
        goto fail;
    }
    t->sync_ok = true;
    for (uint32_t i = 0; i < n_threads; i++) {
        int e = pthread_create(&t->threads[i], NULL, reader_main, t);
        if (e) {
            rc = TM_ERR(err, TM_E_INTERNAL, "engram table: start reader thread %u: %s", i,
                        strerror(e));
            goto fail;
        }
        t->n_threads++;
    }
    *out = t;
    return TM_OK;
fail:
    tm_engram_table_close(t);
    return rc;
}

void tm_engram_table_close(tm_engram_table *t) {
    if (!t)
        return;
    if (t->sync_ok) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_broadcast(&t->cv_work);
        pthread_mutex_unlock(&t->mu);
        for (uint32_t i = 0; i < t->n_threads; i++)
            pthread_join(t->threads[i], NULL);
        pthread_cond_destroy(&t->cv_done);
        pthread_cond_destroy(&t->cv_work);
        pthread_mutex_destroy(&t->mu);
    }
    part_fini(&t->w);
    part_fini(&t->s);
    tm_free(t->threads);
    tm_free(t->index);
    tm_free(t->queue);
    tm_free(t->fail);
    tm_free(t->pin);
    tm_free(t->ref);
    tm_free(t->state);
    tm_free(t->slot_row);
    tm_free(t->data);
    tm_free(t);
}

/* ---- operations ----------------------------------------------------------------------------- */

void tm_engram_table_prefetch(tm_engram_table *t, const uint64_t *rows, size_t n) {
    uint64_t queued = 0;
    pthread_mutex_lock(&t->mu);
    t->st.prefetch_rows += n;
    for (size_t i = 0; i < n; i++) {
        uint64_t row = rows[i];
        if (!in_shard(t, row) || cache_find(t, row) != NO_SLOT)
            continue;
        uint32_t s = slot_take(t, row);
        if (s == NO_SLOT) {
            t->st.prefetch_drops++;
            continue;
        }
        queue_push(t, s);
        queued++;
    }
    t->st.prefetch_reads += queued;
    if (queued)
        pthread_cond_broadcast(&t->cv_work);
    pthread_mutex_unlock(&t->mu);
}

tm_rc tm_engram_table_get(tm_engram_table *t, const uint64_t *rows, size_t n, float *out,
                          tm_err *err) {
    uint64_t t0 = tm_now_ns();
    const uint32_t dim = t->info.dim;
    uint32_t slot_of[GET_CHUNK];
    uint8_t direct[TM_ENGRAM_MAX_DIM + TM_ENGRAM_MAX_DIM / TM_ENGRAM_BLOCK];
    tm_rc rc = TM_OK;
    pthread_mutex_lock(&t->mu);
    t->st.rows_get += n;
    for (size_t c0 = 0; c0 < n && rc == TM_OK; c0 += GET_CHUNK) {
        size_t m = n - c0 < GET_CHUNK ? n - c0 : GET_CHUNK;
        // Pass 1: pin every row of the chunk; queue the misses.
        uint64_t queued = 0;
        for (size_t k = 0; k < m; k++) {
            uint64_t row = rows[c0 + k];
            slot_of[k] = NO_SLOT;
            if (!in_shard(t, row)) {
                t->st.rows_zero++;
                continue;
            }
            uint32_t s = cache_find(t, row);
            if (s != NO_SLOT) {
                if (t->state[s] == SLOT_LOADING)
                    t->st.waits++;
                else
                    t->st.hits++;
            } else {
                t->st.misses++;
                s = slot_take(t, row);
                if (s != NO_SLOT) {
                    queue_push_front(t, s);
                    queued++;
                }
            }
            if (s != NO_SLOT) {
                t->ref[s] = 1;
                t->pin[s]++;
            }
            slot_of[k] = s;
        }
        if (queued)
            pthread_cond_broadcast(&t->cv_work);
        // Pass 2: help read, wait, dequantize, unpin.
        for (size_t k = 0; k < m; k++) {
            uint64_t row = rows[c0 + k];
            float *o = out + (c0 + k) * dim;
            uint32_t s = slot_of[k];
            if (!in_shard(t, row)) {
                memset(o, 0, dim * sizeof(*o));
                continue;
            }
            if (s == NO_SLOT) { // no slot to spare: read it here, past the cache
                pthread_mutex_unlock(&t->mu);
                int32_t code = read_row(t, row, direct);
                if (code < 0)
                    dequant_row(t, direct, o);
                pthread_mutex_lock(&t->mu);
                t->st.reads++;
                if (code >= 0) {
                    if (rc == TM_OK)
                        rc = read_error(t, row, code, err);
                } else {
                    t->st.bytes_read += t->slot_bytes;
                }
                continue;
            }
            while (t->state[s] == SLOT_LOADING) {
                if (t->q_n > 0)
                    load_slot(t, queue_pop(t)); // help the readers
                else
                    pthread_cond_wait(&t->cv_done, &t->mu);
            }
            if (t->state[s] == SLOT_READY) {
                dequant_row(t, t->data + (size_t)s * t->slot_bytes, o);
            } else { // FAILED: report it; the slot is free again for a later try
                if (rc == TM_OK)
                    rc = read_error(t, row, t->fail[s], err);
                if (t->pin[s] == 1) {
                    index_remove(t, s);
                    t->state[s] = SLOT_EMPTY;
                }
            }
            t->pin[s]--;
        }
    }
    t->st.get_ns += tm_now_ns() - t0;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

tm_rc tm_engram_table_read_raw(tm_engram_table *t, uint64_t row, uint8_t *vals, uint8_t *scales,
                               tm_err *err) {
    if (row >= t->info.rows)
        return TM_ERR(err, TM_E_INVAL, "%s: tensor '%.100s': row %llu of %llu", t->w.path,
                      t->w.tensor, (unsigned long long)row, (unsigned long long)t->info.rows);
    int e = pread_full(t->w.fd, vals, t->info.dim, t->w.off + row * t->w.stride);
    if (e)
        return read_error(t, row, e < 0 ? 0 : e, err);
    e = pread_full(t->s.fd, scales, t->n_scale, t->s.off + row * t->s.stride);
    if (e)
        return read_error(t, row, 1000 + (e < 0 ? 0 : e), err);
    return TM_OK;
}

const tm_engram_table_info *tm_engram_table_info_get(const tm_engram_table *t) { return &t->info; }

void tm_engram_table_stats_get(tm_engram_table *t, tm_engram_table_stats *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    pthread_mutex_unlock(&t->mu);
}
