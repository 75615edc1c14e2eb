/*
 * callbench FILE MODE N: the cost of each call of a durable write loop, as
 * a program sees it (issue 16's per-call profile). Run it on a tmpfs file,
 * and on a file of an inkfs mount under LD_PRELOAD=libinkfs_preload.so,
 * interleaved (bench/percall/run does both).
 *
 * MODE: seq    write(4 KiB) + fdatasync, sequential over a 32 MiB file
 *              laid out first (wrapping: overwrites, as fio's seqwrite)
 *       rand   pwrite(4 KiB) at a random page of that file + fdatasync
 *       app    O_APPEND write(4 KiB) + fdatasync (truncated to 0 every 5000)
 *       app100 the same with 100-byte records (a log: Redis AOF, a WAL)
 *       read   pread(4 KiB) at a random page of the laid-out file
 * N calls are timed after N/10 warm-up calls. Prints the mean per call of
 * the write and of the fdatasync (wall), of the loop (wall), of the
 * process's CPU time (all threads), of the main thread's run time and
 * run-queue wait (/proc/thread-self/schedstat), and the context switches.
 * With CALLBENCH_NO_SPLIT=1 in the environment the write and the fdatasync
 * are not timed one by one (write_ns and sync_ns print as 0): the loop
 * then reads no clock per call, as the engine bench's floor is timed (in
 * batches), and its wall and CPU figures carry none of the three
 * clock_gettime calls (~25 ns each here) the split costs.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum mode { SEQ, RAND, APP, APP100, READ };

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static double cpu_ns(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e9 +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e3;
}

static void sched(double *run, double *wait) {
    unsigned long long a = 0, b = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (f) {
        if (fscanf(f, "%llu %llu", &a, &b) != 2)
            a = b = 0;
        fclose(f);
    }
    *run = a;
    *wait = b;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: callbench FILE seq|rand|app|app100|read N\n");
        return 2;
    }
    const char *modes[] = {"seq", "rand", "app", "app100", "read"};
    int m = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(argv[2], modes[i]))
            m = i;
    long n = atol(argv[3]);
    if (m < 0 || n <= 0) {
        fprintf(stderr, "callbench: bad mode or count\n");
        return 2;
    }
    const long pages = 8192;
    size_t len = m == APP100 ? 100 : 4096;
    int fd = open(argv[1], O_RDWR | O_CREAT | (m == APP || m == APP100 ? O_APPEND : 0), 0644);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    static char buf[4096] __attribute__((aligned(4096)));
    memset(buf, 0x5a, sizeof buf);
    if (m == SEQ || m == RAND || m == READ) {
        struct stat st;
        fstat(fd, &st);
        for (long p = st.st_size / 4096; p < pages; p++)
            if (pwrite(fd, buf, 4096, p * 4096) != 4096) {
                perror("lay out");
                return 1;
            }
    }
    const int split = getenv("CALLBENCH_NO_SPLIT") == NULL;
    unsigned long long x = 88172645463325252ULL;
    double write_ns = 0, sync_ns = 0, c0 = 0, t0 = 0, r0 = 0, w0 = 0;
    long nv0 = 0, ni0 = 0, warm = n / 10;
    for (long i = 0; i < n + warm; i++) {
        if (i == warm) {
            struct rusage u;
            getrusage(RUSAGE_SELF, &u);
            nv0 = u.ru_nvcsw;
            ni0 = u.ru_nivcsw;
            sched(&r0, &w0);
            c0 = cpu_ns();
            t0 = now_ns();
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double a = split ? now_ns() : 0;
        ssize_t r;
        switch (m) {
        case SEQ:
            if (i % pages == 0)
                lseek(fd, 0, SEEK_SET);
            r = write(fd, buf, len);
            break;
        case RAND:
            r = pwrite(fd, buf, len, (x % pages) * 4096);
            break;
        case READ:
            r = pread(fd, buf, len, (x % pages) * 4096);
            break;
        default:
            if (i % 5000 == 4999 && ftruncate(fd, 0) != 0) {
                perror("ftruncate");
                return 1;
            }
            r = write(fd, buf, len);
        }
        double b = split ? now_ns() : 0;
        if (r != (ssize_t)len) {
            fprintf(stderr, "callbench: short %s: %zd\n", argv[2], r);
            return 1;
        }
        if (m != READ && fdatasync(fd) != 0) {
            perror("fdatasync");
            return 1;
        }
        double c = split ? now_ns() : 0;
        if (i >= warm) {
            write_ns += b - a;
            sync_ns += c - b;
        }
    }
    double c1 = cpu_ns(), t1 = now_ns(), r1, w1;
    sched(&r1, &w1);
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    printf("write_ns %.0f sync_ns %.0f wall_ns %.0f cpu_ns %.0f run_ns %.0f rqwait_ns %.0f "
           "vcsw %ld ivcsw %ld\n",
           write_ns / n, sync_ns / n, (t1 - t0) / n, (c1 - c0) / n, (r1 - r0) / n,
           (w1 - w0) / n, u.ru_nvcsw - nv0, u.ru_nivcsw - ni0);
    return 0;
}
