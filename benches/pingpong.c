/* The floor under a 2-rank small all-reduce on this host: two processes pinned to cores 0 and
 * 1 each write a sequence number into their own 64-byte line of shared memory (a ring of 64
 * lines) and spin until the other's line shows the same number, as a 2-rank recursive
 * doubling does once per call. Prints nanoseconds per exchange: the time for one cache line
 * to cross between the two cores and back, with no library around it.
 *   cc -O2 -o /tmp/pingpong benches/pingpong.c && /tmp/pingpong 2000000 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINES 64
#define WARMUP 1000

typedef struct {
    volatile uint64_t seq;
    volatile uint64_t data[7];
} __attribute__((aligned(64))) line;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 2000000;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || !CPU_ISSET(0, &allowed) ||
        !CPU_ISSET(1, &allowed)) {
        /* Two spinning processes on one core would each wait a time slice per exchange. */
        printf("skipped: needs cores 0 and 1, and this process may not run on both\n");
        return 0;
    }
    line(*rings)[LINES] = mmap(NULL, 2 * LINES * sizeof(line), PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rings == MAP_FAILED || iters <= 0) return 1;
    pid_t child = fork();
    if (child < 0) return 1;
    int me = child == 0;
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(me, &cpus);
    if (sched_setaffinity(0, sizeof cpus, &cpus) != 0) {
        perror("pingpong: cannot pin to cores 0 and 1");
        _exit(1);
    }
    line *mine = rings[me], *theirs = rings[1 - me];
    double start = 0;
    uint64_t sum = 0;
    for (long i = 1; i <= iters + WARMUP; i++) {
        if (i == WARMUP + 1) start = now_ns();
        line *out = &mine[i % LINES], *in = &theirs[i % LINES];
        out->data[0] = (uint64_t)i;
        __atomic_store_n(&out->seq, (uint64_t)i, __ATOMIC_RELEASE);
        while (__atomic_load_n(&in->seq, __ATOMIC_ACQUIRE) != (uint64_t)i) {
        }
        sum += in->data[0];
    }
    double per = (now_ns() - start) / iters;
    if (me == 0) {
        waitpid(child, NULL, 0);
        printf("%.1f ns per exchange (%ld exchanges, cores 0 and 1)\n", per, iters);
    }
    return sum == 0;
}
