/*
 * nsloop DIR N: N back-to-back namespace calls from one thread, as untar
 * and rm -rf make them: mkdir DIR/d, chmod of it, rmdir of it (three ring
 * requests under the library). Prints the mean wall time per call (µs)
 * and the process's context switches (voluntary, involuntary).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: nsloop DIR N\n");
        return 2;
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/nsloop.d", argv[1]);
    long n = atol(argv[2]) / 3;
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        if (mkdir(p, 0755) || chmod(p, 0700) || rmdir(p)) {
            perror(p);
            return 1;
        }
    }
    double t1 = now_ns();
    getrusage(RUSAGE_SELF, &u1);
    printf("us_per_call %.2f vcsw %ld ivcsw %ld\n", (t1 - t0) / 1e3 / (3 * n),
           u1.ru_nvcsw - u0.ru_nvcsw, u1.ru_nivcsw - u0.ru_nivcsw);
    return 0;
}
