/*
 * nsloop DIR N: N back-to-back namespace calls from one thread, as untar
 * and rm -rf make them: mkdir DIR/d, chmod of it, rmdir of it (three ring
 * requests under the library). Prints the mean wall time per call (µs),
 * the thread's run time and run-queue wait per call (µs, from
 * /proc/thread-self/schedstat: the wait is time it was runnable but
 * another task had the CPU) and the context switches (voluntary,
 * involuntary).
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
    if (argc != 3) {
        fprintf(stderr, "usage: nsloop DIR N\n");
        return 2;
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/nsloop.d", argv[1]);
    long n = atol(argv[2]) / 3;
    struct rusage u0, u1;
    double r0, w0, r1, w1;
    getrusage(RUSAGE_SELF, &u0);
    sched(&r0, &w0);
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        if (mkdir(p, 0755) || chmod(p, 0700) || rmdir(p)) {
            perror(p);
            return 1;
        }
    }
    double t1 = now_ns();
    sched(&r1, &w1);
    getrusage(RUSAGE_SELF, &u1);
    double calls = 3.0 * n;
    printf("us_per_call %.2f vcsw %ld ivcsw %ld run_us %.2f runq_us %.2f\n",
           (t1 - t0) / 1e3 / calls, u1.ru_nvcsw - u0.ru_nvcsw, u1.ru_nivcsw - u0.ru_nivcsw,
           (r1 - r0) / 1e3 / calls, (w1 - w0) / 1e3 / calls);
    return 0;
}
