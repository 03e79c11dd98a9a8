// fpcheck: do a thread's vector registers survive system calls, page faults
// and signals? Under gVisor's systrap platform with XSAVEOPT (issue 20) they
// did not: a thread came back from a signal with another thread's zmm and k
// registers. Each worker thread loads a pattern of its own into zmm0-31 and
// k1-k7, makes a system call (or faults, or spins), reads every register
// back and compares; a SIGALRM timer interrupts them all the while, and its
// handler overwrites every vector register.
//
//   fpcheck THREADS ITERATIONS SYSNO SPINS [TIMER_US [FAULTS]]
//
// prints one summary line, "... bad=N", and exits 1 when N > 0. Build:
//   gcc -O2 -pthread -o fpcheck fpcheck.c regs.S
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>

void zcheck(uint64_t seed, long sysno, void *out, long spins, void *page);
#include <sys/mman.h>
static int faults;
void clobber(void);

static long iters, sysno, spins;
static atomic_long bad, sigs;
static int verbose = 3;

static void handler(int s) { (void)s; clobber(); atomic_fetch_add(&sigs, 1); }

static void *worker(void *arg) {
	uint64_t tid = (uintptr_t)arg;
	uint8_t buf[2048 + 64] __attribute__((aligned(64)));
	for (long it = 0; it < iters; it++) {
		uint64_t seed = (tid << 48) ^ (it * 0x9e3779b97f4a7c15ULL);
		memset(buf, 0, sizeof buf);
		void *page = NULL;
		if (faults) page = mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
		zcheck(seed, sysno, buf, spins, page);
		if (page) munmap(page, 4096);
		uint64_t v = seed, inc = 0x0123456789abcdefULL;
		for (int r = 0; r < 32; r++, v += inc) {
			uint64_t *q = (uint64_t *)(buf + 64 * r);
			for (int l = 0; l < 8; l++) if (q[l] != v) {
				if (atomic_fetch_add(&bad, 1) < verbose)
					fprintf(stderr, "thread %lu iter %ld: zmm%d lane %d = %016lx want %016lx\n", tid, it, r, l, q[l], v);
				break;
			}
		}
		for (int k = 1; k < 8; k++, v += inc) {
			uint64_t got = *(uint64_t *)(buf + 2048 + 8 * k);
			if (got != v && atomic_fetch_add(&bad, 1) < verbose)
				fprintf(stderr, "thread %lu iter %ld: k%d = %016lx want %016lx\n", tid, it, k, got, v);
		}
	}
	return NULL;
}

int main(int argc, char **argv) {
	int threads = atoi(argv[1]);
	iters = atol(argv[2]);
	sysno = atol(argv[3]);
	spins = atol(argv[4]);
	long timer_us = argc > 5 ? atol(argv[5]) : 0;
	faults = argc > 6 ? atoi(argv[6]) : 0;
	if (timer_us > 0) {
		struct sigaction sa = {0};
		sa.sa_handler = handler;
		sa.sa_flags = SA_RESTART;
		sigaction(SIGALRM, &sa, NULL);
		struct itimerval tv = {{0, timer_us}, {0, timer_us}};
		setitimer(ITIMER_REAL, &tv, NULL);
	}
	pthread_t t[64];
	for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
	for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
	printf("threads=%d iters=%ld sysno=%ld spins=%ld timer=%ldus signals=%ld bad=%ld\n", threads, iters, sysno, spins, timer_us, (long)sigs, (long)bad);
	return bad != 0;
}
