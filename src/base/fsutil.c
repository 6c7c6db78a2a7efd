/* base/fsutil.c - path joining, mkdir -p, whole writes, folder fsync and atomic replacement
 * (fsutil.h), safe opens of output files and canonical paths. The only file that pairs the output
 * path's system calls with the fault_io hooks. */
#include "base/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
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
    int fd = -1;
    tm_rc rc = tm_fs_open_out(tmp, O_WRONLY | O_CREAT | O_TRUNC, opts->mode, NULL, &fd, err);
    if (rc) { // not ours (a link, a FIFO...): left as it is
        tm_free(tmp);
        return rc;
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

// ---- output files and canonical paths ----

const char *tm_fs_kind(unsigned mode) {
    return S_ISREG(mode)    ? "a regular file"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISDIR(mode)  ? "a folder"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "a device or other special file";
}

tm_rc tm_fs_open_in(const char *path, const char *what, int *fd, struct stat *st_out, tm_err *err) {
    *fd = -1;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) {
        int e = errno;
        TM_ERR(err, TM_E_IO, "%s: open: %s (%s)", path, strerror(e), what);
        errno = e; // callers tell a missing optional file by ENOENT
        return TM_E_IO;
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return TM_ERR(err, TM_E_IO, "%s: stat: %s (%s)", path, strerror(e), what);
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return TM_ERR(err, TM_E_IO,
                      "%s is %s, not a regular file (%s: tokenmill reads only regular files "
                      "there; a FIFO or device could block it or change under it)",
                      path, tm_fs_kind(st.st_mode), what);
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return TM_ERR(err, TM_E_IO, "%s: fcntl: %s (%s)", path, strerror(e), what);
    }
    if (st_out)
        *st_out = st;
    *fd = f;
    return TM_OK;
}

tm_rc tm_fs_fopen_in(const char *path, const char *what, FILE **out, tm_err *err) {
    *out = NULL;
    int fd = -1;
    tm_rc rc = tm_fs_open_in(path, what, &fd, NULL, err);
    if (rc)
        return rc;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        close(fd);
        return TM_ERR(err, TM_E_NOMEM, "%s: fdopen", path);
    }
    *out = fp;
    return TM_OK;
}

// The error for a path that is not a plain file of tokenmill's (st from lstat).
static tm_rc not_ours(const char *path, const struct stat *st, tm_err *err) {
    if (S_ISLNK(st->st_mode))
        return TM_ERR(err, TM_E_IO,
                      "%s is a symbolic link: tokenmill never writes through links in its "
                      "outputs (remove it, or choose another output path)",
                      path);
    const char *kind = tm_fs_kind(st->st_mode);
    return TM_ERR(err, TM_E_IO,
                  "%s is %s, not a regular file: tokenmill writes only regular files there "
                  "(remove it, or choose another output path)",
                  path, kind);
}

tm_rc tm_fs_check_out(const char *path, int64_t *size, tm_err *err) {
    struct stat st;
    *size = -1;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return TM_OK;
        return TM_ERR(err, TM_E_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return not_ours(path, &st, err);
    *size = (int64_t)st.st_size;
    return TM_OK;
}

tm_rc tm_fs_open_out(const char *path, int flags, unsigned mode, bool *created, int *fd,
                     tm_err *err) {
    *fd = -1;
    if (created)
        *created = false;
    int64_t size;
    tm_rc rc = tm_fs_check_out(path, &size, err); // lstat first: a FIFO is never even opened
    if (rc)
        return rc;
    // O_NOFOLLOW | O_NONBLOCK: what lstat saw may have been swapped since; fstat decides.
    int base = (flags & ~(O_TRUNC | O_CREAT)) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    int f = -1;
    if ((flags & O_CREAT) && size < 0) {
        f = open(path, base | O_CREAT | O_EXCL, mode);
        if (f >= 0 && created)
            *created = true;
    }
    if (f < 0 && (!(flags & O_CREAT) || size >= 0 || errno == EEXIST))
        f = open(path, base, mode);
    if (f < 0) {
        int e = errno;
        struct stat st;
        if ((e == ELOOP || e == ENXIO || e == EISDIR) && lstat(path, &st) == 0 &&
            !S_ISREG(st.st_mode))
            return not_ours(path, &st, err);
        return TM_ERR(err, TM_E_IO, "opening %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        rc = TM_ERR(err, TM_E_IO, "stat %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = not_ours(path, &st, err);
    } else if ((flags & O_ACCMODE) != O_RDONLY && st.st_nlink > 1) {
        rc = TM_ERR(err, TM_E_IO,
                    "%s has %llu hard links: another name shares this file, and writing it "
                    "would change that one too (remove this name, or choose another output path)",
                    path, (unsigned long long)st.st_nlink);
    } else if (fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK) != 0) {
        rc = TM_ERR(err, TM_E_IO, "opening %s: %s", path, strerror(errno));
    } else if ((flags & O_TRUNC) && st.st_size > 0 && ftruncate(f, 0) != 0) {
        rc = TM_ERR(err, TM_E_IO, "truncating %s: %s", path, strerror(errno));
    }
    if (rc) {
        close(f);
        if (created && *created)
            unlink(path); // made by this call, refused: nobody else's
        if (created)
            *created = false;
        return rc;
    }
    *fd = f;
    return TM_OK;
}

char *tm_fs_canon(const char *path) {
    size_t n = strlen(path);
    char *p = tm_malloc(n + 1);
    if (!p)
        return NULL;
    memcpy(p, path, n + 1);
    // The longest leading part that realpath resolves: the whole path, then without its last
    // component, and so on down to "/" or ".".
    size_t cut = n;
    char *real = NULL;
    for (;;) {
        char saved = p[cut];
        p[cut] = '\0';
        const char *cand = cut ? p : (path[0] == '/' ? "/" : ".");
        real = realpath(cand, NULL);
        p[cut] = saved;
        if (real || cut == 0)
            break;
        size_t c = cut; // drop the last component and the slashes before it
        while (c > 0 && p[c - 1] != '/')
            c--;
        while (c > 0 && p[c - 1] == '/')
            c--;
        cut = c; // 0: "/" or "." is tried next
    }
    size_t nr = real ? strlen(real) : 1;
    char *out = tm_malloc(nr + n + 2);
    if (!out) {
        free(real);
        tm_free(p);
        return NULL;
    }
    if (real)
        memcpy(out, real, nr + 1);
    else
        memcpy(out, path[0] == '/' ? "/" : ".", 2);
    free(real); // realpath's malloc
    size_t len = strlen(out);
    // The rest, component by component: "" and "." are dropped, ".." removes one.
    const char *q = p + cut;
    while (*q) {
        while (*q == '/')
            q++;
        const char *e = q;
        while (*e && *e != '/')
            e++;
        size_t k = (size_t)(e - q);
        if (k == 0 || (k == 1 && q[0] == '.')) {
            // nothing
        } else if (k == 2 && q[0] == '.' && q[1] == '.') {
            while (len > 1 && out[len - 1] != '/')
                len--;
            if (len > 1)
                len--;
            out[len] = '\0';
        } else {
            if (len > 0 && out[len - 1] != '/')
                out[len++] = '/';
            memcpy(out + len, q, k);
            len += k;
            out[len] = '\0';
        }
        q = e;
    }
    tm_free(p);
    return out;
}

bool tm_fs_same_file(const char *a, const char *b) {
    if (strcmp(a, b) == 0)
        return true;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}
