/* runner/model/engram_table.h - DeepSeek-V4.1's Engram tables read from disk by rows. A table is
 * two safetensors tensors of a checkpoint: "<prefix>.weight", F8_E4M3 [rows][dim], and
 * "<prefix>.scale", F8_E8M0 (or U8) [rows][dim / 32], one ue8m0 scale per 32 values. The real
 * tables are ~90 GiB each and are never read whole: rows come from the file with pread on demand,
 * into a row cache of fixed size (cache_bytes, allocated at open; nothing is allocated per call).
 *
 * Value of row r, column c, as the reference's ParallelEngramEmbedding.forward: the fp32 product
 * e4m3(weight[r][c]) * 2^(scale[r][c / 32] - 127), rounded to bfloat16 (nearest even). A rank
 * serves the rows [row0, row0 + part) with part = ceil(rows / world) and row0 = rank * part (as
 * the reference's part_num_embeddings / vocab_start_idx); every other row id reads as zeros (the
 * reference masks them to 0 before its all_reduce), and so do shard rows past the end of the
 * table (the last rank's padding).
 *
 * Validation at open, each a TM_E_PARSE / TM_E_IO naming the file (and the tensor): the path is a
 * regular file (a FIFO or device is refused by name: opened O_NONBLOCK so a FIFO cannot block the
 * open, then checked with fstat); the safetensors header passes every rule of
 * runner/model/safetensors.h; the file is exactly as long as its header says (a shorter file is
 * refused at open with both sizes, never a SIGBUS or a short read later); the dtypes and shapes
 * above, dim a multiple of 32 and <= TM_ENGRAM_MAX_DIM, rows of both tensors equal.
 *
 * Why pread and not mmap: a row is 256 + 8 bytes at two random places in a ~90 GiB file, so a
 * mapping saves nothing but a copy of 264 bytes, and pread turns a file that shrinks after open
 * into a TM_E_IO on that call instead of a SIGBUS that would need a process-wide signal handler.
 * The page cache still serves repeated rows; POSIX_FADV_RANDOM turns its readahead off.
 *
 * Threading: every function but open and close may be called from any number of threads at once
 * (one mutex guards the cache; reads run outside it). n_io_threads worker threads, started at open
 * and joined at close, perform the reads that prefetch queues and those get needs. close must not
 * run concurrently with any other call on the same table.
 *
 * Not done here: the hashing that turns tokens into row ids (runner/model/engram_hash.h), the
 * all_reduce across ranks, O_DIRECT, io_uring. */
#ifndef TM_RUNNER_MODEL_ENGRAM_TABLE_H
#define TM_RUNNER_MODEL_ENGRAM_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

#define TM_ENGRAM_BLOCK 32     /* values per ue8m0 scale */
#define TM_ENGRAM_MAX_DIM 8192 /* values per row; the released tables have 256 */
#define TM_ENGRAM_DEFAULT_IO_THREADS 4
#define TM_ENGRAM_DEFAULT_CACHE_MB 1024 /* engine.engram_cache_mb's default (job schema) */

typedef struct tm_engram_table tm_engram_table; /* opaque */

typedef struct tm_engram_table_cfg {
    /* A model folder (the tensors' shards are found through model.safetensors.index.json, or
     * model.safetensors without one) or one .safetensors file. Borrowed for the open call. */
    const char *path;
    const char *weight_name; /* e.g. "layers.1.engram.embed.weight"; borrowed for the call */
    const char *scale_name;  /* e.g. "layers.1.engram.embed.scale"; borrowed for the call */
    uint32_t rank;           /* this rank's row shard, rank < world */
    uint32_t world;          /* >= 1 */
    uint64_t cache_bytes;    /* the row cache with its index, all of it, allocated at open;
                              * must hold at least 1 row (a row takes dim + dim / 32 bytes plus
                              * about 40 bytes of bookkeeping) */
    uint32_t n_io_threads;   /* reader threads; 0 means TM_ENGRAM_DEFAULT_IO_THREADS */
} tm_engram_table_cfg;

typedef struct tm_engram_table_info {
    uint64_t rows;        /* rows of the whole table (shape[0] of both tensors) */
    uint32_t dim;         /* values per row */
    uint64_t row0;        /* first row of this rank's shard */
    uint64_t n_rows;      /* rows of the shard: ceil(rows / world), padding included */
    uint32_t n_slots;     /* rows the cache holds */
    uint64_t cache_bytes; /* memory the cache took at open, <= cfg.cache_bytes */
} tm_engram_table_info;

typedef struct tm_engram_table_stats {
    uint64_t rows_get;       /* row ids passed to get, zeros included */
    uint64_t rows_zero;      /* of those, outside the shard or the table: zeros, no read */
    uint64_t hits;           /* of those, already in the cache (read earlier) */
    uint64_t waits;          /* of those, still being read (a prefetch in flight): get waited */
    uint64_t misses;         /* of those, not in the cache: get had the row read */
    uint64_t prefetch_rows;  /* row ids passed to prefetch */
    uint64_t prefetch_reads; /* of those, queued for reading (the rest were cached, in flight,
                              * outside the shard, or found no free slot) */
    uint64_t prefetch_drops; /* of those, dropped: every slot was pinned or being read */
    uint64_t evictions;      /* cached rows overwritten by another row */
    uint64_t reads;          /* rows read from the file (2 preads each: values and scales) */
    uint64_t bytes_read;     /* bytes those preads returned */
    uint64_t get_ns;         /* wall time spent inside get, summed over calls: rows/s of the
                              * gets = rows_get / (get_ns * 1e-9) */
} tm_engram_table_stats;

/* Open the table (cfg above), validate it (file comment), allocate the cache and start the reader
 * threads. On success *out owns the open files, the cache and the threads; free them with
 * tm_engram_table_close(). Errors: TM_E_INVAL (cfg: world 0, rank >= world, names NULL, a cache
 * too small for one row), TM_E_IO (open, a FIFO/device/directory instead of a file, read, a file
 * shorter or longer than its header), TM_E_PARSE (header, index, dtype or shape), TM_E_NOMEM. */
tm_rc tm_engram_table_open(const tm_engram_table_cfg *cfg, tm_engram_table **out, tm_err *err);
void tm_engram_table_close(tm_engram_table *t); /* NULL is a no-op; joins the reader threads */

/* Queue reads of the rows among rows[0..n) that are in the shard and neither cached nor being
 * read; returns at once (never waits for I/O; takes the cache mutex briefly). A hint: a row that
 * finds no evictable slot is dropped (stats.prefetch_drops), and a row read ahead may be evicted
 * again before get asks for it when more rows are prefetched than the cache holds. A failed
 * read is reported by the get that needs the row. Thread-safe. */
void tm_engram_table_prefetch(tm_engram_table *t, const uint64_t *rows, size_t n);

/* out[i * dim + c] = value (file comment) of row rows[i], column c, for i < n, as float32 holding
 * the bfloat16-rounded value (exact); zeros for rows outside the shard. Blocks only for rows not
 * yet read (reading the missing ones in parallel on the reader threads). Any n works, also more
 * rows than the cache holds. Errors: TM_E_IO naming the file, tensor, row and offset (a read
 * failed, or the file became shorter after open); out is then unspecified. Thread-safe. */
tm_rc tm_engram_table_get(tm_engram_table *t, const uint64_t *rows, size_t n, float *out,
                          tm_err *err);

/* The raw bytes of one row as stored: vals[0..dim) (e4m3) and scales[0..dim/32) (e8m0), read
 * straight from the file with pread, bypassing the cache (for tests and checks). A row outside
 * [0, rows) is TM_E_INVAL; TM_E_IO as get. Thread-safe. */
tm_rc tm_engram_table_read_raw(tm_engram_table *t, uint64_t row, uint8_t *vals, uint8_t *scales,
                               tm_err *err);

/* Shape, shard and cache size; valid for the table's lifetime. Thread-safe. */
const tm_engram_table_info *tm_engram_table_info_get(const tm_engram_table *t);
/* A consistent snapshot of the counters since open. Thread-safe. */
void tm_engram_table_stats_get(tm_engram_table *t, tm_engram_table_stats *out);

/* The open-time checks of one file that holds both tensors, on their own (for fuzzing and tests):
 * head[0..n_head) is the start of the file (the 8-byte length and at least the whole header; more
 * is ignored), file_bytes the file's size, label its name in messages. Fills info's rows and dim
 * (the shard and cache fields are left 0). Errors as open: TM_E_PARSE (header, dtype, shape),
 * TM_E_IO (file_bytes differs from what the header describes), TM_E_NOMEM. */
tm_rc tm_engram_file_check(const void *head, size_t n_head, uint64_t file_bytes, const char *label,
                           const char *weight_name, const char *scale_name,
                           tm_engram_table_info *info, tm_err *err);

/* The value definition on its own: out[c] for one stored row (vals[0..dim), scales[0..dim/32)),
 * as get computes it (the e4m3 value times 2^(e8m0 - 127) in fp32, rounded to bf16). Pure. */
void tm_engram_row_dequant(const uint8_t *vals, const uint8_t *scales, uint32_t dim, float *out);

#endif /* TM_RUNNER_MODEL_ENGRAM_TABLE_H */
