/* base/fsutil.c - path joining, mkdir -p, whole writes, folder fsync and atomic replacement
 * (fsutil.h). The only file that pairs the output path's system calls with the fault_io hooks. */
#include "base/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fault_io.h"

// The errno value to fail op with (tm_fault_io), or 0: go ahead. Off: always 0, and not counted.
static int hook(tm_fs_hooks hooks, tm_io_op op) {
    return hooks == TM_FS_HOOKS_ON ? tm_fault_io(op) : 0;
}

char *tm_fs_path_join(const char *dir, const char *name) {
    size_t nd = strlen(dir), nn = strlen(name);
    char *p = tm_malloc(nd + nn + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, nd);
    p[nd] = '/';
    memcpy(p + nd + 1, name, nn + 1);
    return p;
}

tm_rc tm_fs_mkdir_p(const char *dir, tm_err *err) {
    char *p = tm_strdup(dir);
    if (!p)
        return TM_ERR(err, TM_E_NOMEM, "output folder path");
    tm_rc rc = TM_OK;
    size_t n = strlen(p);
    for (size_t i = 1; i <= n && !rc; i++) { // each '/' and the end close one folder of the path
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            rc = TM_ERR(err, TM_E_IO, "creating %s: %s", p, strerror(errno));
        p[i] = saved;
    }
    tm_free(p);
    return rc;
}

tm_rc tm_fs_write_fd(int fd, const char *path, const void *p, size_t n, tm_fs_hooks hooks,
                     tm_err *err) {
    const char *at = p;
    while (n > 0) {
        int e = hook(hooks, TM_IO_WRITE);
        ssize_t w = e ? -1 : write(fd, at, n);
        if (w < 0 && !e && errno == EINTR)
            continue;
        if (w < 0)
            return TM_ERR(err, TM_E_IO, "writing %s: %s", path, strerror(e ? e : errno));
        at += w;
        n -= (size_t)w;
    }
    return TM_OK;
}

tm_rc tm_fs_sync_dir(const char *dir, tm_fs_hooks hooks, tm_err *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return TM_ERR(err, TM_E_IO, "opening %s: %s", dir, strerror(errno));
    int e = hook(hooks, TM_IO_FSYNC);
    int r = e ? -1 : fsync(fd);
    if (!e)
        e = errno;
    close(fd);
    if (r != 0 && e != EINVAL) // some file systems cannot fsync folders
        return TM_ERR(err, TM_E_IO, "fsync %s: %s", dir, strerror(e));
    return TM_OK;
}

// fsync the folder that holds path ("." for a bare name), so that a rename in it lasts.
static tm_rc sync_parent(const char *path, tm_fs_hooks hooks, tm_err *err) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? tm_strndup(path, slash == path ? 1 : (size_t)(slash - path))
                      : tm_strdup(".");
    if (!dir)
        return TM_ERR(err, TM_E_NOMEM, "folder of %s", path);
    tm_rc rc = tm_fs_sync_dir(dir, hooks, err);
    tm_free(dir);
    return rc;
}

tm_rc tm_fs_replace(const char *path, const char *const *parts, size_t n_parts,
                    const tm_fs_replace_opts *opts, tm_err *err) {
    size_t np = strlen(path);
    char *tmp = tm_malloc(np + sizeof(".tmp"));
    if (!tmp)
        return TM_ERR(err, TM_E_NOMEM, "temporary path for %s", path);
    memcpy(tmp, path, np);
    memcpy(tmp + np, ".tmp", sizeof(".tmp"));
    tm_rc rc = TM_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, opts->mode);
    if (fd < 0) {
        rc = TM_ERR(err, TM_E_IO, "opening %s: %s", tmp, strerror(errno));
        goto done;
    }
    for (size_t i = 0; i < n_parts && !rc; i++)
        rc = tm_fs_write_fd(fd, tmp, parts[i], strlen(parts[i]), opts->hooks, err);
    if (!rc && opts->durable) {
        int e = hook(opts->hooks, TM_IO_FSYNC);
        if (e || fsync(fd) != 0)
            rc = TM_ERR(err, TM_E_IO, "fsync %s: %s", tmp, strerror(e ? e : errno));
    }
    if (close(fd) != 0 && !rc)
        rc = TM_ERR(err, TM_E_IO, "closing %s: %s", tmp, strerror(errno));
    if (rc)
        goto done;
    if (opts->point_before_rename)
        tm_fault_point(opts->point_before_rename);
    int e = hook(opts->hooks, TM_IO_RENAME);
    if (e || rename(tmp, path) != 0) {
        rc = TM_ERR(err, TM_E_IO, "renaming %s to %s: %s", tmp, path, strerror(e ? e : errno));
        goto done;
    }
    if (opts->point_before_dirsync)
        tm_fault_point(opts->point_before_dirsync);
    if (opts->durable)
        rc = sync_parent(path, opts->hooks, err);
done:
    if (rc)
        unlink(tmp); // a partial file, never read; after the rename there is none
    tm_free(tmp);
    return rc;
}
