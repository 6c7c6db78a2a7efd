/* runner/model/safetensors.c - mapped, fully validated safetensors files and shard sets (see the
 * header for the rules), plus the writer used by tools/mkmodel and the tests. The header JSON is
 * parsed in place from the mapping with jansson; names are copied into one arena per file so the
 * JSON can be freed straight away. Nothing here touches the data section except through pointers
 * handed out to the caller. */
#include "runner/model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/fsutil.h"
#include "base/mapguard.h"
#include "base/utf8.h"

struct tm_st_file {
    char *label;              /* owned; base name used in messages */
    const unsigned char *map; /* the whole file; owned (munmap) iff mapped */
    size_t map_bytes;
    int mapped;
    uint64_t data_start; /* file offset of the data section: 8 + header length */
    uint64_t data_bytes; /* length of the data section */
    int guard;           /* base/mapguard.h slot of the mapping; -1: none */
    char *path;          /* owned; the path it was opened by (NULL: in memory) */
    struct stat id;  /* the file at open: dev, ino, size, mtime and ctime are compared by check */
    tm_st_tensor *t; /* owned; n_tensor entries sorted by name */
    size_t n_tensor;
    char *names; /* owned arena holding every t[i].name */
};

struct tm_st_set {
    tm_st_file **files; /* owned; n_file entries */
    size_t n_file;
    const tm_st_tensor **by_name; /* owned array of pointers into files[*]; sorted by name */
    size_t n_tensor;
};

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static uint64_t load_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Turn a failed jansson decode into a tm_rc: allocation failures are NOMEM, the rest PARSE. */
static tm_rc json_fail(tm_err *err, const char *label, const char *what, const json_error_t *je) {
    if (json_error_code(je) == json_error_out_of_memory)
        return TM_ERR(err, TM_E_NOMEM, "%s: %s: out of memory", label, what);
    return TM_ERR(err, TM_E_PARSE, "%s: %s is not valid JSON: %s (line %d, column %d)", label, what,
                  je->text, je->line, je->column);
}

/* ---- dtype names ---------------------------------------------------------------------------- */

static int dtype_from_name(const char *s, tm_dtype *dt) {
    if (!strcmp(s, "F32"))
        *dt = TM_DTYPE_F32;
    else if (!strcmp(s, "F16"))
        *dt = TM_DTYPE_F16;
    else if (!strcmp(s, "BF16"))
        *dt = TM_DTYPE_BF16;
    else if (!strcmp(s, "F8_E4M3"))
        *dt = TM_DTYPE_F8_E4M3;
    else if (!strcmp(s, "F8_E8M0"))
        *dt = TM_DTYPE_F8_E8M0;
    else if (!strcmp(s, "I8"))
        *dt = TM_DTYPE_I8;
    else if (!strcmp(s, "U8"))
        *dt = TM_DTYPE_U8;
    else
        return 0;
    return 1;
}

/* Dtypes of the format that we recognise but do not load. */
static int dtype_known_other(const char *s) {
    static const char *const names[] = {"F64",     "I64", "U64",  "I32",         "U32",
                                        "I16",     "U16", "BOOL", "F8_E5M2",     "F6_E2M3",
                                        "F6_E3M2", "F4",  "C64",  "F8_E4M3FNUZ", "F8_E5M2FNUZ"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(s, names[i]))
            return 1;
    return 0;
}

static const char *st_dtype_name(tm_dtype dt) {
    switch (dt) {
    case TM_DTYPE_F32:
        return "F32";
    case TM_DTYPE_F16:
        return "F16";
    case TM_DTYPE_BF16:
        return "BF16";
    case TM_DTYPE_F8_E4M3:
        return "F8_E4M3";
    case TM_DTYPE_F8_E8M0:
        return "F8_E8M0";
    case TM_DTYPE_I8:
        return "I8";
    case TM_DTYPE_U8:
        return "U8";
    case TM_DTYPE_F4_E2M1:
        break; // not a header dtype: written as I8 [.., n/2] by the caller
    }
    return "?";
}

/* ---- header validation ---------------------------------------------------------------------- */

/* Validate one tensor entry and fill *t (except name/file/data). */
static tm_rc parse_entry(const char *label, const char *name, json_t *v, uint64_t data_bytes,
                         tm_st_tensor *t, tm_err *err) {
    if (!json_is_object(v))
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': entry is not a JSON object", label,
                      name);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': unknown field '%.40s'", label,
                          name, key);
    }
    json_t *jdt = json_object_get(v, "dtype");
    json_t *jshape = json_object_get(v, "shape");
    json_t *joff = json_object_get(v, "data_offsets");
    if (!json_is_string(jdt))
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': dtype is %s, want a string", label,
                      name, jdt ? "not a string" : "missing");
    const char *dts = json_string_value(jdt);
    if (!dtype_from_name(dts, &t->dtype)) {
        if (dtype_known_other(dts))
            return TM_ERR(err, TM_E_PARSE,
                          "%s: tensor '%.100s': dtype %s is not supported (F32, F16, BF16, "
                          "F8_E4M3, F8_E8M0, I8, U8 are)",
                          label, name, dts);
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': unknown dtype '%.40s'", label, name,
                      dts);
    }
    if (!json_is_array(jshape))
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': shape is %s, want an array", label,
                      name, jshape ? "not an array" : "missing");
    size_t n_dim = json_array_size(jshape);
    if (n_dim > TM_ST_MAX_DIM)
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': shape has %zu dimensions (max %d)",
                      label, name, n_dim, TM_ST_MAX_DIM);
    t->n_dim = (uint32_t)n_dim;
    uint64_t n_elem = 1;
    int overflow = 0;
    for (size_t d = 0; d < n_dim; d++) {
        json_t *jd = json_array_get(jshape, d);
        if (!json_is_integer(jd) || json_integer_value(jd) < 0)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: tensor '%.100s': shape[%zu] is not a non-negative integer", label,
                          name, d);
        t->shape[d] = (uint64_t)json_integer_value(jd);
        if (__builtin_mul_overflow(n_elem, t->shape[d], &n_elem))
            overflow = 1;
    }
    uint64_t n_bytes = 0;
    if (overflow || __builtin_mul_overflow(n_elem, (uint64_t)tm_dtype_size(t->dtype), &n_bytes))
        return TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': shape x dtype size overflows 64 bits",
                      label, name);
    t->n_elem = n_elem;
    t->n_bytes = n_bytes;
    if (!json_is_array(joff) || json_array_size(joff) != 2)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: tensor '%.100s': data_offsets is not an array of two integers", label,
                      name);
    json_t *jb = json_array_get(joff, 0), *je = json_array_get(joff, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < 0)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: tensor '%.100s': data_offsets are not non-negative integers", label,
                      name);
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (begin > end)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: tensor '%.100s': data_offsets begin %llu is after end %llu", label, name,
                      (unsigned long long)begin, (unsigned long long)end);
    if (end > data_bytes)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: tensor '%.100s': data_offsets end %llu past the data section (%llu "
                      "bytes)",
                      label, name, (unsigned long long)end, (unsigned long long)data_bytes);
    if (end - begin != n_bytes)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: tensor '%.100s': data_offsets span %llu bytes but shape x dtype needs "
                      "%llu",
                      label, name, (unsigned long long)(end - begin), (unsigned long long)n_bytes);
    t->offset = begin;
    return TM_OK;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const tm_st_tensor *)a)->name, ((const tm_st_tensor *)b)->name);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const tm_st_tensor *x = *(const tm_st_tensor *const *)a, *y = *(const tm_st_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    uint64_t xe = x->offset + x->n_bytes, ye = y->offset + y->n_bytes;
    if (xe != ye)
        return xe < ye ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The tensors must tile [0, data_bytes) exactly. */
static tm_rc check_tiling(tm_st_file *f, uint64_t data_bytes, tm_err *err) {
    if (f->n_tensor == 0) {
        if (data_bytes != 0)
            return TM_ERR(err, TM_E_PARSE, "%s: no tensors but a data section of %llu bytes",
                          f->label, (unsigned long long)data_bytes);
        return TM_OK;
    }
    const tm_st_tensor **order = tm_calloc(f->n_tensor, sizeof(*order));
    if (!order)
        return TM_ERR(err, TM_E_NOMEM, "%s: %zu tensors", f->label, f->n_tensor);
    for (size_t i = 0; i < f->n_tensor; i++)
        order[i] = &f->t[i];
    qsort(order, f->n_tensor, sizeof(*order), cmp_tensor_offset);
    uint64_t pos = 0;
    const tm_st_tensor *prev = NULL;
    tm_rc rc = TM_OK;
    for (size_t i = 0; i < f->n_tensor && rc == TM_OK; i++) {
        const tm_st_tensor *t = order[i];
        if (t->offset < pos)
            rc = TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s': data overlaps tensor '%.100s'",
                        f->label, t->name, prev->name);
        else if (t->offset > pos)
            rc = TM_ERR(err, TM_E_PARSE,
                        "%s: tensor '%.100s': gap of %llu bytes before its data (tensors must be "
                        "contiguous)",
                        f->label, t->name, (unsigned long long)(t->offset - pos));
        pos = t->offset + t->n_bytes;
        prev = t;
    }
    if (rc == TM_OK && pos != data_bytes)
        rc = TM_ERR(err, TM_E_PARSE,
                    "%s: %llu trailing bytes after the last tensor's data (data section %llu "
                    "bytes)",
                    f->label, (unsigned long long)(data_bytes - pos),
                    (unsigned long long)data_bytes);
    tm_free(order);
    return rc;
}

static tm_rc check_metadata(const char *label, json_t *meta, tm_err *err) {
    if (!json_is_object(meta))
        return TM_ERR(err, TM_E_PARSE, "%s: __metadata__ is not a JSON object", label);
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (!json_is_string(val))
            return TM_ERR(err, TM_E_PARSE, "%s: __metadata__ '%.60s' is not a string", label, key);
    }
    return TM_OK;
}

/* Validate the header hdr[0..n_hdr) and fill f->t. data points at the data section (NULL: the
 * tensors' data stay NULL); data_bytes is its length, or UINT64_MAX when it is not known (a header
 * read on its own): then the section is taken to end where the last tensor ends. */
static tm_rc parse_header(tm_st_file *f, const char *hdr, uint64_t n_hdr, uint64_t data_bytes,
                          const unsigned char *data, tm_err *err) {
    const char *label = f->label;
    if (n_hdr == 0 || hdr[0] != '{')
        return TM_ERR(err, TM_E_PARSE, "%s: header does not start with '{'", label);
    size_t n_valid = tm_utf8_valid_prefix(hdr, (size_t)n_hdr);
    if (n_valid != n_hdr)
        return TM_ERR(err, TM_E_PARSE, "%s: header is not valid UTF-8 (byte %zu)", label, n_valid);
    if (memchr(hdr, '\0', (size_t)n_hdr))
        return TM_ERR(err, TM_E_PARSE, "%s: header contains a NUL byte", label);

    json_error_t je;
    json_t *root = json_loadb(hdr, (size_t)n_hdr, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return json_fail(err, label, "header", &je);
    tm_rc rc = TM_OK;
    if (!json_is_object(root)) {
        rc = TM_ERR(err, TM_E_PARSE, "%s: header is not a JSON object", label);
        goto out;
    }
    // Count the tensors and the bytes their names need, then fill the arrays.
    size_t n = 0, name_bytes = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            rc = check_metadata(label, val, err);
            if (rc)
                goto out;
            continue;
        }
        n++;
        name_bytes += strlen(key) + 1;
    }
    f->t = tm_calloc(n, sizeof(*f->t));
    f->names = tm_malloc(name_bytes);
    if (!f->t || !f->names) {
        rc = TM_ERR(err, TM_E_NOMEM, "%s: %zu tensors", label, n);
        goto out;
    }
    size_t i = 0, at = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__"))
            continue;
        tm_st_tensor *t = &f->t[i];
        rc = parse_entry(label, key, val, data_bytes, t, err);
        if (rc)
            goto out;
        size_t len = strlen(key);
        memcpy(f->names + at, key, len + 1);
        t->name = f->names + at;
        t->file = f->label;
        t->data = data ? data + t->offset : NULL;
        at += len + 1;
        i++;
    }
    f->n_tensor = n;
    qsort(f->t, n, sizeof(*f->t), cmp_tensor_name);
    if (data_bytes == UINT64_MAX) { // header alone: the section ends with the last tensor
        data_bytes = 0;
        for (size_t k = 0; k < n; k++)
            if (f->t[k].offset + f->t[k].n_bytes > data_bytes)
                data_bytes = f->t[k].offset + f->t[k].n_bytes;
    }
    f->data_start = 8 + n_hdr;
    f->data_bytes = data_bytes;
    rc = check_tiling(f, data_bytes, err);
out:
    json_decref(root);
    return rc;
}

/* Validate f->map[0..map_bytes) and fill f->t. */
static tm_rc parse_image(tm_st_file *f, tm_err *err) {
    const char *label = f->label;
    size_t size = f->map_bytes;
    if (size < 8)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: file is %zu bytes, too short for the 8-byte header length", label, size);
    uint64_t n_hdr = load_le64(f->map);
    if (n_hdr > TM_ST_MAX_HEADER_BYTES)
        return TM_ERR(err, TM_E_PARSE, "%s: header length %llu exceeds the %u-byte limit", label,
                      (unsigned long long)n_hdr, TM_ST_MAX_HEADER_BYTES);
    if (n_hdr > size - 8)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: header length %llu runs past the end of the file (%zu bytes follow "
                      "the length)",
                      label, (unsigned long long)n_hdr, size - 8);
    return parse_header(f, (const char *)f->map + 8, n_hdr, (uint64_t)(size - 8 - n_hdr),
                        f->map + 8 + n_hdr, err);
}

/* ---- files ---------------------------------------------------------------------------------- */

static tm_rc file_new(const char *label, tm_st_file **out, tm_err *err) {
    tm_st_file *f = tm_calloc(1, sizeof(*f));
    if (!f)
        return TM_ERR(err, TM_E_NOMEM, "%s: file header", label);
    f->guard = -1;
    f->label = tm_strdup(label);
    if (!f->label) {
        tm_free(f);
        return TM_ERR(err, TM_E_NOMEM, "%s: file name", label);
    }
    *out = f;
    return TM_OK;
}

tm_rc tm_st_file_open_mem(const void *bytes, size_t n_bytes, const char *label, tm_st_file **out,
                          tm_err *err) {
    tm_st_file *f = NULL;
    tm_rc rc = file_new(label, &f, err);
    if (rc)
        return rc;
    f->map = bytes;
    f->map_bytes = n_bytes;
    rc = parse_image(f, err);
    if (rc)
        goto fail;
    *out = f;
    return TM_OK;
fail:
    tm_st_file_close(f);
    return rc;
}

tm_rc tm_st_file_open(const char *path, tm_st_file **out, tm_err *err) {
    tm_st_file *f = NULL;
    tm_rc rc = file_new(base_name(path), &f, err);
    if (rc)
        return rc;
    f->path = tm_strdup(path);
    if (!f->path) {
        rc = TM_ERR(err, TM_E_NOMEM, "%s", path);
        goto fail;
    }
    // never blocks on a FIFO under the name; anything but a regular file is refused (issue 35)
    int fd = -1;
    struct stat st;
    rc = tm_fs_open_in(path, "model weights", &fd, &st, err);
    if (rc)
        goto fail;
    f->id = st;
    f->map_bytes = (size_t)st.st_size;
    if (f->map_bytes >= 8) {
        void *p = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            rc = TM_ERR(err, TM_E_IO, "%s: mmap %zu bytes: %s", path, f->map_bytes,
                        strerror(errno));
            close(fd);
            goto fail;
        }
        f->map = p;
        f->mapped = 1;
        rc = tm_mapguard_add(p, f->map_bytes, &f->guard, err);
        if (rc) {
            close(fd);
            goto fail;
        }
    }
    close(fd); // the mapping keeps the file alive
    rc = parse_image(f, err);
    if (rc == TM_OK)
        rc = tm_st_file_check(f, err); // the header was read from the mapping
    if (rc)
        goto fail;
    *out = f;
    return TM_OK;
fail:
    tm_st_file_close(f);
    return rc;
}

tm_rc tm_st_header_parse(const void *head, size_t n_head, const char *label, tm_st_file **out,
                         tm_err *err) {
    if (n_head < 8)
        return TM_ERR(err, TM_E_PARSE, "%s: %zu bytes, too short for the 8-byte header length",
                      label, n_head);
    uint64_t n_hdr = load_le64(head);
    if (n_hdr > TM_ST_MAX_HEADER_BYTES)
        return TM_ERR(err, TM_E_PARSE, "%s: header length %llu exceeds the %u-byte limit", label,
                      (unsigned long long)n_hdr, TM_ST_MAX_HEADER_BYTES);
    if (n_hdr > n_head - 8)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: header length %llu runs past the %zu bytes given after the length",
                      label, (unsigned long long)n_hdr, n_head - 8);
    tm_st_file *f = NULL;
    tm_rc rc = file_new(label, &f, err);
    if (rc)
        return rc;
    rc = parse_header(f, (const char *)head + 8, n_hdr, UINT64_MAX, NULL, err);
    if (rc)
        goto fail;
    *out = f;
    return TM_OK;
fail:
    tm_st_file_close(f);
    return rc;
}

uint64_t tm_st_file_data_start(const tm_st_file *f) { return f->data_start; }

uint64_t tm_st_file_data_bytes(const tm_st_file *f) { return f->data_bytes; }

void tm_st_file_close(tm_st_file *f) {
    if (!f)
        return;
    tm_mapguard_remove(f->guard);
    if (f->mapped)
        munmap((void *)f->map, f->map_bytes);
    tm_free(f->path);
    tm_free(f->t);
    tm_free(f->names);
    tm_free(f->label);
    tm_free(f);
}

static long long ns_of(struct timespec t) { return (long long)t.tv_sec * 1000000000LL + t.tv_nsec; }

tm_rc tm_st_file_check(const tm_st_file *f, tm_err *err) {
    if (!f->path)
        return TM_OK;
    size_t off = 0;
    if (tm_mapguard_fault(f->guard, &off))
        return TM_ERR(err, TM_E_IO,
                      "%s: the file lost bytes it had at load (a read at byte %zu of %zu failed: "
                      "truncated or unreadable while the job ran); the weights read from it are "
                      "not the model's",
                      f->path, off, f->map_bytes);
    struct stat st;
    if (stat(f->path, &st) != 0)
        return TM_ERR(err, TM_E_IO, "%s: removed or renamed while the job ran (stat: %s)", f->path,
                      strerror(errno));
    if (st.st_dev != f->id.st_dev || st.st_ino != f->id.st_ino)
        return TM_ERR(err, TM_E_IO,
                      "%s: replaced by another file while the job ran (inode %llu, now %llu)",
                      f->path, (unsigned long long)f->id.st_ino, (unsigned long long)st.st_ino);
    if (st.st_size != f->id.st_size)
        return TM_ERR(err, TM_E_IO, "%s: changed while the job ran (size %lld, now %lld bytes)",
                      f->path, (long long)f->id.st_size, (long long)st.st_size);
    if (ns_of(st.st_mtim) != ns_of(f->id.st_mtim) || ns_of(st.st_ctim) != ns_of(f->id.st_ctim))
        return TM_ERR(err, TM_E_IO,
                      "%s: changed while the job ran (modified or its status changed after load: "
                      "mtime or ctime moved); the weights read from it may not be the model's",
                      f->path);
    return TM_OK;
}

tm_rc tm_st_set_check(const tm_st_set *s, tm_err *err) {
    for (size_t i = 0; i < s->n_file; i++) {
        tm_rc rc = tm_st_file_check(s->files[i], err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

size_t tm_st_file_n_tensor(const tm_st_file *f) { return f->n_tensor; }

const tm_st_tensor *tm_st_file_tensor(const tm_st_file *f, size_t i) {
    TM_ASSERT(i < f->n_tensor);
    return &f->t[i];
}

const tm_st_tensor *tm_st_file_find(const tm_st_file *f, const char *name) {
    size_t lo = 0, hi = f->n_tensor;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->t[mid].name);
        if (c == 0)
            return &f->t[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---- shard sets ----------------------------------------------------------------------------- */

static int cmp_tensor_ptr_name(const void *a, const void *b) {
    const tm_st_tensor *x = *(const tm_st_tensor *const *)a, *y = *(const tm_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name from the index must be a plain file name inside the model folder. */
static int plain_file_name(const char *s) {
    if (!s[0] || !strcmp(s, ".") || !strcmp(s, ".."))
        return 0;
    return strchr(s, '/') == NULL && strchr(s, '\\') == NULL;
}

static tm_rc join_path(const char *dir, const char *name, char **out, tm_err *err) {
    *out = tm_fs_path_join(dir, name); // base/fsutil.h
    return *out ? TM_OK : TM_ERR(err, TM_E_NOMEM, "path %s/%s", dir, name);
}

static tm_rc set_add_file(tm_st_set *s, const char *dir, const char *name, tm_err *err) {
    char *path = NULL;
    tm_rc rc = join_path(dir, name, &path, err);
    if (rc)
        return rc;
    rc = tm_st_file_open(path, &s->files[s->n_file], err);
    tm_free(path);
    if (rc)
        return rc;
    s->n_file++;
    return TM_OK;
}

/* Gather every tensor of every file, sorted by name; a name in two shards is an error. */
static tm_rc set_index_tensors(tm_st_set *s, tm_err *err) {
    size_t n = 0;
    for (size_t i = 0; i < s->n_file; i++)
        n += s->files[i]->n_tensor;
    s->by_name = tm_calloc(n, sizeof(*s->by_name));
    if (!s->by_name)
        return TM_ERR(err, TM_E_NOMEM, "%zu tensors", n);
    size_t k = 0;
    for (size_t i = 0; i < s->n_file; i++)
        for (size_t j = 0; j < s->files[i]->n_tensor; j++)
            s->by_name[k++] = &s->files[i]->t[j];
    s->n_tensor = n;
    qsort(s->by_name, n, sizeof(*s->by_name), cmp_tensor_ptr_name);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(s->by_name[i - 1]->name, s->by_name[i]->name))
            return TM_ERR(err, TM_E_PARSE, "tensor '%.100s' is in two shards: %s and %s",
                          s->by_name[i]->name, s->by_name[i - 1]->file, s->by_name[i]->file);
    return TM_OK;
}

static tm_rc set_open_index(tm_st_set *s, const char *dir, const char *index_path, tm_err *err) {
    const char *label = base_name(index_path);
    int fd = -1; // never blocks on a FIFO; only a regular file is read (issue 35)
    tm_rc orc = tm_fs_open_in(index_path, "model weights index", &fd, NULL, err);
    if (orc)
        return orc;
    json_error_t je;
    json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    close(fd);
    if (!root) {
        if (json_error_code(&je) == json_error_cannot_open_file)
            return TM_ERR(err, TM_E_IO, "%s: %s", index_path, je.text);
        return json_fail(err, label, "index", &je);
    }
    tm_rc rc = TM_OK;
    const char **names = NULL;
    json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map) || json_object_size(map) == 0) {
        rc = TM_ERR(err, TM_E_PARSE, "%s: no weight_map object (or it is empty)", label);
        goto out;
    }
    size_t n_map = json_object_size(map);
    names = tm_calloc(n_map, sizeof(*names));
    if (!names) {
        rc = TM_ERR(err, TM_E_NOMEM, "%s: %zu entries", label, n_map);
        goto out;
    }
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        if (!json_is_string(val)) {
            rc = TM_ERR(err, TM_E_PARSE, "%s: weight_map['%.100s'] is not a string", label, key);
            goto out;
        }
        if (!plain_file_name(json_string_value(val))) {
            rc = TM_ERR(err, TM_E_PARSE,
                        "%s: weight_map['%.100s'] = '%.100s' is not a plain file name", label, key,
                        json_string_value(val));
            goto out;
        }
        names[n++] = json_string_value(val);
    }
    qsort(names, n, sizeof(*names), cmp_str_ptr);
    size_t n_uniq = 0;
    for (size_t i = 0; i < n; i++)
        if (n_uniq == 0 || strcmp(names[n_uniq - 1], names[i]))
            names[n_uniq++] = names[i];
    s->files = tm_calloc(n_uniq, sizeof(*s->files));
    if (!s->files) {
        rc = TM_ERR(err, TM_E_NOMEM, "%s: %zu shards", label, n_uniq);
        goto out;
    }
    for (size_t i = 0; i < n_uniq; i++) {
        rc = set_add_file(s, dir, names[i], err);
        if (rc)
            goto out;
    }
    rc = set_index_tensors(s, err);
    if (rc)
        goto out;
    json_object_foreach(map, key, val) {
        const tm_st_tensor *t = tm_st_set_find(s, key);
        const char *want = json_string_value(val);
        if (!t) {
            rc = TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s' is listed in %s but not there", label,
                        key, want);
            goto out;
        }
        if (strcmp(t->file, want)) {
            rc = TM_ERR(err, TM_E_PARSE, "%s: tensor '%.100s' is listed in %s but is in %s", label,
                        key, want, t->file);
            goto out;
        }
    }
out:
    tm_free(names);
    json_decref(root);
    return rc;
}

tm_rc tm_st_set_open(const char *dir, tm_st_set **out, tm_err *err) {
    char *index_path = NULL;
    tm_st_set *s = tm_calloc(1, sizeof(*s));
    if (!s)
        return TM_ERR(err, TM_E_NOMEM, "safetensors set");
    tm_rc rc = join_path(dir, "model.safetensors.index.json", &index_path, err);
    if (rc)
        goto fail;
    struct stat st;
    if (stat(index_path, &st) == 0) {
        rc = set_open_index(s, dir, index_path, err);
        if (rc)
            goto fail;
    } else {
        if (errno != ENOENT) {
            rc = TM_ERR(err, TM_E_IO, "%s: %s", index_path, strerror(errno));
            goto fail;
        }
        s->files = tm_calloc(1, sizeof(*s->files));
        if (!s->files) {
            rc = TM_ERR(err, TM_E_NOMEM, "safetensors set");
            goto fail;
        }
        rc = set_add_file(s, dir, "model.safetensors", err);
        if (rc)
            goto fail;
        rc = set_index_tensors(s, err);
        if (rc)
            goto fail;
    }
    tm_free(index_path);
    *out = s;
    return TM_OK;
fail:
    tm_free(index_path);
    tm_st_set_close(s);
    return rc;
}

void tm_st_set_close(tm_st_set *s) {
    if (!s)
        return;
    for (size_t i = 0; i < s->n_file; i++)
        tm_st_file_close(s->files[i]);
    tm_free(s->files);
    tm_free(s->by_name);
    tm_free(s);
}

size_t tm_st_set_n_tensor(const tm_st_set *s) { return s->n_tensor; }
size_t tm_st_set_n_file(const tm_st_set *s) { return s->n_file; }

const tm_st_tensor *tm_st_set_tensor(const tm_st_set *s, size_t i) {
    TM_ASSERT(i < s->n_tensor);
    return s->by_name[i];
}

const tm_st_tensor *tm_st_set_find(const tm_st_set *s, const char *name) {
    size_t lo = 0, hi = s->n_tensor;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, s->by_name[mid]->name);
        if (c == 0)
            return s->by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---- writer --------------------------------------------------------------------------------- */

static int cmp_wtensor_ptr(const void *a, const void *b) {
    const tm_st_wtensor *x = *(const tm_st_wtensor *const *)a;
    const tm_st_wtensor *y = *(const tm_st_wtensor *const *)b;
    return strcmp(x->name, y->name);
}

static uint64_t wtensor_bytes(const tm_st_wtensor *t) {
    uint64_t n = tm_dtype_size(t->dtype);
    for (uint32_t d = 0; d < t->n_dim; d++)
        n *= t->shape[d];
    return n;
}

static tm_rc write_all(int fd, const void *p, size_t n, const char *path, tm_err *err) {
    const char *c = p;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t w = write(fd, c, chunk);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return TM_ERR(err, TM_E_IO, "%s: write: %s", path, strerror(errno));
        }
        c += w;
        n -= (size_t)w;
    }
    return TM_OK;
}

tm_rc tm_st_file_write(const char *path, const tm_st_wtensor *t, size_t n_tensor,
                       const char *const *meta_kv, size_t n_meta, tm_err *err) {
    tm_buf hdr = {0};
    char *tmp = NULL;
    int fd = -1;
    tm_rc rc = TM_OK;
    const tm_st_wtensor **order = tm_calloc(n_tensor, sizeof(*order));
    if (!order)
        return TM_ERR(err, TM_E_NOMEM, "%s: %zu tensors", path, n_tensor);
    for (size_t i = 0; i < n_tensor; i++) {
        TM_ASSERT(t[i].n_dim <= TM_ST_MAX_DIM);
        TM_ASSERT(t[i].dtype != TM_DTYPE_F4_E2M1); // packed FP4 is written as I8 [.., n/2]
        order[i] = &t[i];
    }
    qsort(order, n_tensor, sizeof(*order), cmp_wtensor_ptr);
    for (size_t i = 1; i < n_tensor; i++)
        if (!strcmp(order[i - 1]->name, order[i]->name)) {
            rc = TM_ERR(err, TM_E_INVAL, "%s: duplicate tensor name '%.100s'", path,
                        order[i]->name);
            goto out;
        }
    rc = tm_buf_append_str(&hdr, "{", err);
    if (rc == TM_OK && n_meta > 0) {
        rc = tm_buf_append_str(&hdr, "\"__metadata__\":{", err);
        for (size_t i = 0; i < n_meta && rc == TM_OK; i++) {
            if (i > 0)
                rc = tm_buf_append_str(&hdr, ",", err);
            if (rc == TM_OK)
                rc = tm_buf_append_json_str(&hdr, meta_kv[2 * i], strlen(meta_kv[2 * i]), err);
            if (rc == TM_OK)
                rc = tm_buf_append_str(&hdr, ":", err);
            if (rc == TM_OK)
                rc = tm_buf_append_json_str(&hdr, meta_kv[2 * i + 1], strlen(meta_kv[2 * i + 1]),
                                            err);
        }
        if (rc == TM_OK)
            rc = tm_buf_append_str(&hdr, "}", err);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n_tensor && rc == TM_OK; i++) {
        const tm_st_wtensor *w = order[i];
        if (i > 0 || n_meta > 0)
            rc = tm_buf_append_str(&hdr, ",", err);
        if (rc == TM_OK)
            rc = tm_buf_append_json_str(&hdr, w->name, strlen(w->name), err);
        if (rc == TM_OK)
            rc = tm_buf_printf(&hdr, err, ":{\"dtype\":\"%s\",\"shape\":[",
                               st_dtype_name(w->dtype));
        for (uint32_t d = 0; d < w->n_dim && rc == TM_OK; d++)
            rc = tm_buf_printf(&hdr, err, "%s%llu", d ? "," : "", (unsigned long long)w->shape[d]);
        uint64_t nb = wtensor_bytes(w);
        if (rc == TM_OK)
            rc = tm_buf_printf(&hdr, err, "],\"data_offsets\":[%llu,%llu]}",
                               (unsigned long long)off, (unsigned long long)(off + nb));
        off += nb;
    }
    if (rc == TM_OK)
        rc = tm_buf_append_str(&hdr, "}", err);
    // Pad with spaces so that the data section (8 + header bytes) starts 8-byte aligned.
    while (rc == TM_OK && (hdr.len % 8) != 0)
        rc = tm_buf_append_str(&hdr, " ", err);
    if (rc)
        goto out;
    size_t np = strlen(path);
    tmp = tm_malloc(np + 5);
    if (!tmp) {
        rc = TM_ERR(err, TM_E_NOMEM, "%s: temp name", path);
        goto out;
    }
    memcpy(tmp, path, np);
    memcpy(tmp + np, ".tmp", 5);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = TM_ERR(err, TM_E_IO, "%s: open: %s", tmp, strerror(errno));
        goto out;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
    rc = write_all(fd, len8, 8, tmp, err);
    if (rc == TM_OK)
        rc = write_all(fd, hdr.data, hdr.len, tmp, err);
    for (size_t i = 0; i < n_tensor && rc == TM_OK; i++)
        rc = write_all(fd, order[i]->data, (size_t)wtensor_bytes(order[i]), tmp, err);
    if (rc)
        goto out;
    if (fsync(fd) != 0) {
        rc = TM_ERR(err, TM_E_IO, "%s: fsync: %s", tmp, strerror(errno));
        goto out;
    }
    int fd_closed = close(fd);
    fd = -1;
    if (fd_closed != 0) {
        rc = TM_ERR(err, TM_E_IO, "%s: close: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rc = TM_ERR(err, TM_E_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
        goto out;
    }
out:
    if (fd >= 0)
        close(fd);
    if (rc && tmp)
        unlink(tmp);
    tm_free(tmp);
    tm_buf_fini(&hdr);
    tm_free(order);
    return rc;
}
