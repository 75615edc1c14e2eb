/*
 * libinkfs: the inkfs file system in your own process (the C ABI).
 *
 * Conventions:
 * - Calls are shaped as their POSIX namesakes (inkfs_openat is openat(2),
 *   inkfs_readdir is readdir(3)) and take the mount as a first argument.
 *   They return what the namesake returns, or -1 (NULL for a pointer) with
 *   errno set to the errno Linux gives for the same request. A successful
 *   call may change errno.
 * - Descriptors are small ints in a table of their inkfs_t, handed out
 *   lowest first as open(2) does; they are NOT kernel descriptors (do not
 *   pass them to read(2), close(2), poll(2) or another inkfs_t). dup
 *   shares the file offset, as POSIX does.
 * - A *at call's dirfd is a directory descriptor of the same mount, or
 *   AT_FDCWD (= INKFS_AT_ROOT) for the pool's root directory; an absolute
 *   path starts at the pool's root. There is no working directory.
 * - Permission checks are Linux's, made by the engine, for the
 *   credentials the inkfs_t holds: the process's effective uid, gid,
 *   supplementary groups and umask when inkfs_mount ran; the library does
 *   not see setuid(2) and friends: call inkfs_refresh_credentials or
 *   inkfs_set_credentials after changing them.
 * - Thread-safe: any number of threads may call on one inkfs_t and one
 *   descriptor (a directory stream: one thread at a time, as a DIR).
 *   read/write and their variants take no mount-wide lock, allocate
 *   nothing and make no system call (but the msync that persists a pool
 *   kept on a plain disk file rather than PM, DAX or tmpfs).
 * - Pointers: strings are NUL-terminated; a NULL path or buffer is
 *   EFAULT (a buffer of length 0 may be NULL), a NULL inkfs_t or
 *   inkfs_dir_t EINVAL. No call unwinds or aborts on bad input: an
 *   internal failure is EIO.
 * - Durability: in strict and sync modes every call is durable when it
 *   returns; in posix mode file data is durable at fsync/fdatasync
 *   (docs/MODES.md).
 */

#ifndef INKFS_H
#define INKFS_H

/* Generated from crates/inkfs-capi/src by cbindgen (crates/inkfs-capi/tests/header.rs,
 * which fails when this file is stale). Do not edit: change the Rust source and run
 *   INKFS_BLESS_HEADER=1 cargo test -p inkfs-capi --test header */

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <dirent.h>
#include <fcntl.h>
#include <time.h>

// A *at call's `dirfd` naming the pool's root directory (the value of
// AT_FDCWD, which means the same: a mount has no working directory).
#define INKFS_AT_ROOT -100

// The size of `inkfs_options` in the first header: the smallest
// `opts_size` `inkfs_mount_ex` takes.
#define INKFS_OPTIONS_SIZE_V0 12

// Every call durable and atomic on return (data copy-on-write).
#define INKFS_MODE_STRICT 0

// Every call durable on return; overwrites in place (not atomic).
#define INKFS_MODE_SYNC 1

// Metadata atomic and durable; file data durable at fsync/fdatasync.
#define INKFS_MODE_POSIX 2

// On corruption, turn read-only (later changes fail with EROFS).
#define INKFS_ERRORS_REMOUNT_RO 0

// On corruption, keep serving; only the damaged objects fail.
#define INKFS_ERRORS_CONTINUE 1

// f_type of statfs: "INKF".
#define INKFS_SUPER_MAGIC 1229867846

// An open directory stream (`inkfs_dir_t` in C): a descriptor of its
// mount and the entries read ahead.
typedef struct inkfs_dir_t inkfs_dir_t;

// A mounted pool (`inkfs_t` in C).
typedef struct inkfs_t inkfs_t;

// How `inkfs_mount_ex` (and `inkfs_mount`: the first three fields only)
// mounts a pool. A NULL `opts` is all zeros: strict mode, read-write,
// errors=remount-ro, a hybrid pool's data device where mkfs recorded it.
typedef struct inkfs_options {
  // INKFS_MODE_STRICT, INKFS_MODE_SYNC or INKFS_MODE_POSIX
  // (docs/MODES.md).
  int mode;
  // Non-zero: mount read-only (shares the pool with other read-only
  // mounts; every change fails with EROFS).
  int read_only;
  // INKFS_ERRORS_REMOUNT_RO or INKFS_ERRORS_CONTINUE: what corruption
  // met while mounted does besides failing the call with EIO.
  int errors;
  // A hybrid pool's data device (block device or file), when it is not
  // at the path recorded at mkfs (it moved); NULL: the recorded path.
  // Read by `inkfs_mount_ex` only: `inkfs_mount` keeps reading the
  // first three fields, as programs built before this field pass.
  const char *data;
} inkfs_options;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Create a pool file of `size_bytes` at `pool` (mode 0600; it must not
// exist: EEXIST, whatever it holds) and lay out an empty file system on it with `lanes` lanes (0:
// one per online CPU). The root directory is owned by the calling
// process's effective uid and gid, mode 0755. Returns 0, or -1 with
// errno (inkfs_last_error() says why).
int inkfs_mkfs(const char *pool, uint64_t size_bytes, unsigned int lanes);

// Mount the pool at `pool` (a file on /dev/shm, hugetlbfs or a DAX file
// system, or a /dev/daxX.Y device) in this process: recovers it if it
// crashed. The pool is claimed for as long as it is mounted: a pool
// mounted read-write by another process (or by another inkfs_mount in
// this one, or served by `inkfs mount`) is refused with EBUSY, and so is
// a read-write mount of a pool mounted read-only elsewhere; the claim is
// released by inkfs_unmount or when the process dies, even by SIGKILL.
// Calls are made with the calling process's effective uid, gid,
// supplementary groups and umask as they are now (see
// inkfs_set_credentials). Returns the handle, or NULL with errno: EBUSY
// (in use), EINVAL (not an inkfs pool, or a version or state this library
// cannot mount, e.g. one that needs fsck), ENOENT, EACCES, EIO...;
// inkfs_last_error() says why.
//
// Reads the first three fields of `opts` (`mode`, `read_only`, `errors`)
// only; `inkfs_mount_ex` reads them all.
struct inkfs_t *inkfs_mount(const char *pool, const struct inkfs_options *opts);

// inkfs_mount with every field of `opts`, among them `data` (a hybrid
// pool's data device that moved). `opts_size` is `sizeof(inkfs_options)`
// as the caller's header has it: a program built against an older header
// keeps working with a library whose struct grew (its missing fields are
// zero), and one built against a newer header is refused with E2BIG when
// it sets a field this library does not know. EINVAL: `opts_size` below
// INKFS_OPTIONS_SIZE_V0, or a bad field. A data device that is missing or
// is not the pool's is EINVAL, inkfs_last_error() saying which.
struct inkfs_t *inkfs_mount_ex(const char *pool,
                               const struct inkfs_options *opts,
                               size_t opts_size);

// Unmount: close every descriptor still open (the last close of an
// unlinked file frees it), save the allocator, mark the pool clean and
// release it. Fails with EBUSY, changing nothing, while a directory
// stream (inkfs_dir_t) of this mount is open. Otherwise the handle is
// gone when this returns, even on failure (EIO: the pool could not be
// marked clean; it is recovered at its next mount). No other thread may
// be inside a call on this handle, nor start one.
int inkfs_unmount(struct inkfs_t *fs);

// Why this thread's last failed inkfs_mount, inkfs_mkfs or inkfs_unmount
// failed, e.g. "pool in use by pid 4242 (inkfs mount /dev/shm/p /mnt)";
// "" if none failed. Valid until the next such failure in this thread.
const char *inkfs_last_error(void);

// Make every later call on `fs` act as user `uid`, group `gid` with the
// `ngroups` supplementary groups at `groups` (the umask is kept). The
// library does not see setuid(2), setgid(2) or setgroups(2): a process
// that changes its ids calls this, or inkfs_refresh_credentials. Checks
// are made by the engine exactly as Linux makes them for a process with
// these ids (uid 0: root, with every capability). Calls already running
// finish with the old credentials.
int inkfs_set_credentials(struct inkfs_t *fs,
                          uid_t uid,
                          gid_t gid,
                          size_t ngroups,
                          const gid_t *groups);

// Take the calling process's effective uid and gid, supplementary groups
// and umask again (after it changed them).
int inkfs_refresh_credentials(struct inkfs_t *fs);

// Set the umask of files created through `fs` (the process's own umask(2)
// is not changed, nor read again); returns the previous one. Never fails
// for a valid handle; (mode_t)-1 with EINVAL for NULL.
mode_t inkfs_umask(struct inkfs_t *fs, mode_t mask);

// openat(2): `path` from the directory open at `dirfd` (AT_FDCWD: the
// pool's root; an absolute path always starts at the pool's root).
// Flags: the access mode, O_CREAT, O_EXCL, O_TRUNC, O_APPEND,
// O_DIRECTORY, O_NOFOLLOW, O_NOATIME, O_SYNC, O_DSYNC, O_CLOEXEC,
// O_NONBLOCK, O_DIRECT; O_TMPFILE and O_PATH fail with EOPNOTSUPP.
// `mode` is used with O_CREAT (less the umask). Returns the lowest free
// descriptor of this mount, or -1 with errno.
int inkfs_openat(struct inkfs_t *fs, int dirfd, const char *path, int flags, mode_t mode);

// open(2): openat from the pool's root.
int inkfs_open(struct inkfs_t *fs, const char *path, int flags, mode_t mode);

// creat(2): open with O_CREAT|O_WRONLY|O_TRUNC.
int inkfs_creat(struct inkfs_t *fs, const char *path, mode_t mode);

// close(2): the descriptor is free at once; the file is closed when no
// other descriptor (dup) and no call in flight uses it.
int inkfs_close(struct inkfs_t *fs, int fd);

// dup(2): the lowest free descriptor, sharing `fd`'s offset and status
// flags.
int inkfs_dup(struct inkfs_t *fs, int fd);

// dup3(2) (dup2 with `flags` 0 or O_CLOEXEC; `newfd` == `oldfd` is
// EINVAL): `newfd` names `oldfd`'s description, closing what it named.
int inkfs_dup3(struct inkfs_t *fs, int oldfd, int newfd, int flags);

// dup2(2): as dup3, except that `newfd` == `oldfd` returns it (if open).
int inkfs_dup2(struct inkfs_t *fs, int oldfd, int newfd);

// fcntl(2) for F_GETFL, F_SETFL (O_APPEND, O_NONBLOCK, O_NOATIME,
// O_DIRECT), F_GETFD, F_SETFD, F_DUPFD and F_DUPFD_CLOEXEC; other
// commands fail with EINVAL. `arg` is the third argument (ignored where
// the command takes none).
int inkfs_fcntl(struct inkfs_t *fs, int fd, int cmd, long arg);

// read(2): from the file offset, which advances by what was read.
ssize_t inkfs_read(struct inkfs_t *fs, int fd, void *buf, size_t count);

// pread(2): at `offset`; the file offset is unchanged.
ssize_t inkfs_pread(struct inkfs_t *fs, int fd, void *buf, size_t count, off_t offset_bytes);

// write(2): at the file offset (O_APPEND: at the end of file, decided
// under the inode's lock), which then points past the bytes written.
// Durable on return in strict and sync modes, and with O_SYNC/O_DSYNC.
ssize_t inkfs_write(struct inkfs_t *fs, int fd, const void *buf, size_t count);

// pwrite(2): at `offset` (O_APPEND: at the end of file, as Linux does);
// the file offset is unchanged.
ssize_t inkfs_pwrite(struct inkfs_t *fs, int fd, const void *buf, size_t count, off_t offset_bytes);

// readv(2).
ssize_t inkfs_readv(struct inkfs_t *fs, int fd, const struct iovec *iov, int iovcnt);

// writev(2).
ssize_t inkfs_writev(struct inkfs_t *fs, int fd, const struct iovec *iov, int iovcnt);

// preadv(2).
ssize_t inkfs_preadv(struct inkfs_t *fs,
                     int fd,
                     const struct iovec *iov,
                     int iovcnt,
                     off_t offset_bytes);

// pwritev(2).
ssize_t inkfs_pwritev(struct inkfs_t *fs,
                      int fd,
                      const struct iovec *iov,
                      int iovcnt,
                      off_t offset_bytes);

// lseek(2): SEEK_SET, SEEK_CUR, SEEK_END, SEEK_DATA, SEEK_HOLE (ENXIO at
// or past the end of file). A directory's offset is a readdir cookie:
// SEEK_SET to one returned by getdents64 or telldir, or SEEK_CUR by 0.
off_t inkfs_lseek(struct inkfs_t *fs, int fd, off_t offset_bytes, int whence);

// fsync(2): make the file's data and metadata durable (nothing to do in
// strict and sync modes: every call already is).
int inkfs_fsync(struct inkfs_t *fs, int fd);

// fdatasync(2).
int inkfs_fdatasync(struct inkfs_t *fs, int fd);

// syncfs(2): every pending posix-mode write durable.
int inkfs_syncfs(struct inkfs_t *fs);

// ftruncate(2): the descriptor must be open for writing (EINVAL).
int inkfs_ftruncate(struct inkfs_t *fs, int fd, off_t length);

// truncate(2): needs write permission on the file.
int inkfs_truncate(struct inkfs_t *fs, const char *path, off_t length);

// fallocate(2): mode 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE (with
// KEEP_SIZE), FALLOC_FL_ZERO_RANGE, FALLOC_FL_COLLAPSE_RANGE,
// FALLOC_FL_INSERT_RANGE; others EOPNOTSUPP.
int inkfs_fallocate(struct inkfs_t *fs, int fd, int mode, off_t offset_bytes, off_t len);

// copy_file_range(2) between two descriptors of the same mount. A NULL
// `off_in`/`off_out` uses and advances that descriptor's offset; a
// non-NULL one is read and advanced instead. `flags` must be 0.
ssize_t inkfs_copy_file_range(struct inkfs_t *fs,
                              int fd_in,
                              off_t *off_in,
                              int fd_out,
                              off_t *off_out,
                              size_t len,
                              unsigned int flags);

// fstatat(2): flags AT_SYMLINK_NOFOLLOW (lstat), AT_EMPTY_PATH (the
// descriptor itself with an empty path), AT_NO_AUTOMOUNT (ignored).
// st_dev is the pool's (from its UUID), st_blksize 4096.
int inkfs_fstatat(struct inkfs_t *fs, int dirfd, const char *path, struct stat *buf, int flags);

// stat(2).
int inkfs_stat(struct inkfs_t *fs, const char *path, struct stat *buf);

// lstat(2).
int inkfs_lstat(struct inkfs_t *fs, const char *path, struct stat *buf);

// fstat(2).
int inkfs_fstat(struct inkfs_t *fs, int fd, struct stat *buf);

// fchmodat(2): flags 0 or AT_SYMLINK_NOFOLLOW (which, on a symbolic
// link, fails with EOPNOTSUPP as on Linux).
int inkfs_fchmodat(struct inkfs_t *fs, int dirfd, const char *path, mode_t mode, int flags);

// chmod(2).
int inkfs_chmod(struct inkfs_t *fs, const char *path, mode_t mode);

// fchmod(2).
int inkfs_fchmod(struct inkfs_t *fs, int fd, mode_t mode);

// fchownat(2): -1 leaves an id unchanged; flags AT_SYMLINK_NOFOLLOW,
// AT_EMPTY_PATH.
int inkfs_fchownat(struct inkfs_t *fs,
                   int dirfd,
                   const char *path,
                   uid_t uid,
                   gid_t gid,
                   int flags);

// chown(2).
int inkfs_chown(struct inkfs_t *fs, const char *path, uid_t uid, gid_t gid);

// lchown(2).
int inkfs_lchown(struct inkfs_t *fs, const char *path, uid_t uid, gid_t gid);

// fchown(2).
int inkfs_fchown(struct inkfs_t *fs, int fd, uid_t uid, gid_t gid);

// utimensat(2): `times` NULL (both now) or two timespecs (atime, mtime)
// with UTIME_NOW and UTIME_OMIT; flags AT_SYMLINK_NOFOLLOW,
// AT_EMPTY_PATH. A path of NULL with a descriptor is futimens.
int inkfs_utimensat(struct inkfs_t *fs,
                    int dirfd,
                    const char *path,
                    const struct timespec *times,
                    int flags);

// futimens(2).
int inkfs_futimens(struct inkfs_t *fs, int fd, const struct timespec *times);

// faccessat(2): `mode` F_OK or a mask of R_OK, W_OK, X_OK; flags
// AT_EACCESS (the only ids there are are the mount's credentials, so it
// changes nothing), AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH.
int inkfs_faccessat(struct inkfs_t *fs, int dirfd, const char *path, int mode, int flags);

// access(2).
int inkfs_access(struct inkfs_t *fs, const char *path, int mode);

// statfs(2) of the mount (`path` must exist): f_type INKFS_SUPER_MAGIC,
// blocks of 4096 bytes.
int inkfs_statfs(struct inkfs_t *fs, const char *path, struct statfs *buf);

// fstatfs(2).
int inkfs_fstatfs(struct inkfs_t *fs, int fd, struct statfs *buf);

// mkdirat(2).
int inkfs_mkdirat(struct inkfs_t *fs, int dirfd, const char *path, mode_t mode);

// mkdir(2).
int inkfs_mkdir(struct inkfs_t *fs, const char *path, mode_t mode);

// mknodat(2): a regular file, FIFO, socket, or (root only) device node.
// FIFOs, sockets and devices can be created and listed but not opened
// through the library (ENXIO).
int inkfs_mknodat(struct inkfs_t *fs, int dirfd, const char *path, mode_t mode, dev_t dev);

// unlinkat(2): flags 0 (unlink) or AT_REMOVEDIR (rmdir).
int inkfs_unlinkat(struct inkfs_t *fs, int dirfd, const char *path, int flags);

// unlink(2).
int inkfs_unlink(struct inkfs_t *fs, const char *path);

// rmdir(2).
int inkfs_rmdir(struct inkfs_t *fs, const char *path);

// renameat2(2): flags RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT.
int inkfs_renameat2(struct inkfs_t *fs,
                    int olddirfd,
                    const char *oldpath,
                    int newdirfd,
                    const char *newpath,
                    unsigned int flags);

// renameat(2).
int inkfs_renameat(struct inkfs_t *fs,
                   int olddirfd,
                   const char *oldpath,
                   int newdirfd,
                   const char *newpath);

// rename(2).
int inkfs_rename(struct inkfs_t *fs, const char *oldpath, const char *newpath);

// linkat(2): flags AT_SYMLINK_FOLLOW (link what a symbolic link points
// at, not the link) and AT_EMPTY_PATH (link the descriptor `olddirfd`).
int inkfs_linkat(struct inkfs_t *fs,
                 int olddirfd,
                 const char *oldpath,
                 int newdirfd,
                 const char *newpath,
                 int flags);

// link(2).
int inkfs_link(struct inkfs_t *fs, const char *oldpath, const char *newpath);

// symlinkat(2): `target` is stored as given (an absolute one is followed
// from the pool's root).
int inkfs_symlinkat(struct inkfs_t *fs, const char *target, int newdirfd, const char *linkpath);

// symlink(2).
int inkfs_symlink(struct inkfs_t *fs, const char *target, const char *linkpath);

// readlinkat(2): the target, cut to `bufsiz` bytes, not NUL-terminated;
// returns its length.
ssize_t inkfs_readlinkat(struct inkfs_t *fs, int dirfd, const char *path, char *buf, size_t bufsiz);

// readlink(2).
ssize_t inkfs_readlink(struct inkfs_t *fs, const char *path, char *buf, size_t bufsiz);

// fdopendir(3): a stream on the directory open at `fd`, which the stream
// now owns (inkfs_closedir closes it). NULL with errno (ENOTDIR, EBADF).
struct inkfs_dir_t *inkfs_fdopendir(struct inkfs_t *fs, int fd);

// opendir(3): open `path` (O_RDONLY|O_DIRECTORY) and return a stream on
// it. A mount cannot be unmounted while one of its streams is open.
struct inkfs_dir_t *inkfs_opendir(struct inkfs_t *fs, const char *path);

// readdir(3): the next entry (d_ino, d_off: the cookie after it, d_type,
// d_name), valid until the next call on the stream; NULL at the end
// (errno unchanged) or on error (errno set).
struct dirent *inkfs_readdir(struct inkfs_dir_t *dir);

// telldir(3): the stream's position, for inkfs_seekdir.
long inkfs_telldir(struct inkfs_dir_t *dir);

// seekdir(3): back (or on) to a position telldir or d_off returned.
void inkfs_seekdir(struct inkfs_dir_t *dir, long loc);

// rewinddir(3).
void inkfs_rewinddir(struct inkfs_dir_t *dir);

// dirfd(3): the stream's descriptor (still owned by the stream).
int inkfs_dirfd(struct inkfs_dir_t *dir);

// closedir(3): close the stream and its descriptor; the stream is freed
// even if the descriptor was already closed (then -1, EBADF).
int inkfs_closedir(struct inkfs_dir_t *dir);

// getdents64(2): as many `struct linux_dirent64` records as fit in
// `count` bytes at `dirp`, from the descriptor's offset (a cookie, which
// advances); 0 at the end; EINVAL if not even one fits.
ssize_t inkfs_getdents64(struct inkfs_t *fs, int fd, void *dirp, size_t count);

// getxattr(2): the value's length; `size` 0 asks for the length only;
// ERANGE if `size` is too small, ENODATA if there is no such attribute.
ssize_t inkfs_getxattr(struct inkfs_t *fs,
                       const char *path,
                       const char *name,
                       void *value,
                       size_t size);

// lgetxattr(2).
ssize_t inkfs_lgetxattr(struct inkfs_t *fs,
                        const char *path,
                        const char *name,
                        void *value,
                        size_t size);

// fgetxattr(2).
ssize_t inkfs_fgetxattr(struct inkfs_t *fs, int fd, const char *name, void *value, size_t size);

// setxattr(2): flags 0, XATTR_CREATE (EEXIST if present) or
// XATTR_REPLACE (ENODATA if absent).
int inkfs_setxattr(struct inkfs_t *fs,
                   const char *path,
                   const char *name,
                   const void *value,
                   size_t size,
                   int flags);

// lsetxattr(2).
int inkfs_lsetxattr(struct inkfs_t *fs,
                    const char *path,
                    const char *name,
                    const void *value,
                    size_t size,
                    int flags);

// fsetxattr(2).
int inkfs_fsetxattr(struct inkfs_t *fs,
                    int fd,
                    const char *name,
                    const void *value,
                    size_t size,
                    int flags);

// listxattr(2): the names the caller may see, each NUL-terminated; the
// total length; `size` 0 asks for the length only.
ssize_t inkfs_listxattr(struct inkfs_t *fs, const char *path, char *list_out, size_t size);

// llistxattr(2).
ssize_t inkfs_llistxattr(struct inkfs_t *fs, const char *path, char *list_out, size_t size);

// flistxattr(2).
ssize_t inkfs_flistxattr(struct inkfs_t *fs, int fd, char *list_out, size_t size);

// removexattr(2).
int inkfs_removexattr(struct inkfs_t *fs, const char *path, const char *name);

// lremovexattr(2).
int inkfs_lremovexattr(struct inkfs_t *fs, const char *path, const char *name);

// fremovexattr(2).
int inkfs_fremovexattr(struct inkfs_t *fs, int fd, const char *name);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* INKFS_H */
