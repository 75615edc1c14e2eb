/* hello.c: libinkfs from C. Makes a pool in /dev/shm, mounts it in this
 * process, and creates, writes, reads, lists, renames and removes files.
 *
 *   cc hello.c $(pkg-config --cflags --libs inkfs) -o hello
 *   ./hello [POOL]        (default /dev/shm/inkfs-hello.pool, removed after)
 */
#include <errno.h>
#include <inkfs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(call)                                                            \
  do {                                                                         \
    if ((call) < 0) {                                                          \
      fprintf(stderr, "hello: %s: %s\n", #call, strerror(errno));              \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  const char *pool = argc > 1 ? argv[1] : "/dev/shm/inkfs-hello.pool";
  unlink(pool);
  if (inkfs_mkfs(pool, 64 << 20, 0) < 0) {
    fprintf(stderr, "hello: mkfs %s: %s (%s)\n", pool, strerror(errno), inkfs_last_error());
    return 1;
  }
  struct inkfs_options opts = {.mode = INKFS_MODE_STRICT};
  inkfs_t *fs = inkfs_mount(pool, &opts);
  if (fs == NULL) {
    fprintf(stderr, "hello: mount %s: %s (%s)\n", pool, strerror(errno), inkfs_last_error());
    return 1;
  }

  CHECK(inkfs_mkdir(fs, "/docs", 0755));
  int fd = inkfs_open(fs, "/docs/hello.txt", O_CREAT | O_RDWR | O_EXCL, 0644);
  CHECK(fd);
  const char msg[] = "hello, persistent world\n";
  CHECK(inkfs_write(fs, fd, msg, strlen(msg))); /* durable on return (strict) */
  CHECK(inkfs_lseek(fs, fd, 0, SEEK_SET));
  char buf[64] = {0};
  ssize_t n = inkfs_read(fs, fd, buf, sizeof buf - 1);
  CHECK(n);
  printf("read back %zd bytes: %s", n, buf);
  CHECK(inkfs_close(fs, fd));

  CHECK(inkfs_rename(fs, "/docs/hello.txt", "/docs/greeting.txt"));
  CHECK(inkfs_symlink(fs, "greeting.txt", "/docs/link"));

  struct stat st;
  CHECK(inkfs_stat(fs, "/docs/link", &st));
  printf("/docs/link -> a %lld-byte file, mode %o\n", (long long)st.st_size,
         (unsigned)st.st_mode & 07777);

  inkfs_dir_t *dir = inkfs_opendir(fs, "/docs");
  if (dir == NULL) {
    perror("hello: opendir");
    return 1;
  }
  struct dirent *e;
  while ((e = inkfs_readdir(dir)) != NULL)
    printf("  %s%s\n", e->d_name, e->d_type == DT_DIR ? "/" : e->d_type == DT_LNK ? "@" : "");
  CHECK(inkfs_closedir(dir));

  CHECK(inkfs_unlink(fs, "/docs/link"));
  CHECK(inkfs_unlink(fs, "/docs/greeting.txt"));
  CHECK(inkfs_rmdir(fs, "/docs"));
  if (inkfs_stat(fs, "/docs", &st) == 0 || errno != ENOENT) {
    fprintf(stderr, "hello: /docs still there after rmdir\n");
    return 1;
  }
  CHECK(inkfs_unmount(fs));
  if (argc <= 1)
    unlink(pool);
  printf("ok\n");
  return 0;
}
