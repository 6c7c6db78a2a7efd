/* base/fsutil.h - the file-system steps of the output path, written once: join a path, make a
 * folder and its parents, write a whole buffer to a descriptor, fsync a folder, and replace a file
 * atomically (temporary file, fsync, rename, fsync of the folder).
 *
 * The commit protocol's files (sink/manifest.c, the sink's folder) pass TM_FS_HOOKS_ON: every
 * write, fsync and rename then goes through tm_fault_io() right before the system call, as
 * base/fault_io.h describes, and the crash tests count them. Side files (metrics.json, the
 * Prometheus textfile) pass TM_FS_HOOKS_OFF, so writing them never shifts those counts. Errors
 * name the file and carry strerror()'s text. Stateless; thread-safe where the paths differ. Does
 * not lock, and does not retry anything but EINTR.
 *
 * Files tokenmill writes in place (its output folder's data files, lock and temporary files) are
 * opened with tm_fs_open_out: never through a symbolic link, never a FIFO or device (which could
 * block the open forever or be something else altogether), never a file with other hard links.
 * tm_fs_canon and tm_fs_same_file let the job spec compare the paths a job writes with the paths
 * it reads before anything starts. */
#ifndef TM_BASE_FSUTIL_H
#define TM_BASE_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

struct stat;

/* Whether a step goes through the tm_fault_io() hooks (see the top of this file). */
typedef enum tm_fs_hooks {
    TM_FS_HOOKS_OFF = 0,
    TM_FS_HOOKS_ON,
} tm_fs_hooks;

/* How tm_fs_replace writes. */
typedef struct tm_fs_replace_opts {
    unsigned mode;                    /* permission bits of a new file, before the umask */
    bool durable;                     /* fsync the file before the rename, the folder after */
    tm_fs_hooks hooks;                /* write, fsync and rename through tm_fault_io() or not */
    const char *point_before_rename;  /* tm_fault_point() name, or NULL */
    const char *point_before_dirsync; /* tm_fault_point() name after the rename, or NULL */
} tm_fs_replace_opts;

/* "dir/name" in a new string that the caller frees with tm_free(); NULL when out of memory. */
char *tm_fs_path_join(const char *dir, const char *name);
/* Create dir and every missing folder above it (mode 0777 before the umask); ones that exist
 * already are fine. Does not check that an existing dir is a folder. TM_E_IO names the folder
 * that could not be made; TM_E_NOMEM. */
tm_rc tm_fs_mkdir_p(const char *dir, tm_err *err);
/* Write the n bytes at p to fd, retrying short writes and EINTR; path names the file in errors.
 * With hooks on, each write() is preceded by tm_fault_io(TM_IO_WRITE). TM_E_IO. */
tm_rc tm_fs_write_fd(int fd, const char *path, const void *p, size_t n, tm_fs_hooks hooks,
                     tm_err *err);
/* fsync the folder dir, so that entries made or renamed in it last (file systems that cannot
 * fsync a folder, EINVAL, are let be). With hooks on, tm_fault_io(TM_IO_FSYNC) comes first.
 * TM_E_IO. */
tm_rc tm_fs_sync_dir(const char *dir, tm_fs_hooks hooks, tm_err *err);
/* Replace the file at path with the n_parts NUL-terminated strings of parts, in order, each one
 * write sequence: they go to "<path>.tmp" (created or truncated), which is fsynced when durable,
 * closed, then renamed over path; when durable, the folder of path is fsynced last. The fault
 * points of opts fire before the rename and between the rename and the folder's fsync. On an
 * error the temporary file is removed and path is either the old file or the new one (the
 * rename is the commit). TM_E_IO, TM_E_NOMEM. Borrows everything for the call. */
tm_rc tm_fs_replace(const char *path, const char *const *parts, size_t n_parts,
                    const tm_fs_replace_opts *opts, tm_err *err);

/* Open path for tokenmill to write (or, O_RDONLY, to lock): flags is O_RDONLY, O_WRONLY or O_RDWR
 * with any of O_CREAT, O_APPEND and O_TRUNC. The file must be a regular file: a symbolic link at
 * path (never followed: O_NOFOLLOW), a FIFO, socket, device or folder is TM_E_IO naming it, and the
 * open never blocks (O_NONBLOCK until the file is known to be regular). Opened for writing, a file
 * with more than one hard link is refused too (writing it would change the other names' file).
 * O_TRUNC is applied after these checks. *created (may be NULL) tells whether this call made the
 * file. On success *fd is the blocking, close-on-exec descriptor the caller closes. TM_E_IO. */
tm_rc tm_fs_open_out(const char *path, int flags, unsigned mode, bool *created, int *fd,
                     tm_err *err);
/* Open path for tokenmill to read (a model file, a job file, an input): O_RDONLY with O_NONBLOCK
 * so that a FIFO or device under the name never blocks the open (issue 35), then fstat: anything
 * but a regular file is TM_E_IO "<path> is a FIFO, not a regular file (<what>: ...)" (what names
 * the role, e.g. "model config"; symbolic links are followed, as the user named the path). On
 * success *fd is a blocking, close-on-exec descriptor the caller closes, and *st (may be NULL)
 * the file's fstat. On an open failure errno is the open's. TM_E_IO. */
tm_rc tm_fs_open_in(const char *path, const char *what, int *fd, struct stat *st, tm_err *err);
/* tm_fs_open_in as a stdio stream ("rb") the caller fcloses. On an open failure errno is the
 * open's (ENOENT for a missing file). TM_E_IO, TM_E_NOMEM. */
tm_rc tm_fs_fopen_in(const char *path, const char *what, FILE **out, tm_err *err);
/* "a FIFO", "a folder", "a socket", "a device or other special file" or "a regular file", for a
 * stat st_mode. */
const char *tm_fs_kind(unsigned mode);

/* lstat path, which tokenmill writes: *size is its length, or -1 when there is no such file. A
 * symbolic link or anything but a regular file there is TM_E_IO naming it; TM_E_IO for other
 * lstat errors. Opens nothing, so it cannot block. */
tm_rc tm_fs_check_out(const char *path, int64_t *size, tm_err *err);
/* The canonical form of path, whether it exists or not: realpath(3) of its longest existing
 * leading part (symbolic links, "." and ".." resolved; relative paths against the current folder),
 * then the rest with "." and ".." taken lexically. A new string the caller frees with tm_free();
 * NULL when out of memory. */
char *tm_fs_canon(const char *path);
/* Do the canonical paths a and b (tm_fs_canon) name the same file: equal strings, or both exist
 * and are the same inode (hard links)? */
bool tm_fs_same_file(const char *a, const char *b);

#endif /* TM_BASE_FSUTIL_H */
