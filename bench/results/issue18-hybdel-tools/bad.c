#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long pg = sysconf(_SC_PAGESIZE);
    char *m = mmap(0, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + pg, pg, PROT_NONE)) { perror("mmap"); return 1; }
    memset(m, 'x', pg);
    char *bad = m + pg - 100; /* 100 bytes mapped, then PROT_NONE */
    const char *ops[] = {"write", "pwrite", "pread"};
    for (int k = 0; k < 3; k++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
            if (fd < 0) { perror(argv[1]); _exit(2); }
            char page[4096];
            memset(page, 'y', sizeof page);
            for (int i = 0; i < 4; i++)
                if (pwrite(fd, page, sizeof page, i * 4096) != 4096) { perror("fill"); _exit(2); }
            ssize_t r;
            errno = 0;
            if (k == 0) r = write(fd, bad, 4096);
            else if (k == 1) r = pwrite(fd, bad, 4096, 8192);
            else r = pread(fd, bad, 4096, 0);
            printf("%s %zd %d\n", ops[k], r, r < 0 ? errno : 0);
            fflush(stdout);
            _exit(0);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 1; }
        if (WIFSIGNALED(st)) printf("%s signal %d\n", ops[k], WTERMSIG(st));
        else if (WEXITSTATUS(st)) printf("%s exit %d\n", ops[k], WEXITSTATUS(st));
    }
    return 0;
}
