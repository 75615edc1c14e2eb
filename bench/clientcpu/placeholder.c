// bench/clientcpu/placeholder.c: what a placeholder descriptor costs (bench/results-notes/clientcpu.md).
// cc -O2 -o placeholder placeholder.c && flock /tmp/inkfs-timing.lock ./placeholder 200000
// N pairs of (create, close) per kind, ns per pair.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200000, rounds = 5;
    int null = open("/dev/null", O_PATH | O_CLOEXEC);
    int getpid_only = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (int i = 0; i < n; i++) close(fcntl(null, F_DUPFD_CLOEXEC, 3));
        double t1 = now();
        for (int i = 0; i < n; i++) close(open("/dev/null", O_PATH | O_CLOEXEC));
        double t2 = now();
        for (int i = 0; i < n; i++) close(eventfd(0, EFD_CLOEXEC));
        double t3 = now();
        for (int i = 0; i < n; i++) getpid_only += getppid();
        double t4 = now();
        printf("round %d ns/pair: F_DUPFD+close %.0f  open(O_PATH /dev/null)+close %.0f  eventfd+close %.0f  getppid(one syscall) %.0f\n",
               r, (t1 - t0) / n, (t2 - t1) / n, (t3 - t2) / n, (t4 - t3) / n);
    }
    return getpid_only == 42;
}
