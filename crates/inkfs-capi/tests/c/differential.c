/* differential.c: random operations against libinkfs and, in lockstep,
 * the same operations through libc on a directory of a Linux file system
 * (tmpfs), comparing every result: return values, errno, data read, the
 * stat fields that must agree (type and mode, link count, size of
 * non-directories), directory listings as sorted sets, symbolic link
 * targets, xattr values and lists; then the whole tree at the end.
 *
 * usage: differential POOL DIR SEED OPS
 *   POOL: an inkfs pool to create (must not exist); DIR: an empty
 *   directory on tmpfs. Prints each divergence, then one line
 *   "ops: N, divergences: D"; exits 1 if D > 0. With DIFF_UID=N in the
 *   environment (started as root), both sides run as uid and gid N: the
 *   process by seteuid, the mount by inkfs_set_credentials, so permission
 *   checks (EACCES, EPERM, sticky and set-group-ID rules) are compared
 *   too.
 *
 * Not compared, because they are not the same thing on the two sides:
 * inode numbers, st_dev, st_blocks, a directory's st_size (tmpfs counts
 * entries in its own units), timestamps, the order of readdir. Symbolic
 * link targets are relative and never climb above the top directory: an
 * absolute target means the pool's root to inkfs and "/" to Linux.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inkfs.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <grp.h>
#include <unistd.h>

#define SLOTS 8
#define MAXDATA 12000
#define SHOWN_MAX 40

static inkfs_t *fs;
static const char *base;
static uint64_t rng;
static long op_index, divergences;
static char what[1200]; /* the current operation, for reports */
static int ink_fd[SLOTS], lx_fd[SLOTS];

static uint64_t next(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545F4914F6CDD1DULL;
}
static unsigned pick(unsigned n) { return (unsigned)(next() % n); }

static void diverge(const char *fmt, ...) {
  divergences++;
  if (divergences > SHOWN_MAX)
    return;
  va_list ap;
  va_start(ap, fmt);
  printf("DIVERGENCE op %ld: %s: ", op_index, what);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

typedef struct {
  long rc;
  int err;
} res_t;

#define RUN(expr)                                                              \
  ({                                                                           \
    errno = 0;                                                                 \
    long r_ = (long)(expr);                                                    \
    (res_t){r_, r_ < 0 ? errno : 0};                                           \
  })

static const char *en(int e) { return e ? strerrorname_np(e) : "0"; }

/* Same outcome: both failed with one errno, or both succeeded (with the
 * same value unless only success matters). */
static int same(res_t a, res_t b, int values_matter) {
  int ok = (a.rc < 0) == (b.rc < 0) && a.err == b.err &&
           (!values_matter || a.rc < 0 || a.rc == b.rc);
  if (!ok)
    diverge("inkfs rc=%ld errno=%s, linux rc=%ld errno=%s", a.rc, en(a.err), b.rc, en(b.err));
  return ok;
}

/* ---- paths ---- */

static const char *names[] = {"a", "b", "c", "d", "e"};

static void rand_path(char *p, size_t n) {
  int depth = 1 + pick(3);
  const char *prev = "";
  p[0] = 0;
  for (int i = 0; i < depth; i++) {
    const char *c = names[pick(5)];
    if (i == 1 && strcmp(prev, ".") != 0 && pick(12) == 0)
      c = ".."; /* "x/..": back to the top, never above it */
    else if (i > 0 && pick(25) == 0)
      c = ".";
    snprintf(p + strlen(p), n - strlen(p), "%s%s", i ? "/" : "", c);
    prev = c;
  }
  if (pick(15) == 0)
    snprintf(p + strlen(p), n - strlen(p), "/");
}

/* Never let a path climb above DIR (it would act on DIR's parent): the
 * generator keeps ".." below the top; this checks it. */
static void check_inside(const char *p) {
  int depth = 0;
  char copy[256], *save = NULL;
  snprintf(copy, sizeof copy, "%s", p);
  for (char *c = strtok_r(copy, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
    depth += !strcmp(c, "..") ? -1 : strcmp(c, ".") ? 1 : 0;
    if (depth < 0 || p[0] == '/') {
      fprintf(stderr, "differential: path %s leaves the test directory\n", p);
      abort();
    }
  }
}

static char *lx(const char *p) {
  check_inside(p);
  static char buf[2][4096];
  static int which;
  which ^= 1;
  snprintf(buf[which], sizeof buf[which], "%s/%s", base, p);
  return buf[which];
}

/* ---- stat comparison ---- */

static void cmp_stat(const struct stat *a, const struct stat *b) {
  if (a->st_mode != b->st_mode)
    diverge("st_mode inkfs %o, linux %o", a->st_mode, b->st_mode);
  if (a->st_nlink != b->st_nlink)
    diverge("st_nlink inkfs %lu, linux %lu", (unsigned long)a->st_nlink,
            (unsigned long)b->st_nlink);
  if (!S_ISDIR(a->st_mode) && a->st_size != b->st_size)
    diverge("st_size inkfs %lld, linux %lld", (long long)a->st_size, (long long)b->st_size);
  if (a->st_uid != b->st_uid || a->st_gid != b->st_gid)
    diverge("owner inkfs %u:%u, linux %u:%u", a->st_uid, a->st_gid, b->st_uid, b->st_gid);
}

/* ---- directory listings as sorted sets ---- */

static int cmpstr(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void join_sorted(char **v, int n, char *out, size_t size) {
  qsort(v, n, sizeof *v, cmpstr);
  out[0] = 0;
  for (int i = 0; i < n; i++) {
    snprintf(out + strlen(out), size - strlen(out), "%s%s", i ? "," : "", v[i]);
    free(v[i]);
  }
}

static res_t list_ink(const char *p, char *out, size_t size) {
  inkfs_dir_t *d = inkfs_opendir(fs, p);
  if (!d)
    return (res_t){-1, errno};
  char *v[512];
  int n = 0;
  struct dirent *e;
  while ((e = inkfs_readdir(d)) != NULL && n < 512)
    v[n++] = strdup(e->d_name);
  inkfs_closedir(d);
  join_sorted(v, n, out, size);
  return (res_t){0, 0};
}

static res_t list_lx(const char *p, char *out, size_t size) {
  DIR *d = opendir(p);
  if (!d)
    return (res_t){-1, errno};
  char *v[512];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < 512)
    v[n++] = strdup(e->d_name);
  closedir(d);
  join_sorted(v, n, out, size);
  return (res_t){0, 0};
}

/* ---- the operations ---- */

static unsigned char wbuf[MAXDATA], rbuf_a[MAXDATA], rbuf_b[MAXDATA];

static void fill(size_t len) {
  unsigned char seed = (unsigned char)next();
  for (size_t i = 0; i < len; i++)
    wbuf[i] = (unsigned char)(seed + i * 31);
}

static int open_slot(void) {
  int s = pick(SLOTS);
  return ink_fd[s] >= 0 ? s : -1;
}

static void close_slot(int s) {
  if (ink_fd[s] >= 0)
    inkfs_close(fs, ink_fd[s]);
  if (lx_fd[s] >= 0)
    close(lx_fd[s]);
  ink_fd[s] = lx_fd[s] = -1;
}

static void op_open(void) {
  char p[256];
  rand_path(p, sizeof p);
  static const int acc[] = {O_RDONLY, O_WRONLY, O_RDWR};
  int flags = acc[pick(3)];
  if (pick(2))
    flags |= O_CREAT;
  if (pick(4) == 0)
    flags |= O_EXCL;
  if (pick(5) == 0)
    flags |= O_TRUNC;
  if (pick(4) == 0)
    flags |= O_APPEND;
  if (pick(8) == 0)
    flags |= O_DIRECTORY;
  if (pick(6) == 0)
    flags |= O_NOFOLLOW;
  mode_t mode = pick(2) ? 0644 : 0600;
  snprintf(what, sizeof what, "open(%s, 0%o, 0%o)", p, flags, mode);
  int s = pick(SLOTS);
  close_slot(s);
  res_t a = RUN(inkfs_open(fs, p, flags, mode));
  res_t b = RUN(open(lx(p), flags, mode));
  if (same(a, b, 0) && a.rc >= 0) {
    ink_fd[s] = a.rc;
    lx_fd[s] = b.rc;
  } else {
    if (a.rc >= 0)
      inkfs_close(fs, a.rc);
    if (b.rc >= 0)
      close(b.rc);
  }
}

static void op_dup(void) {
  int s = open_slot(), t = pick(SLOTS);
  if (s < 0 || s == t)
    return;
  snprintf(what, sizeof what, "dup(slot %d) into slot %d", s, t);
  close_slot(t);
  res_t a = RUN(inkfs_dup(fs, ink_fd[s]));
  res_t b = RUN(dup(lx_fd[s]));
  if (same(a, b, 0) && a.rc >= 0) {
    ink_fd[t] = a.rc;
    lx_fd[t] = b.rc;
  }
}

static void op_close(void) {
  int s = open_slot();
  if (s < 0)
    return;
  snprintf(what, sizeof what, "close(slot %d)", s);
  same(RUN(inkfs_close(fs, ink_fd[s])), RUN(close(lx_fd[s])), 1);
  ink_fd[s] = lx_fd[s] = -1;
}

static void op_write(int positioned) {
  int s = open_slot();
  if (s < 0)
    return;
  size_t len = pick(4) ? pick(5000) : pick(MAXDATA);
  off_t off = pick(3) ? pick(20000) : pick(3 * 4096);
  fill(len);
  if (positioned) {
    snprintf(what, sizeof what, "pwrite(slot %d, %zu, %lld)", s, len, (long long)off);
    same(RUN(inkfs_pwrite(fs, ink_fd[s], wbuf, len, off)), RUN(pwrite(lx_fd[s], wbuf, len, off)),
         1);
  } else {
    snprintf(what, sizeof what, "write(slot %d, %zu)", s, len);
    same(RUN(inkfs_write(fs, ink_fd[s], wbuf, len)), RUN(write(lx_fd[s], wbuf, len)), 1);
  }
}

static void op_writev(void) {
  int s = open_slot();
  if (s < 0)
    return;
  size_t l1 = pick(3000), l2 = pick(3000);
  fill(l1 + l2);
  struct iovec iov[2] = {{wbuf, l1}, {wbuf + l1, l2}};
  snprintf(what, sizeof what, "writev(slot %d, %zu+%zu)", s, l1, l2);
  same(RUN(inkfs_writev(fs, ink_fd[s], iov, 2)), RUN(writev(lx_fd[s], iov, 2)), 1);
}

static void op_read(int positioned) {
  int s = open_slot();
  if (s < 0)
    return;
  size_t len = pick(MAXDATA);
  off_t off = pick(24000);
  res_t a, b;
  if (positioned) {
    snprintf(what, sizeof what, "pread(slot %d, %zu, %lld)", s, len, (long long)off);
    a = RUN(inkfs_pread(fs, ink_fd[s], rbuf_a, len, off));
    b = RUN(pread(lx_fd[s], rbuf_b, len, off));
  } else {
    snprintf(what, sizeof what, "read(slot %d, %zu)", s, len);
    a = RUN(inkfs_read(fs, ink_fd[s], rbuf_a, len));
    b = RUN(read(lx_fd[s], rbuf_b, len));
  }
  if (same(a, b, 1) && a.rc > 0 && memcmp(rbuf_a, rbuf_b, a.rc) != 0)
    diverge("data read differs");
}

static void op_readv(void) {
  int s = open_slot();
  if (s < 0)
    return;
  size_t l1 = pick(4000), l2 = pick(4000);
  struct iovec ia[2] = {{rbuf_a, l1}, {rbuf_a + l1, l2}};
  struct iovec ib[2] = {{rbuf_b, l1}, {rbuf_b + l1, l2}};
  snprintf(what, sizeof what, "readv(slot %d, %zu+%zu)", s, l1, l2);
  res_t a = RUN(inkfs_readv(fs, ink_fd[s], ia, 2));
  res_t b = RUN(readv(lx_fd[s], ib, 2));
  if (same(a, b, 1) && a.rc > 0 && memcmp(rbuf_a, rbuf_b, a.rc) != 0)
    diverge("data read differs");
}

/* SEEK_DATA/SEEK_HOLE answers that differ only because inkfs reports as
 * data a range Linux reports as a hole (SEEK_DATA finds data earlier,
 * SEEK_HOLE a hole later): allowed by lseek(2) ("file systems are allowed
 * to report data even for holes") and what fallocate'd ranges give (tmpfs
 * keeps them unwritten, holes to SEEK_DATA; inkfs allocates zeroed blocks,
 * data). Counted and printed, not divergences; the contents are compared
 * by every read and at the end. The converse (inkfs reporting a hole where
 * Linux has data) is a divergence. */
static long zeros_as_data;

static void op_lseek(void) {
  int s = open_slot();
  if (s < 0)
    return;
  static const int wh[] = {SEEK_SET, SEEK_CUR, SEEK_END, SEEK_DATA, SEEK_HOLE};
  int w = wh[pick(5)];
  off_t off = (off_t)pick(20000) - (w == SEEK_SET || w >= SEEK_DATA ? 0 : 5000);
  snprintf(what, sizeof what, "lseek(slot %d, %lld, %d)", s, (long long)off, w);
  off_t was = inkfs_lseek(fs, ink_fd[s], 0, SEEK_CUR);
  res_t a = RUN(inkfs_lseek(fs, ink_fd[s], off, w));
  res_t b = RUN(lseek(lx_fd[s], off, w));
  if (w >= SEEK_DATA && a.rc >= 0 && (a.rc != b.rc || b.rc < 0)) {
    int more_data = w == SEEK_DATA ? b.rc < 0 || a.rc < b.rc : b.rc >= 0 && a.rc > b.rc;
    if (more_data) {
      zeros_as_data++;
      /* Both offsets where Linux left its own. */
      inkfs_lseek(fs, ink_fd[s], b.rc >= 0 ? b.rc : was, SEEK_SET);
      return;
    }
  }
  same(a, b, 1);
}

static void op_ftruncate(void) {
  int s = open_slot();
  if (s < 0)
    return;
  off_t len = pick(16000);
  snprintf(what, sizeof what, "ftruncate(slot %d, %lld)", s, (long long)len);
  same(RUN(inkfs_ftruncate(fs, ink_fd[s], len)), RUN(ftruncate(lx_fd[s], len)), 1);
}

static void op_fallocate(void) {
  int s = open_slot();
  if (s < 0)
    return;
  static const int modes[] = {0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE};
  int mode = modes[pick(3)];
  off_t off = pick(16) * 1024, len = 1 + pick(12000);
  snprintf(what, sizeof what, "fallocate(slot %d, %d, %lld, %lld)", s, mode, (long long)off,
           (long long)len);
  same(RUN(inkfs_fallocate(fs, ink_fd[s], mode, off, len)),
       RUN(fallocate(lx_fd[s], mode, off, len)), 1);
}

static void op_fsync(void) {
  int s = open_slot();
  if (s < 0)
    return;
  snprintf(what, sizeof what, "fsync(slot %d)", s);
  same(RUN(inkfs_fsync(fs, ink_fd[s])), RUN(fsync(lx_fd[s])), 1);
}

static void op_fstat(void) {
  int s = open_slot();
  if (s < 0)
    return;
  struct stat sa, sb;
  snprintf(what, sizeof what, "fstat(slot %d)", s);
  if (same(RUN(inkfs_fstat(fs, ink_fd[s], &sa)), RUN(fstat(lx_fd[s], &sb)), 1) &&
      sa.st_nlink > 0)
    cmp_stat(&sa, &sb);
}

static void op_copy_range(void) {
  int s = open_slot(), t = open_slot();
  if (s < 0 || t < 0)
    return;
  off_t in = pick(12000), out = pick(12000);
  off_t in_b = in, out_b = out;
  size_t len = pick(9000);
  snprintf(what, sizeof what, "copy_file_range(slot %d @%lld, slot %d @%lld, %zu)", s,
           (long long)in, t, (long long)out, len);
  same(RUN(inkfs_copy_file_range(fs, ink_fd[s], &in, ink_fd[t], &out, len, 0)),
       RUN(copy_file_range(lx_fd[s], &in_b, lx_fd[t], &out_b, len, 0)), 1);
}

static void op_truncate(void) {
  char p[256];
  rand_path(p, sizeof p);
  off_t len = pick(16000);
  snprintf(what, sizeof what, "truncate(%s, %lld)", p, (long long)len);
  same(RUN(inkfs_truncate(fs, p, len)), RUN(truncate(lx(p), len)), 1);
}

static void op_unlink(void) {
  char p[256];
  rand_path(p, sizeof p);
  snprintf(what, sizeof what, "unlink(%s)", p);
  same(RUN(inkfs_unlink(fs, p)), RUN(unlink(lx(p))), 1);
}

static void op_mkdir(void) {
  char p[256];
  rand_path(p, sizeof p);
  snprintf(what, sizeof what, "mkdir(%s)", p);
  same(RUN(inkfs_mkdir(fs, p, 0755)), RUN(mkdir(lx(p), 0755)), 1);
}

static void op_rmdir(void) {
  char p[256];
  rand_path(p, sizeof p);
  snprintf(what, sizeof what, "rmdir(%s)", p);
  same(RUN(inkfs_rmdir(fs, p)), RUN(rmdir(lx(p))), 1);
}

static void op_rename(void) {
  char p[256], q[256];
  rand_path(p, sizeof p);
  rand_path(q, sizeof q);
  static const unsigned fl[] = {0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE};
  unsigned flags = fl[pick(4)];
  snprintf(what, sizeof what, "renameat2(%s, %s, %u)", p, q, flags);
  same(RUN(inkfs_renameat2(fs, AT_FDCWD, p, AT_FDCWD, q, flags)),
       RUN(renameat2(AT_FDCWD, lx(p), AT_FDCWD, lx(q), flags)), 1);
}

static void op_link(void) {
  char p[256], q[256];
  rand_path(p, sizeof p);
  rand_path(q, sizeof q);
  snprintf(what, sizeof what, "link(%s, %s)", p, q);
  same(RUN(inkfs_link(fs, p, q)), RUN(link(lx(p), lx(q))), 1);
}

static void op_symlink(void) {
  char p[256], t[256];
  rand_path(p, sizeof p);
  /* Relative targets that stay below the top directory (see the head). */
  snprintf(t, sizeof t, "%s", names[pick(5)]);
  if (pick(3) == 0)
    snprintf(t + strlen(t), sizeof t - strlen(t), "/%s", names[pick(5)]);
  snprintf(what, sizeof what, "symlink(%s, %s)", t, p);
  same(RUN(inkfs_symlink(fs, t, p)), RUN(symlink(t, lx(p))), 1);
}

static void op_readlink(void) {
  char p[256], a[256], b[256];
  rand_path(p, sizeof p);
  snprintf(what, sizeof what, "readlink(%s)", p);
  res_t ra = RUN(inkfs_readlink(fs, p, a, sizeof a));
  res_t rb = RUN(readlink(lx(p), b, sizeof b));
  if (same(ra, rb, 1) && ra.rc > 0 && memcmp(a, b, ra.rc) != 0)
    diverge("targets differ");
}

static void op_stat(void) {
  char p[256];
  rand_path(p, sizeof p);
  int nofollow = pick(2);
  struct stat sa, sb;
  snprintf(what, sizeof what, "%s(%s)", nofollow ? "lstat" : "stat", p);
  res_t a = nofollow ? RUN(inkfs_lstat(fs, p, &sa)) : RUN(inkfs_stat(fs, p, &sa));
  res_t b = nofollow ? RUN(lstat(lx(p), &sb)) : RUN(stat(lx(p), &sb));
  if (same(a, b, 1) && a.rc == 0)
    cmp_stat(&sa, &sb);
}

static void op_readdir(void) {
  char p[256], la[8192], lb[8192];
  rand_path(p, sizeof p);
  if (pick(3) == 0)
    snprintf(p, sizeof p, ".");
  snprintf(what, sizeof what, "readdir(%s)", p);
  res_t a = list_ink(p, la, sizeof la);
  res_t b = list_lx(lx(p), lb, sizeof lb);
  if (same(a, b, 1) && a.rc == 0 && strcmp(la, lb) != 0)
    diverge("listings differ: inkfs {%s}, linux {%s}", la, lb);
}

static void op_chmod(void) {
  char p[256];
  rand_path(p, sizeof p);
  static const mode_t modes[] = {0644, 0600, 0755, 0700, 0444, 01777, 02755};
  mode_t m = modes[pick(7)];
  snprintf(what, sizeof what, "chmod(%s, 0%o)", p, m);
  same(RUN(inkfs_chmod(fs, p, m)), RUN(chmod(lx(p), m)), 1);
}

static void op_access(void) {
  char p[256];
  rand_path(p, sizeof p);
  int mode = pick(8);
  snprintf(what, sizeof what, "access(%s, %d)", p, mode);
  /* AT_EACCESS: access(2) checks the real uid, which DIFF_UID leaves 0;
   * a mount has one set of ids, which both answers use. */
  same(RUN(inkfs_access(fs, p, mode)), RUN(faccessat(AT_FDCWD, lx(p), mode, AT_EACCESS)), 1);
}

static const char *xnames[] = {"user.k0", "user.k1", "user.colour"};

static void op_xattr(void) {
  char p[256];
  rand_path(p, sizeof p);
  const char *n = xnames[pick(3)];
  int nofollow = pick(3) == 0;
  switch (pick(4)) {
  case 0: {
    size_t len = pick(300);
    fill(len);
    static const int fl[] = {0, 0, XATTR_CREATE, XATTR_REPLACE};
    int flags = fl[pick(4)];
    snprintf(what, sizeof what, "%ssetxattr(%s, %s, %zu, %d)", nofollow ? "l" : "", p, n, len,
             flags);
    res_t a = nofollow ? RUN(inkfs_lsetxattr(fs, p, n, wbuf, len, flags))
                       : RUN(inkfs_setxattr(fs, p, n, wbuf, len, flags));
    res_t b = nofollow ? RUN(lsetxattr(lx(p), n, wbuf, len, flags))
                       : RUN(setxattr(lx(p), n, wbuf, len, flags));
    same(a, b, 1);
    break;
  }
  case 1: {
    size_t size = pick(4) == 0 ? 0 : pick(2) ? 400 : pick(50);
    snprintf(what, sizeof what, "getxattr(%s, %s, %zu)", p, n, size);
    res_t a = RUN(inkfs_getxattr(fs, p, n, rbuf_a, size));
    res_t b = RUN(getxattr(lx(p), n, rbuf_b, size));
    if (same(a, b, 1) && size && a.rc > 0 && memcmp(rbuf_a, rbuf_b, a.rc) != 0)
      diverge("values differ");
    break;
  }
  case 2: {
    snprintf(what, sizeof what, "listxattr(%s)", p);
    char la[1024], lb[1024];
    res_t a = RUN(inkfs_listxattr(fs, p, la, sizeof la));
    res_t b = RUN(listxattr(lx(p), lb, sizeof lb));
    if (same(a, b, 1) && a.rc > 0) {
      /* As sorted sets (the order is the file system's). */
      char *va[64], *vb[64];
      int na = 0, nb = 0;
      for (long i = 0; i < a.rc && na < 64; i += strlen(la + i) + 1)
        va[na++] = strdup(la + i);
      for (long i = 0; i < b.rc && nb < 64; i += strlen(lb + i) + 1)
        vb[nb++] = strdup(lb + i);
      char ja[1024], jb[1024];
      join_sorted(va, na, ja, sizeof ja);
      join_sorted(vb, nb, jb, sizeof jb);
      if (strcmp(ja, jb) != 0)
        diverge("xattr lists differ: inkfs {%s}, linux {%s}", ja, jb);
    }
    break;
  }
  default:
    snprintf(what, sizeof what, "removexattr(%s, %s)", p, n);
    same(RUN(inkfs_removexattr(fs, p, n)), RUN(removexattr(lx(p), n)), 1);
  }
}

/* ---- the whole tree, at the end ---- */

static void cmp_tree(const char *p, int depth) {
  char la[8192], lb[8192];
  snprintf(what, sizeof what, "final tree: listing of %s", p);
  res_t a = list_ink(p, la, sizeof la), b = list_lx(lx(p), lb, sizeof lb);
  if (!same(a, b, 1) || a.rc < 0)
    return;
  if (strcmp(la, lb) != 0) {
    diverge("listings differ: inkfs {%s}, linux {%s}", la, lb);
    return;
  }
  char *save = NULL;
  for (char *n = strtok_r(la, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
    if (!strcmp(n, ".") || !strcmp(n, ".."))
      continue;
    char q[512];
    snprintf(q, sizeof q, "%s/%s", p, n);
    struct stat sa, sb;
    snprintf(what, sizeof what, "final tree: lstat %s", q);
    res_t ra = RUN(inkfs_lstat(fs, q, &sa)), rb = RUN(lstat(lx(q), &sb));
    if (!same(ra, rb, 1) || ra.rc < 0)
      continue;
    cmp_stat(&sa, &sb);
    if (S_ISREG(sa.st_mode) && S_ISREG(sb.st_mode)) {
      int fa = inkfs_open(fs, q, O_RDONLY, 0), fb = open(lx(q), O_RDONLY);
      static unsigned char da[1 << 20], db[1 << 20];
      ssize_t na = inkfs_pread(fs, fa, da, sizeof da, 0), nb = pread(fb, db, sizeof db, 0);
      if (na != nb || (na > 0 && memcmp(da, db, na) != 0))
        diverge("contents differ (%zd bytes, %zd bytes)", na, nb);
      inkfs_close(fs, fa);
      close(fb);
    } else if (S_ISLNK(sa.st_mode)) {
      char ta[256] = {0}, tb[256] = {0};
      inkfs_readlink(fs, q, ta, sizeof ta - 1);
      if (readlink(lx(q), tb, sizeof tb - 1) < 0 || strcmp(ta, tb) != 0)
        diverge("link targets differ: %s, %s", ta, tb);
    } else if (S_ISDIR(sa.st_mode) && depth < 6) {
      cmp_tree(q, depth + 1);
    }
  }
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s POOL DIR SEED OPS\n", argv[0]);
    return 2;
  }
  base = argv[2];
  rng = strtoull(argv[3], NULL, 0) * 2654435761u + 1;
  long ops = strtol(argv[4], NULL, 0);
  umask(022);
  chmod(base, 0755); /* as the pool's root (mktemp -d makes it 0700) */
  if (inkfs_mkfs(argv[1], 64 << 20, 2) < 0 || !(fs = inkfs_mount(argv[1], NULL))) {
    fprintf(stderr, "mkfs/mount %s: %s (%s)\n", argv[1], strerror(errno), inkfs_last_error());
    return 2;
  }
  for (int i = 0; i < SLOTS; i++)
    ink_fd[i] = lx_fd[i] = -1;
  const char *uid_s = getenv("DIFF_UID");
  if (uid_s) {
    uid_t id = (uid_t)strtoul(uid_s, NULL, 0);
    if (inkfs_chown(fs, ".", id, id) < 0 || chown(base, id, id) < 0 ||
        inkfs_set_credentials(fs, id, id, 0, NULL) < 0 || setgroups(0, NULL) < 0 ||
        setegid(id) < 0 || seteuid(id) < 0) {
      fprintf(stderr, "becoming uid %u: %s\n", id, strerror(errno));
      return 2;
    }
  }
  /* DIFF_CHECK_EVERY=1: compare the whole tree after every operation and
   * stop at the first divergence (to find the operation that caused it). */
  int check_every = getenv("DIFF_CHECK_EVERY") != NULL;
  for (op_index = 0; op_index < ops; op_index++) {
    if (check_every) {
      long before = divergences;
      char saved[sizeof what];
      memcpy(saved, what, sizeof what);
      cmp_tree(".", 0);
      if (divergences > before) {
        printf("after: %s\n", saved);
        break;
      }
    }
    switch (pick(30)) {
    case 0: case 1: case 2: op_open(); break;
    case 3: op_close(); break;
    case 4: op_dup(); break;
    case 5: case 6: op_write(0); break;
    case 7: op_write(1); break;
    case 8: op_writev(); break;
    case 9: op_read(0); break;
    case 10: op_read(1); break;
    case 11: op_readv(); break;
    case 12: op_lseek(); break;
    case 13: op_ftruncate(); break;
    case 14: op_truncate(); break;
    case 15: op_unlink(); break;
    case 16: op_mkdir(); break;
    case 17: op_rmdir(); break;
    case 18: op_rename(); break;
    case 19: op_link(); break;
    case 20: op_symlink(); break;
    case 21: op_readlink(); break;
    case 22: case 23: op_stat(); break;
    case 24: op_readdir(); break;
    case 25: op_xattr(); break;
    case 26: op_chmod(); break;
    case 27: op_access(); break;
    case 28: op_fallocate(); op_fsync(); break;
    default: op_fstat(); op_copy_range(); break;
    }
  }
  for (int i = 0; i < SLOTS; i++)
    close_slot(i);
  if (uid_s && (seteuid(0) < 0 || setegid(0) < 0 || inkfs_set_credentials(fs, 0, 0, 0, NULL) < 0)) {
    fprintf(stderr, "back to root: %s\n", strerror(errno));
    return 2;
  }
  cmp_tree(".", 0); /* as root: every file readable */
  if (inkfs_unmount(fs) < 0) {
    printf("unmount: %s\n", strerror(errno));
    divergences++;
  }
  printf("SEEK_DATA/SEEK_HOLE zero ranges inkfs reports as data, Linux as holes: %ld\n",
         zeros_as_data);
  printf("ops: %ld, divergences: %ld\n", ops, divergences);
  return divergences ? 1 : 0;
}
