/* hold.c: mount POOL with libinkfs, say "mounted <pid>" on stdout, and
 * keep it mounted until stdin closes (or the process is killed).
 * usage: hold POOL */
#include <errno.h>
#include <inkfs.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  inkfs_t *fs = inkfs_mount(argv[1], NULL);
  if (!fs) {
    printf("failed %s (%s)\n", strerror(errno), inkfs_last_error());
    return 1;
  }
  /* Leave a file open and written, as a live user would. */
  int fd = inkfs_open(fs, "held", O_CREAT | O_WRONLY, 0644);
  if (fd < 0 || inkfs_write(fs, fd, "x", 1) != 1)
    return 1;
  printf("mounted %d\n", (int)getpid());
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0)
    ;
  return inkfs_unmount(fs) == 0 ? 0 : 1;
}
