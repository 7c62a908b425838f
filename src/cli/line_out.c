/* line_out.c - files written a line at a time: `tandem run`'s output and `tandem
 * merge`'s OUT.tmp.
 *
 * Only a regular file is opened (a device, a FIFO or a directory is refused before it
 * is read or waited on), and it is locked (flock) for as long as it is open: a second
 * writer is refused at once.  Lines are gathered in memory and written at each flush;
 * a write that fails (a full disk, an I/O error) is reported with its cause, and the
 * file is cut back to the end of its last complete line, so that a reader (a resumed
 * job, merge) never finds half a line.  Closing syncs the file to the disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static bool out_fail(cli_line_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool out_fail(cli_line_out *o, const char *fmt, ...) {
    if (o->err[0]) return false;
    int k = snprintf(o->err, sizeof o->err, "%s: ", o->path);
    if (k < 0 || (size_t)k >= sizeof o->err) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->err + k, sizeof o->err - (size_t)k, fmt, ap);
    va_end(ap);
    return false;
}

static const char *kind_of(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
           : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a file";
}

/* A fresh buffer for the lines to come. */
static bool pending_open(cli_line_out *o) {
    o->buf = NULL;
    o->len = 0;
    o->pend = open_memstream(&o->buf, &o->len);
    return o->pend ? true : out_fail(o, "out of memory");
}

static void pending_close(cli_line_out *o) {
    if (o->pend) fclose(o->pend);
    free(o->buf);
    o->pend = NULL;
    o->buf = NULL;
    o->len = 0;
}

bool cli_line_out_open(cli_line_out *o, const char *path, bool truncate) {
    *o = (cli_line_out){.fd = -1, .path = path};
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return out_fail(o, "not a regular file (%s); give a file path", kind_of(st.st_mode));
    /* O_NONBLOCK: a FIFO put there since the stat does not block the open */
    o->fd = open(path, O_RDWR | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
    if (o->fd < 0) return out_fail(o, "%s", strerror(errno));
    if (fstat(o->fd, &st) != 0) return out_fail(o, "%s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return out_fail(o, "not a regular file (%s); give a file path", kind_of(st.st_mode));
    if (flock(o->fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            return out_fail(o, "locked by another process (another tandem run or merge writing this file); "
                               "refused, as two writers would interleave their lines");
        if (errno != ENOLCK && errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL)
            return out_fail(o, "cannot lock it: %s", strerror(errno));
        fprintf(stderr, "warning: %s: cannot lock it (%s): make sure that nothing else writes it\n", path,
                strerror(errno));
    }
    if (truncate && ftruncate(o->fd, 0) != 0) return out_fail(o, "%s", strerror(errno));
    o->end = truncate ? 0 : st.st_size;
    return pending_open(o);
}

bool cli_line_out_cut(cli_line_out *o, off_t end) {
    if (o->err[0]) return false;
    if (ftruncate(o->fd, end) != 0) return out_fail(o, "cannot cut its incomplete last line: %s", strerror(errno));
    o->end = end;
    return true;
}

FILE *cli_line_out_stream(cli_line_out *o) { return o->pend; }

bool cli_line_out_flush(cli_line_out *o) {
    if (o->err[0]) return false;
    if (fflush(o->pend) != 0 || ferror(o->pend)) return out_fail(o, "out of memory");
    size_t done = 0;
    while (done < o->len) {
        ssize_t w = pwrite(o->fd, o->buf + done, o->len - done, o->end + (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const int e = w < 0 ? errno : EIO;
            size_t keep = done; /* the complete lines that made it stay */
            while (keep > 0 && o->buf[keep - 1] != '\n') keep--;
            o->end += (off_t)keep;
            if (ftruncate(o->fd, o->end) != 0)
                return out_fail(o, "cannot write: %s (and cannot cut the incomplete line it left: %s)", strerror(e),
                                strerror(errno));
            return out_fail(o, "cannot write: %s", strerror(e));
        }
        done += (size_t)w;
    }
    o->end += (off_t)o->len;
    pending_close(o);
    return pending_open(o);
}

bool cli_line_out_flush_at(cli_line_out *o, size_t bytes) {
    const off_t at = o->pend ? ftello(o->pend) : 0;
    return at >= 0 && (size_t)at < bytes ? !o->err[0] : cli_line_out_flush(o);
}

bool cli_line_out_sync(cli_line_out *o) {
    if (o->fd < 0 || !o->pend || !cli_line_out_flush(o)) return false;
    return fsync(o->fd) == 0 ? true : out_fail(o, "cannot sync it to the disk: %s", strerror(errno));
}

bool cli_line_out_rename(cli_line_out *o, const char *to) {
    if (!cli_line_out_sync(o)) return false;
    if (rename(o->path, to) != 0) return out_fail(o, "cannot rename it to %s: %s", to, strerror(errno));
    o->path = to;
    char dir[PATH_MAX];
    const char *slash = strrchr(to, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - to) + 1 : 1, slash ? to : ".");
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        const int e = errno;
        if (fd >= 0) close(fd);
        return out_fail(o, "written, but its directory cannot be synced to the disk: %s", strerror(e));
    }
    close(fd);
    return true;
}

bool cli_line_out_close(cli_line_out *o) {
    if (o->fd < 0) return pending_close(o), !o->err[0]; /* (never opened) */
    bool ok = cli_line_out_sync(o);
    pending_close(o);
    if (close(o->fd) != 0 && ok) ok = out_fail(o, "%s", strerror(errno));
    o->fd = -1;
    return ok;
}
