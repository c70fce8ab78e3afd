/* core_rtt: the round trip of one cache line between two CPUs, for each pair
 * (the first CPU this process may run on, every other one).
 *
 *     core_rtt [--rounds N]
 *
 * Two threads, each pinned to one CPU of the pair, pass a counter back and
 * forth N times (default 20000); the time per round trip is what a
 * shared-memory collective pays for each arrival, and it is also what a core
 * pays per line when it reads data the other core has just written. On a VM
 * it moves with the host's placement of the virtual CPUs: sharing a last-level
 * cache, tens of nanoseconds; on different core complexes or sockets, several
 * times more. bench/compare runs it before every process start and reports it
 * beside the times. Prints one JSON line: {"pairs": [[a, b, ns], ...],
 * "max_ns": ..., "min_ns": ...}.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Alignas(64) atomic_long turn;
static long rounds = 20000;

static int pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *answer(void *arg) {
    if (pin(*(int *)arg) != 0) {
        atomic_store(&turn, -1); /* tells the other side to give up */
        return (void *)1;
    }
    for (long i = 0; i < rounds; i++) {
        while (atomic_load_explicit(&turn, memory_order_acquire) != 2 * i + 1) {
        }
        atomic_store_explicit(&turn, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* ns per round trip between cpus a and b; < 0 if a thread cannot be pinned */
static double round_trip(int a, int b) {
    if (pin(a) != 0) return -1;
    atomic_store(&turn, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, answer, &b) != 0) return -1;
    double t0 = now();
    int ok = 1;
    for (long i = 0; ok && i < rounds; i++) {
        if (i == rounds / 10) t0 = now(); /* the first tenth warms up */
        long want = 2 * i + 2, got;
        /* the answer may have given up before this store: keep its -1 */
        long expect = 2 * i;
        if (!atomic_compare_exchange_strong(&turn, &expect, 2 * i + 1)) break;
        while ((got = atomic_load_explicit(&turn, memory_order_acquire)) != want) {
            if (got < 0) {
                ok = 0;
                break;
            }
        }
    }
    double dt = now() - t0;
    void *r;
    pthread_join(t, &r);
    if (!ok || r != NULL) return -1;
    return dt / (rounds - rounds / 10) * 1e9;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            rounds = atol(argv[++i]);
        } else {
            fprintf(stderr, "usage: core_rtt [--rounds N]\n");
            return 2;
        }
    }
    if (rounds < 10) rounds = 10;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        perror("core_rtt: sched_getaffinity");
        return 1;
    }
    int first = -1, n = 0;
    double lo = 0, hi = 0;
    printf("{\"pairs\": [");
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &allowed)) continue;
        if (first < 0) {
            first = c;
            continue;
        }
        double ns = round_trip(first, c);
        if (ns < 0) continue;
        printf("%s[%d, %d, %.1f]", n ? ", " : "", first, c, ns);
        lo = n == 0 || ns < lo ? ns : lo;
        hi = ns > hi ? ns : hi;
        n++;
    }
    printf("], \"max_ns\": %.1f, \"min_ns\": %.1f}\n", hi, lo);
    return n ? 0 : 1;
}
