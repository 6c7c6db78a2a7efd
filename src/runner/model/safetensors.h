/* runner/model/safetensors.h - read-only reader (and a small writer) for the safetensors format: an
 * 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data section.
 *
 * The reader maps the file read-only and validates the whole header before it hands out a single
 * pointer: N <= file size - 8 and N <= TM_ST_MAX_HEADER_BYTES; the header is valid UTF-8, starts
 * with '{' and is a JSON object without duplicate keys; every entry other than "__metadata__" is
 * an object with exactly "dtype" (F32, F16, BF16, F8_E4M3, F8_E8M0, I8 or U8), "shape" (at most
 * TM_ST_MAX_DIM non-negative integers whose product times the element size fits in 64 bits) and
 * "data_offsets" ([begin, end], begin <= end, end - begin == product * element size). The tensors
 * must tile the data section exactly, as the reference implementation (safetensors' validate())
 * demands: no overlaps, no gaps, and no bytes after the last tensor. Every violation is TM_E_PARSE
 * with a message "<file>: <rule>", naming the tensor where there is one. File-sized allocations
 * happen only after the length checks (the header is parsed in place from the mapping).
 *
 * Files changed after open (issue 35): each mapping is guarded (base/mapguard.h), so a file
 * truncated by someone else while it is mapped does not kill the process with SIGBUS: the lost
 * pages read as zeros and tm_st_file_check / tm_st_set_check report it, naming the file. They
 * also stat the path and compare it with the file at open (device, inode, size, mtime, ctime):
 * a file replaced (renamed over, deleted) or written in place since is an error naming it. What
 * they cannot see: a change that keeps size, mtime and ctime (only root can set ctime back), and
 * a change to a file on a network file system whose attributes the client has cached.
 *
 * A tm_st_file and a tm_st_set are immutable after open; any number of threads may read them. */
#ifndef TM_RUNNER_MODEL_SAFETENSORS_H
#define TM_RUNNER_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "runner/model/tensor.h"

#define TM_ST_MAX_DIM 8
#define TM_ST_MAX_HEADER_BYTES (100u * 1000u * 1000u) /* 100 MB, as the reference reader */

typedef struct tm_st_tensor {
    const char *name; /* NUL-terminated; valid until the file is closed */
    const char *file; /* the file's base name, for messages; same lifetime */
    tm_dtype dtype;
    uint32_t n_dim; /* 0 (a scalar) .. TM_ST_MAX_DIM */
    uint64_t shape[TM_ST_MAX_DIM];
    uint64_t n_elem;  /* product of shape (1 for a scalar) */
    uint64_t n_bytes; /* n_elem * tm_dtype_size(dtype) */
    uint64_t offset;  /* from the start of the data section */
    const void *data; /* into the mapping; valid until closed. Aligned to the element
                       * size only if the writer padded the header (most do) */
} tm_st_tensor;

typedef struct tm_st_file tm_st_file; /* one mapped file */
typedef struct tm_st_set tm_st_set;   /* the weights of a model folder: one file or shards */

/* Map path read-only and validate it (rules above). On success *out owns the mapping; close it
 * with tm_st_file_close(). Errors: TM_E_IO (open, stat, mmap), TM_E_PARSE (any rule),
 * TM_E_NOMEM. */
tm_rc tm_st_file_open(const char *path, tm_st_file **out, tm_err *err);
/* Validate an in-memory image (the bytes of a whole file). bytes is borrowed and must outlive
 * the returned file; label names it in messages. For fuzzing and tests. Same errors as open. */
tm_rc tm_st_file_open_mem(const void *bytes, size_t n_bytes, const char *label, tm_st_file **out,
                          tm_err *err);
/* Validate a header read on its own (without the data section: the caller reads rows with pread,
 * runner/model/engram_table.c): head[0..n_head) holds the 8-byte length and at least the whole
 * header (bytes after it are ignored). Every rule above applies except the file size: the data
 * section is taken to end where the last tensor ends (tm_st_file_data_bytes), which the caller
 * compares with the real file. Tensors' data pointers are NULL. label (copied) names it in
 * messages. Same errors as open, less TM_E_IO. */
tm_rc tm_st_header_parse(const void *head, size_t n_head, const char *label, tm_st_file **out,
                         tm_err *err);
void tm_st_file_close(tm_st_file *f); /* NULL is a no-op */
/* File offset of the data section (8 + the header length), and its length in bytes. */
uint64_t tm_st_file_data_start(const tm_st_file *f);
uint64_t tm_st_file_data_bytes(const tm_st_file *f);
/* TM_E_IO naming the file when a read of its mapping faulted (it lost bytes since open), or when
 * its path is no longer the file opened (replaced, removed, or size, mtime or ctime changed);
 * TM_OK otherwise (and always for an in-memory image). One stat per call; thread-safe. */
tm_rc tm_st_file_check(const tm_st_file *f, tm_err *err);
/* Tensors are kept sorted by name; i < tm_st_file_n_tensor(f). Pointers valid until close. */
size_t tm_st_file_n_tensor(const tm_st_file *f);
const tm_st_tensor *tm_st_file_tensor(const tm_st_file *f, size_t i);
/* The tensor called name, or NULL. Binary search. */
const tm_st_tensor *tm_st_file_find(const tm_st_file *f, const char *name);

/* Open the weights of a Hugging Face model folder: dir/model.safetensors.index.json if it exists
 * (its "weight_map" names the shard of every tensor; shard names must be plain file names in
 * dir), otherwise dir/model.safetensors. Each shard is opened with tm_st_file_open. A tensor that
 * is listed in the index but missing from its shard, or present in two shards, is TM_E_PARSE. On
 * success *out owns all mappings. */
tm_rc tm_st_set_open(const char *dir, tm_st_set **out, tm_err *err);
void tm_st_set_close(tm_st_set *s); /* NULL is a no-op */
/* All tensors of all shards, sorted by name; pointers valid until close. */
size_t tm_st_set_n_tensor(const tm_st_set *s);
const tm_st_tensor *tm_st_set_tensor(const tm_st_set *s, size_t i);
const tm_st_tensor *tm_st_set_find(const tm_st_set *s, const char *name);
size_t tm_st_set_n_file(const tm_st_set *s); /* 1 for an unsharded model */
/* tm_st_file_check of every shard: the first error. */
tm_rc tm_st_set_check(const tm_st_set *s, tm_err *err);

/* A tensor to write: data (borrowed) holds the product of shape elements of dtype. */
typedef struct tm_st_wtensor {
    const char *name;
    tm_dtype dtype;
    uint32_t n_dim;
    uint64_t shape[TM_ST_MAX_DIM];
    const void *data;
} tm_st_wtensor;

/* Write a safetensors file the reference reader accepts: the header lists the tensors sorted by
 * name (and optional string->string metadata, may be NULL/0), is padded with spaces so that the
 * data section starts 8-byte aligned, and the data follow contiguously in header order. Written
 * to "<path>.tmp", fsynced, then renamed over path. Duplicate names are TM_E_INVAL. Errors:
 * TM_E_IO, TM_E_NOMEM, TM_E_INVAL. */
tm_rc tm_st_file_write(const char *path, const tm_st_wtensor *t, size_t n_tensor,
                       const char *const *meta_kv, size_t n_meta, tm_err *err);

#endif /* TM_RUNNER_MODEL_SAFETENSORS_H */
