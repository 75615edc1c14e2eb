/*
 * probe: validate the DAX paths of tests/dax-vm without inkfs.
 *
 * Built on the host with `gcc -O2 -static` and run inside the QEMU guest.
 *
 *   probe rw     PATH [options]   write a pattern, flush, unmap, remap, verify
 *   probe write  PATH [options]   write a pattern and flush (for a reboot test)
 *   probe verify PATH [options]   remap and verify a pattern written earlier
 *
 * options:
 *   --len N        bytes to map (default 4M; K/M/G suffixes)
 *   --offset N     file offset of the mapping (default 0)
 *   --seed N       pattern seed (default 1)
 *   --sync yes|no|any
 *                  yes: MAP_SHARED_VALIDATE|MAP_SYNC must succeed;
 *                  no:  it must fail with EOPNOTSUPP (then fall back to
 *                       MAP_SHARED + msync, like a plain-file backend);
 *                  any: report and fall back if refused (default)
 *   --flush auto|clwb|clflushopt|clflush
 *                  cache-line write-back instruction (default: best by CPUID)
 *
 * A regular file is created and allocated (posix_fallocate) up to
 * offset+len if needed. A device DAX character device is sized from sysfs;
 * its mapping must be aligned to the device alignment (2 MiB by default).
 *
 * Output: lines starting with "probe:"; exit 0 on success, 1 on failure,
 * 2 on usage errors.
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

enum flush { F_NONE, F_CLFLUSH, F_CLFLUSHOPT, F_CLWB };
static const char *flush_name[] = {"none", "clflush", "clflushopt", "clwb"};

static enum flush flush_mode;
static int use_msync; /* fallback mapping: persist with msync instead */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("probe: FAIL: ", stdout);
	vprintf(fmt, ap);
	fputc('\n', stdout);
	va_end(ap);
	fflush(stdout);
	exit(1);
}

static int cpu_has(enum flush f)
{
	unsigned a, b, c, d;
	switch (f) {
	case F_CLFLUSH:
		if (!__get_cpuid(1, &a, &b, &c, &d))
			return 0;
		return (d >> 19) & 1;
	case F_CLFLUSHOPT:
	case F_CLWB:
		if (__get_cpuid_max(0, NULL) < 7)
			return 0;
		__cpuid_count(7, 0, a, b, c, d);
		return (b >> (f == F_CLWB ? 24 : 23)) & 1;
	default:
		return 1;
	}
}

static void flush_range(void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, end = (uintptr_t)p + len;
	for (; a < end; a += 64) {
		switch (flush_mode) {
		case F_CLWB:
			__asm__ volatile("clwb (%0)" ::"r"(a) : "memory");
			break;
		case F_CLFLUSHOPT:
			__asm__ volatile("clflushopt (%0)" ::"r"(a) : "memory");
			break;
		case F_CLFLUSH:
			__asm__ volatile("clflush (%0)" ::"r"(a) : "memory");
			break;
		default:
			break;
		}
	}
	__asm__ volatile("sfence" ::: "memory");
}

static uint64_t mix(uint64_t x)
{ /* splitmix64 finaliser */
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t parse_size(const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s)
		die("bad number '%s'", s);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (*end)
		die("bad number '%s'", s);
	return v;
}

/* Size of a device DAX char device from /sys/dev/char/M:m/size. */
static uint64_t devdax_size(const struct stat *st, uint64_t *align)
{
	char path[128], buf[64];
	uint64_t v = 0;
	FILE *f;
	*align = 2 << 20;
	snprintf(path, sizeof path, "/sys/dev/char/%u:%u/size", major(st->st_rdev), minor(st->st_rdev));
	f = fopen(path, "r");
	if (!f)
		die("%s: %s (is this a device DAX node?)", path, strerror(errno));
	if (fgets(buf, sizeof buf, f))
		v = strtoull(buf, NULL, 0);
	fclose(f);
	snprintf(path, sizeof path, "/sys/dev/char/%u:%u/align", major(st->st_rdev), minor(st->st_rdev));
	f = fopen(path, "r");
	if (f) {
		if (fgets(buf, sizeof buf, f) && strtoull(buf, NULL, 0))
			*align = strtoull(buf, NULL, 0);
		fclose(f);
	}
	return v;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	const char *cmd, *path, *sync_want = "any", *flush_want = "auto";
	uint64_t len = 4 << 20, off = 0, seed = 1, dev_size = 0, align = 4096;
	int fd, is_dev, i;
	struct stat st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 3) {
		fprintf(stderr, "usage: probe rw|write|verify PATH [--len N] [--offset N] [--seed N] "
				"[--sync yes|no|any] [--flush auto|clwb|clflushopt|clflush]\n");
		return 2;
	}
	cmd = argv[1];
	path = argv[2];
	if (strcmp(cmd, "rw") && strcmp(cmd, "write") && strcmp(cmd, "verify")) {
		fprintf(stderr, "probe: unknown command '%s'\n", cmd);
		return 2;
	}
	for (i = 3; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v) {
			fprintf(stderr, "probe: option %s needs a value\n", o);
			return 2;
		}
		if (!strcmp(o, "--len")) len = parse_size(v);
		else if (!strcmp(o, "--offset")) off = parse_size(v);
		else if (!strcmp(o, "--seed")) seed = parse_size(v);
		else if (!strcmp(o, "--sync")) sync_want = v;
		else if (!strcmp(o, "--flush")) flush_want = v;
		else {
			fprintf(stderr, "probe: unknown option %s\n", o);
			return 2;
		}
		i++;
	}
	if (strcmp(sync_want, "yes") && strcmp(sync_want, "no") && strcmp(sync_want, "any")) {
		fprintf(stderr, "probe: --sync takes yes, no or any\n");
		return 2;
	}

	/* Flush instruction: CPUID leaf 7 EBX bit 24 clwb, bit 23 clflushopt;
	 * leaf 1 EDX bit 19 clflush. */
	printf("probe: cpu: clwb=%d clflushopt=%d clflush=%d\n", cpu_has(F_CLWB), cpu_has(F_CLFLUSHOPT),
	       cpu_has(F_CLFLUSH));
	if (!strcmp(flush_want, "auto"))
		flush_mode = cpu_has(F_CLWB) ? F_CLWB : cpu_has(F_CLFLUSHOPT) ? F_CLFLUSHOPT : F_CLFLUSH;
	else if (!strcmp(flush_want, "clwb")) flush_mode = F_CLWB;
	else if (!strcmp(flush_want, "clflushopt")) flush_mode = F_CLFLUSHOPT;
	else if (!strcmp(flush_want, "clflush")) flush_mode = F_CLFLUSH;
	else {
		fprintf(stderr, "probe: --flush takes auto, clwb, clflushopt or clflush\n");
		return 2;
	}
	if (!cpu_has(flush_mode))
		die("CPU lacks %s", flush_name[flush_mode]);

	/* Open (and for regular files create + allocate). */
	fd = open(path, O_RDWR | (strcmp(cmd, "verify") ? O_CREAT : 0), 0644);
	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	if (fstat(fd, &st))
		die("fstat: %s", strerror(errno));
	is_dev = S_ISCHR(st.st_mode);
	if (is_dev) {
		dev_size = devdax_size(&st, &align);
		printf("probe: %s: device DAX char %u:%u, size %" PRIu64 " MiB, align %" PRIu64 " KiB\n", path,
		       major(st.st_rdev), minor(st.st_rdev), dev_size >> 20, align >> 10);
		if (off % align || len % align)
			die("offset/len must be multiples of the device alignment (%" PRIu64 ")", align);
		if (off + len > dev_size)
			die("offset+len beyond device size");
	} else if (S_ISREG(st.st_mode)) {
		if ((uint64_t)st.st_size < off + len) {
			if (!strcmp(cmd, "verify"))
				die("file is %lld bytes, shorter than offset+len", (long long)st.st_size);
			int e = posix_fallocate(fd, 0, off + len);
			if (e)
				die("posix_fallocate: %s", strerror(e));
		}
		printf("probe: %s: regular file, %lld bytes\n", path, (long long)(off + len));
	} else {
		die("%s is neither a regular file nor a character device", path);
	}

	/* The MAP_SYNC attempt: the point of this probe. */
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED_VALIDATE | MAP_SYNC, fd, off);
	if (p == MAP_FAILED) {
		int e = errno;
		printf("probe: mmap MAP_SHARED_VALIDATE|MAP_SYNC: refused: %s (%s)\n",
		       e == EOPNOTSUPP ? "EOPNOTSUPP" : e == EINVAL ? "EINVAL" : "other", strerror(e));
		if (!strcmp(sync_want, "yes"))
			die("MAP_SYNC was required (--sync yes)");
		if (!strcmp(sync_want, "no") && e != EOPNOTSUPP)
			die("expected EOPNOTSUPP, got errno %d", e);
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
		if (p == MAP_FAILED)
			die("fallback mmap MAP_SHARED: %s", strerror(errno));
		use_msync = 1;
		printf("probe: fallback: MAP_SHARED + msync(MS_SYNC)\n");
	} else {
		printf("probe: mmap MAP_SHARED_VALIDATE|MAP_SYNC: ok\n");
		if (!strcmp(sync_want, "no"))
			die("MAP_SYNC succeeded but the file system should not support it (--sync no)");
	}
	const char *method = use_msync ? "msync" : flush_name[flush_mode];
	if (!use_msync && flush_mode != F_CLFLUSH)
		method = flush_mode == F_CLWB ? "clwb+sfence" : "clflushopt+sfence";

	uint64_t *w = p, n = len / 8, salt = mix(seed ^ off);
	if (!strcmp(cmd, "rw") || !strcmp(cmd, "write")) {
		double t0 = now();
		for (uint64_t k = 0; k < n; k++)
			w[k] = mix(salt + k);
		if (use_msync) {
			if (msync(p, len, MS_SYNC))
				die("msync: %s", strerror(errno));
		} else {
			flush_range(p, len);
		}
		printf("probe: wrote %" PRIu64 " KiB pattern seed=%" PRIu64 ", persisted with %s in %.1f ms\n",
		       len >> 10, seed, use_msync ? "msync(MS_SYNC)" : flush_mode == F_CLFLUSH ? "clflush" : method,
		       (now() - t0) * 1e3);
		/* Unmap and map again so the read-back goes through a fresh
		 * mapping (page tables rebuilt from the device / file). */
		if (munmap(p, len))
			die("munmap: %s", strerror(errno));
		p = mmap(NULL, len, PROT_READ, use_msync ? MAP_SHARED : MAP_SHARED_VALIDATE | MAP_SYNC, fd, off);
		if (p == MAP_FAILED)
			die("remap: %s", strerror(errno));
		w = p;
		if (!strcmp(cmd, "write")) {
			uint64_t bad = 0;
			for (uint64_t k = 0; k < n; k++)
				bad += w[k] != mix(salt + k);
			if (bad)
				die("read-back after write: %" PRIu64 " words differ", bad);
			printf("probe: read-back ok\n");
			printf("probe: OK write %s via %s\n", path, use_msync ? "MAP_SHARED+msync" : "MAP_SYNC");
			return 0;
		}
	}
	/* verify (also the second half of rw) */
	uint64_t bad = 0, first = n;
	for (uint64_t k = 0; k < n; k++)
		if (w[k] != mix(salt + k)) {
			if (first == n)
				first = k;
			bad++;
		}
	if (bad)
		die("%" PRIu64 " of %" PRIu64 " words differ (first at byte %" PRIu64 ": %016" PRIx64
		    " != %016" PRIx64 ")",
		    bad, n, first * 8, w[first], mix(salt + first));
	printf("probe: verified %" PRIu64 " KiB pattern seed=%" PRIu64 "\n", len >> 10, seed);
	printf("probe: OK %s %s via %s (flush %s)\n", cmd, path, use_msync ? "MAP_SHARED+msync" : "MAP_SYNC", method);
	munmap(p, len);
	close(fd);
	return 0;
}
