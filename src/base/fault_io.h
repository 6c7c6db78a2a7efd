/* base/fault_io.h - crash and I/O-error injection for the durability tests, selected by
 * environment variables that are read once (first call); without them every hook is a cheap
 * no-op. The output path (sink/sink.c, sink/manifest.c, metrics, through base/fsutil.h for the
 * manifest's and metrics.json's file steps) calls them right before the real system call or at a
 * named moment of the commit protocol.
 *
 *   TM_FAULT_POINT=NAME[:N]   the N-th call (default 1) of tm_fault_point(NAME) ends the process
 *                             at once with _exit(TM_FAULT_EXIT_CODE), like kill -9 there: no
 *                             buffers are flushed, no atexit handlers run.
 *   TM_FAULT_IO=OP:N[+][:ERR] the N-th call of tm_fault_io(OP) (and, with '+', every later one)
 *                             reports the error ERR (ENOSPC, the default, or EIO) instead of doing
 *                             the operation. OP: write, fsync, rename, truncate, any (every kind,
 *                             counted together).
 *
 * Named points in the commit protocol (sink/manifest.h says where): after_write_before_fsync,
 * after_fsync_before_rename, after_rename_before_dirsync, after_commit, mid_frame (half of a frame
 * written and flushed to the file), metrics_before_rename. Thread-safe (atomic counters). */
#ifndef TM_BASE_FAULT_IO_H
#define TM_BASE_FAULT_IO_H

#define TM_FAULT_EXIT_CODE 86

typedef enum tm_io_op {
    TM_IO_WRITE = 0,
    TM_IO_FSYNC,
    TM_IO_RENAME,
    TM_IO_TRUNCATE,
    TM_IO_OP_COUNT,
} tm_io_op;

/* End the process here if TM_FAULT_POINT selects this point and this is the chosen call. */
void tm_fault_point(const char *name);
/* 0: go ahead with the operation. Otherwise the errno value to fail it with (the caller sets
 * errno and reports the error as it would a real one). */
int tm_fault_io(tm_io_op op);

#endif /* TM_BASE_FAULT_IO_H */
