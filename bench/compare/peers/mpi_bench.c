/*
 * mpi_bench.c - nccl-tests style benchmark of MPI collectives, used by
 * bench/compare as a reference peer for shoal.
 *
 * Ops: allreduce (MPI_Allreduce, float32 sum, out of place),
 *      allgather (MPI_Allgather, float32),
 *      broadcast (MPI_Bcast, float32, root 0),
 *      reduce_scatter (MPI_Reduce_scatter_block, float32 sum, out of place).
 *
 * For each size: [warmup iterations] then [iters timed iterations]; each
 * iteration is preceded by an (untimed) MPI_Barrier unless --no-barrier is
 * given, and timed alone with MPI_Wtime. The reported time is the median per
 * rank, then the max of those medians across ranks. The result of the last
 * iteration is checked and the number of wrong elements (summed over ranks)
 * is reported.
 *
 * Output: one JSON object per line per (op, size), printed by rank 0:
 *   {"impl": "...", "op": "allreduce", "bytes": N, "count": C,
 *    "dtype": "float32", "time_us": T, "algbw": A, "busbw": B, "wrong": W,
 *    "iters": I, "warmup": W0, "np": P}
 * bytes: buffer size for allreduce/broadcast, total output size per rank for
 * allgather and total input size per rank for reduce_scatter (as nccl-tests).
 * count = bytes / 4. algbw = bytes / time in GB/s (1e9 B/s). busbw = algbw *
 * factor: allreduce 2(n-1)/n, allgather and reduce_scatter (n-1)/n, broadcast 1.
 *
 * --budget S (seconds, 0 = off): after the first warmup iteration, cut the
 * remaining warmup and the timed iterations so that one size takes about S
 * seconds, keeping at least --min-iters timed iterations. The decision uses
 * the max over ranks, so every rank runs the same number of iterations.
 */
#include <mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op_kind { OP_ALLREDUCE, OP_ALLGATHER, OP_BROADCAST, OP_REDUCE_SCATTER, OP_COUNT };

static const char *op_names[] = {"allreduce", "allgather", "broadcast", "reduce_scatter"};

typedef struct {
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup, min_iters;
    double budget;
    int barrier;
    int touch;
    const char *impl;
    int ops[OP_COUNT];
    int nops;
} options;

static int rank, nranks;

static void die(const char *msg) {
    if (rank == 0) fprintf(stderr, "mpi_bench: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static size_t parse_size(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || v < 0) die("bad size");
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1024.0 * 1024.0; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0') die("bad size suffix");
    return (size_t)v;
}

static void parse_ops(options *o, const char *s) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    o->nops = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int found = -1;
        for (int i = 0; i < OP_COUNT; i++)
            if (strcmp(tok, op_names[i]) == 0) found = i;
        if (strcmp(tok, "all_reduce") == 0) found = OP_ALLREDUCE;
        if (strcmp(tok, "all_gather") == 0) found = OP_ALLGATHER;
        if (found < 0) die("unknown op (allreduce, allgather, broadcast, reduce_scatter)");
        if (o->nops >= OP_COUNT) die("too many ops");
        o->ops[o->nops++] = found;
    }
}

static void usage(void) {
    if (rank == 0)
        fprintf(stderr,
                "usage: mpi_bench [-b MIN] [-e MAX] [-f FACTOR] [--iters N] "
                "[--warmup N]\n"
                "                 [--ops allreduce,allgather,broadcast,reduce_scatter] "
                "[--impl NAME]\n"
                "                 [--budget SECONDS] [--min-iters N] "
                "[--no-barrier] [--touch]\n");
}

static void parse_args(options *o, int argc, char **argv) {
    o->min_bytes = 8;
    o->max_bytes = 256u << 20;
    o->factor = 2.0;
    o->iters = 20;
    o->warmup = 5;
    o->min_iters = 5;
    o->budget = 0.0;
    o->barrier = 1;
    o->touch = 0;
    o->impl = "mpi";
    parse_ops(o, "allreduce,allgather,broadcast");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = (i + 1 < argc) ? argv[i + 1] : NULL;
#define NEEDV() do { if (!v) { usage(); die("missing value"); } i++; } while (0)
        if (!strcmp(a, "-b") || !strcmp(a, "--minbytes")) { NEEDV(); o->min_bytes = parse_size(v); }
        else if (!strcmp(a, "-e") || !strcmp(a, "--maxbytes")) { NEEDV(); o->max_bytes = parse_size(v); }
        else if (!strcmp(a, "-f") || !strcmp(a, "--stepfactor")) { NEEDV(); o->factor = atof(v); }
        else if (!strcmp(a, "--iters") || !strcmp(a, "-n")) { NEEDV(); o->iters = atoi(v); }
        else if (!strcmp(a, "--warmup") || !strcmp(a, "-w")) { NEEDV(); o->warmup = atoi(v); }
        else if (!strcmp(a, "--min-iters")) { NEEDV(); o->min_iters = atoi(v); }
        else if (!strcmp(a, "--budget")) { NEEDV(); o->budget = atof(v); }
        else if (!strcmp(a, "--ops")) { NEEDV(); parse_ops(o, v); }
        else if (!strcmp(a, "--op")) { NEEDV(); parse_ops(o, v); }
        else if (!strcmp(a, "--impl")) { NEEDV(); o->impl = v; }
        else if (!strcmp(a, "--no-barrier")) { o->barrier = 0; }
        else if (!strcmp(a, "--touch")) { o->touch = 1; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); MPI_Finalize(); exit(0); }
        else { usage(); die("unknown argument"); }
#undef NEEDV
    }
    if (o->factor <= 1.0) die("-f must be > 1");
    if (o->iters < 1) o->iters = 1;
    if (o->min_iters < 1) o->min_iters = 1;
    if (o->min_iters > o->iters) o->min_iters = o->iters;
    if (o->warmup < 0) o->warmup = 0;
    if (o->min_bytes < 4) o->min_bytes = 4;
    if (o->max_bytes < o->min_bytes) die("-e must be >= -b");
}

/* Values are small integers, so float32 sums are exact. */
static inline float pattern(size_t i) { return (float)((i % 251) + 1); }
static inline float gather_pattern(int r, size_t i) {
    return (float)(((size_t)r * 131 + i) % 1021);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    float *send, *recv;
    size_t count;      /* elements in the reported buffer (bytes / 4) */
    size_t sendcount;  /* elements per rank block: allgather's input, reduce_scatter's output */
} bufs;

static void prepare(int op, bufs *b) {
    switch (op) {
    case OP_ALLREDUCE:
        for (size_t i = 0; i < b->count; i++) b->send[i] = (float)(rank + 1) * pattern(i);
        for (size_t i = 0; i < b->count; i++) b->recv[i] = -1.0f;
        break;
    case OP_ALLGATHER:
        for (size_t i = 0; i < b->sendcount; i++) b->send[i] = gather_pattern(rank, i);
        for (size_t i = 0; i < b->count; i++) b->recv[i] = -1.0f;
        break;
    case OP_BROADCAST:
        for (size_t i = 0; i < b->count; i++) b->recv[i] = rank == 0 ? pattern(i) : -1.0f;
        break;
    case OP_REDUCE_SCATTER:
        for (size_t i = 0; i < b->count; i++) b->send[i] = (float)(rank + 1) * pattern(i);
        for (size_t i = 0; i < b->sendcount; i++) b->recv[i] = -1.0f;
        break;
    }
}

/* Called before the last (checked) iteration, outside the timed region. */
static void reset_before_check(int op, bufs *b) {
    if (op == OP_BROADCAST && rank != 0)
        for (size_t i = 0; i < b->count; i++) b->recv[i] = -1.0f;
    else if (op != OP_BROADCAST)
        for (size_t i = 0; i < b->count; i++) b->recv[i] = -1.0f;
}

static long long check(int op, const bufs *b) {
    long long wrong = 0;
    switch (op) {
    case OP_ALLREDUCE: {
        const float tri = (float)nranks * (float)(nranks + 1) / 2.0f;
        for (size_t i = 0; i < b->count; i++)
            if (b->recv[i] != tri * pattern(i)) wrong++;
        break;
    }
    case OP_ALLGATHER:
        for (int r = 0; r < nranks; r++)
            for (size_t i = 0; i < b->sendcount; i++)
                if (b->recv[(size_t)r * b->sendcount + i] != gather_pattern(r, i)) wrong++;
        break;
    case OP_BROADCAST:
        for (size_t i = 0; i < b->count; i++)
            if (b->recv[i] != pattern(i)) wrong++;
        break;
    case OP_REDUCE_SCATTER: {
        const float tri = (float)nranks * (float)(nranks + 1) / 2.0f;
        const size_t base = (size_t)rank * b->sendcount;
        for (size_t i = 0; i < b->sendcount; i++)
            if (b->recv[i] != tri * pattern(base + i)) wrong++;
        break;
    }
    }
    return wrong;
}

/* --touch: one store into every cache line of the input (the value it
 * holds) and one load from every line of the output, before the barrier. */
static int touch_bufs;
static volatile unsigned char touch_sink;

static void touch(int op, bufs *b) {
    size_t in = (op == OP_ALLGATHER ? b->sendcount : b->count) * sizeof(float);
    size_t out = (op == OP_REDUCE_SCATTER ? b->sendcount : b->count) * sizeof(float);
    volatile unsigned char *s = (volatile unsigned char *)b->send;
    const volatile unsigned char *r = (const volatile unsigned char *)b->recv;
    unsigned char sum = 0;
    for (size_t i = 0; i < in; i += 64) s[i] = s[i];
    for (size_t i = 0; i < out; i += 64) sum ^= r[i];
    touch_sink = sum;
}

static double run_once(int op, bufs *b, int barrier) {
    if (touch_bufs) touch(op, b);
    if (barrier) MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    switch (op) {
    case OP_ALLREDUCE:
        MPI_Allreduce(b->send, b->recv, (int)b->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case OP_ALLGATHER:
        MPI_Allgather(b->send, (int)b->sendcount, MPI_FLOAT, b->recv, (int)b->sendcount,
                      MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case OP_BROADCAST:
        MPI_Bcast(b->recv, (int)b->count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    case OP_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(b->send, b->recv, (int)b->sendcount, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
        break;
    }
    return MPI_Wtime() - t0;
}

static double max_all(double v) {
    double out;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    options o;
    parse_args(&o, argc, argv);
    touch_bufs = o.touch;

    /* Buffers sized for the largest message, touched once up front. */
    size_t max_count = o.max_bytes / 4 + (size_t)nranks;
    float *send = malloc(max_count * sizeof(float));
    float *recv = malloc(max_count * sizeof(float));
    double *times = malloc((size_t)(o.iters + 1) * sizeof(double));
    if (!send || !recv || !times) die("out of memory");
    memset(send, 0, max_count * sizeof(float));
    memset(recv, 0, max_count * sizeof(float));

    for (int k = 0; k < o.nops; k++) {
        int op = o.ops[k];
        for (double sz = (double)o.min_bytes; sz <= (double)o.max_bytes * 1.000001;
             sz *= o.factor) {
            size_t bytes = (size_t)sz;
            bufs b = {send, recv, 0, 0};
            if (op == OP_ALLGATHER || op == OP_REDUCE_SCATTER) {
                b.sendcount = bytes / 4 / (size_t)nranks;
                if (b.sendcount < 1) b.sendcount = 1;
                b.count = b.sendcount * (size_t)nranks;
            } else {
                b.count = bytes / 4;
                if (b.count < 1) b.count = 1;
                b.sendcount = b.count;
            }
            if (b.count > (size_t)0x7fffffff) die("message too large for int count");
            bytes = b.count * 4;
            prepare(op, &b);

            /* Warmup, possibly shortened by the time budget. */
            int warmup = o.warmup, iters = o.iters;
            double t_est = 0.0;
            if (warmup > 0) {
                t_est = max_all(run_once(op, &b, o.barrier));
                int done = 1;
                if (o.budget > 0.0 && t_est > 0.0) {
                    double cap = floor(0.25 * o.budget / t_est);
                    if (cap < (double)(warmup - 1)) warmup = 1 + (int)cap;
                }
                double best = t_est;
                for (; done < warmup; done++) {
                    double t = run_once(op, &b, o.barrier);
                    if (t < best) best = t;
                }
                t_est = max_all(best);
            }
            if (o.budget > 0.0) {
                if (t_est <= 0.0) t_est = max_all(run_once(op, &b, o.barrier));
                double fit = floor(o.budget / (t_est > 1e-9 ? t_est : 1e-9));
                if (fit < (double)iters) iters = (int)fit;
                if (iters < o.min_iters) iters = o.min_iters;
            }

            for (int it = 0; it < iters; it++) {
                if (it == iters - 1) reset_before_check(op, &b);
                times[it] = run_once(op, &b, o.barrier);
            }
            long long wrong = check(op, &b), wrong_all = 0;
            MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            double med = max_all(median(times, iters));

            if (rank == 0) {
                double n = (double)nranks;
                double f = op == OP_ALLREDUCE ? 2.0 * (n - 1.0) / n
                         : (op == OP_ALLGATHER || op == OP_REDUCE_SCATTER) ? (n - 1.0) / n
                                                                            : 1.0;
                double algbw = med > 0.0 ? (double)bytes / med / 1e9 : 0.0;
                printf("{\"impl\": \"%s\", \"op\": \"%s\", \"bytes\": %zu, \"count\": %zu, "
                       "\"dtype\": \"float32\", \"time_us\": %.3f, \"algbw\": %.6g, "
                       "\"busbw\": %.6g, \"wrong\": %lld, \"iters\": %d, \"warmup\": %d, "
                       "\"np\": %d}\n",
                       o.impl, op_names[op], bytes, b.count, med * 1e6, algbw, algbw * f,
                       wrong_all, iters, warmup, nranks);
                fflush(stdout);
            }
        }
    }
    free(send);
    free(recv);
    free(times);
    MPI_Finalize();
    return 0;
}
