// oneccl_bench.cc - nccl-tests style benchmark of oneCCL (C++ API, CPU buffers).
// Same method and output as bench/compare/peers/mpi_bench.c; see oneccl_bench.py.
#include <oneapi/ccl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

enum op_kind { OP_ALLREDUCE, OP_ALLGATHER, OP_BROADCAST, OP_REDUCE_SCATTER, OP_COUNT };
static const char *op_names[] = {"allreduce", "allgather", "broadcast", "reduce_scatter"};

struct options {
    size_t min_bytes = 8, max_bytes = 256u << 20;
    double factor = 2.0;
    int iters = 20, warmup = 5, min_iters = 5;
    double budget = 0.0;
    bool barrier = true;
    bool touch = false;  // before each iteration: rewrite the input, read the output
    std::string impl = "oneccl";
    std::vector<int> ops;
};

static int rank_ = 0, nranks = 1;

// --touch, as mpi_bench.c's: one store into every cache line of the input
// (the value it holds) and one load from every line of the output.
static volatile unsigned char touch_sink;

static void touch(int op, float *send, const float *recv, size_t count, size_t sendcount) {
    size_t in = (op == OP_ALLGATHER ? sendcount : count) * sizeof(float);
    size_t out = (op == OP_REDUCE_SCATTER ? sendcount : count) * sizeof(float);
    volatile unsigned char *s = reinterpret_cast<volatile unsigned char *>(send);
    const volatile unsigned char *r = reinterpret_cast<const volatile unsigned char *>(recv);
    unsigned char sum = 0;
    for (size_t i = 0; i < in; i += 64) s[i] = s[i];
    for (size_t i = 0; i < out; i += 64) sum ^= r[i];
    touch_sink = sum;
}

[[noreturn]] static void die(const std::string &msg) {
    fprintf(stderr, "oneccl_bench[%d]: %s\n", rank_, msg.c_str());
    fflush(stderr);
    _exit(2);
}

static size_t parse_size(const char *s) {
    char *end = nullptr;
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

static void parse_ops(options &o, const std::string &s) {
    o.ops.clear();
    size_t pos = 0;
    while (pos <= s.size()) {
        size_t comma = s.find(',', pos);
        size_t len = comma == std::string::npos ? std::string::npos : comma - pos;
        std::string tok = s.substr(pos, len);
        int found = -1;
        for (int i = 0; i < OP_COUNT; i++)
            if (tok == op_names[i]) found = i;
        if (tok == "all_reduce") found = OP_ALLREDUCE;
        if (tok == "all_gather" || tok == "all_gather_into_tensor") found = OP_ALLGATHER;
        if (tok == "bcast") found = OP_BROADCAST;
        if (tok == "reduce_scatter_tensor") found = OP_REDUCE_SCATTER;
        if (found < 0) die("unknown op " + tok);
        o.ops.push_back(found);
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
}

static void parse_args(options &o, int argc, char **argv) {
    parse_ops(o, "allreduce,allgather,broadcast,reduce_scatter");
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        const char *v = (i + 1 < argc) ? argv[i + 1] : nullptr;
        auto need = [&]() { if (!v) die("missing value for " + a); i++; };
        if (a == "-b" || a == "--minbytes") { need(); o.min_bytes = parse_size(v); }
        else if (a == "-e" || a == "--maxbytes") { need(); o.max_bytes = parse_size(v); }
        else if (a == "-f" || a == "--stepfactor") { need(); o.factor = atof(v); }
        else if (a == "--iters") { need(); o.iters = atoi(v); }
        else if (a == "--warmup") { need(); o.warmup = atoi(v); }
        else if (a == "--min-iters") { need(); o.min_iters = atoi(v); }
        else if (a == "--budget") { need(); o.budget = atof(v); }
        else if (a == "--ops" || a == "--op") { need(); parse_ops(o, v); }
        else if (a == "--impl") { need(); o.impl = v; }
        else if (a == "--no-barrier") { o.barrier = false; }
        else if (a == "--touch") { o.touch = true; }
        else die("unknown argument " + a);
    }
    if (o.factor <= 1.0) die("-f must be > 1");
    o.iters = std::max(1, o.iters);
    o.min_iters = std::max(1, std::min(o.min_iters, o.iters));
    o.warmup = std::max(0, o.warmup);
    o.min_bytes = std::max<size_t>(4, o.min_bytes);
    if (o.max_bytes < o.min_bytes) die("-e must be >= -b");
}

static inline float pattern(size_t i) { return (float)((i % 251) + 1); }
static inline float gather_pattern(int r, size_t i) {
    return (float)(((size_t)r * 131 + i) % 1021);
}

static double now() {
    auto t = std::chrono::steady_clock::now().time_since_epoch();
    return std::chrono::duration<double>(t).count();
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// KVS: rank 0 creates the main KVS and publishes its address in a file that
// the other ranks poll (ONECCL_BENCH_KVS_FILE, set by the launcher).
static ccl::shared_ptr_class<ccl::kvs> make_kvs(const std::string &path, double timeout_s) {
    ccl::kvs::address_type addr;
    if (rank_ == 0) {
        auto kvs = ccl::create_main_kvs();
        addr = kvs->get_address();
        std::string tmp = path + ".tmp";
        FILE *f = fopen(tmp.c_str(), "wb");
        if (!f || fwrite(addr.data(), 1, addr.size(), f) != addr.size() || fclose(f) != 0)
            die("cannot write " + tmp);
        if (rename(tmp.c_str(), path.c_str()) != 0) die("cannot rename " + tmp);
        return kvs;
    }
    double t0 = now();
    for (;;) {
        FILE *f = fopen(path.c_str(), "rb");
        if (f) {
            size_t got = fread(addr.data(), 1, addr.size(), f);
            fclose(f);
            if (got == addr.size()) break;
        }
        if (now() - t0 > timeout_s) die("timed out waiting for " + path);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return ccl::create_kvs(addr);
}

int main(int argc, char **argv) {
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    const char *kf = getenv("ONECCL_BENCH_KVS_FILE");
    if (!r || !w || !kf)
        die("needs RANK, WORLD_SIZE and ONECCL_BENCH_KVS_FILE (run oneccl_bench.py)");
    rank_ = atoi(r);
    nranks = atoi(w);
    options o;
    parse_args(o, argc, argv);
    // oneCCL logs (CCL_WARN, ...) to stdout: keep stdout for the JSON rows only.
    fflush(stdout);
    int json_fd = dup(1);
    FILE *json = json_fd >= 0 ? fdopen(json_fd, "w") : nullptr;
    if (!json || dup2(2, 1) < 0) die("cannot set up stdout");

    ccl::init();
    auto kvs = make_kvs(kf, 300.0);
    auto comm = ccl::create_communicator(nranks, rank_, kvs);
    if (comm.rank() != rank_ || comm.size() != nranks) die("communicator rank/size mismatch");
    if (rank_ == 0) {
        auto ver = ccl::get_library_version();
        fprintf(stderr, "oneccl_bench: oneCCL %s, %d ranks\n", ver.full, nranks);
    }

    auto max_all = [&](double v) {
        double out = 0;
        ccl::allreduce(&v, &out, 1, ccl::datatype::float64, ccl::reduction::max, comm).wait();
        return out;
    };
    auto sum_all = [&](long long v) {
        long long out = 0;
        ccl::allreduce(&v, &out, 1, ccl::datatype::int64, ccl::reduction::sum, comm).wait();
        return out;
    };

    size_t max_count = o.max_bytes / 4 + (size_t)nranks;
    std::vector<float> send(max_count, 0.0f), recv(max_count, 0.0f);
    std::vector<double> times;

    for (int op : o.ops) {
        for (double sz = (double)o.min_bytes; sz <= (double)o.max_bytes * 1.000001;
             sz *= o.factor) {
            size_t bytes = (size_t)sz, count, sendcount;
            if (op == OP_ALLGATHER || op == OP_REDUCE_SCATTER) {
                sendcount = std::max<size_t>(1, bytes / 4 / (size_t)nranks);
                count = sendcount * (size_t)nranks;
            } else {
                count = std::max<size_t>(1, bytes / 4);
                sendcount = count;
            }
            bytes = count * 4;
            float *sb = send.data(), *rb = recv.data();
            // prepare
            switch (op) {
            case OP_ALLREDUCE: case OP_REDUCE_SCATTER:
                for (size_t i = 0; i < count; i++) sb[i] = (float)(rank_ + 1) * pattern(i);
                break;
            case OP_ALLGATHER:
                for (size_t i = 0; i < sendcount; i++) sb[i] = gather_pattern(rank_, i);
                break;
            case OP_BROADCAST:
                for (size_t i = 0; i < count; i++) rb[i] = rank_ == 0 ? pattern(i) : -1.0f;
                break;
            }
            auto run_once = [&]() {
                if (o.touch) touch(op, sb, rb, count, sendcount);
                if (o.barrier) ccl::barrier(comm).wait();
                double t0 = now();
                switch (op) {
                case OP_ALLREDUCE:
                    ccl::allreduce(sb, rb, count, ccl::datatype::float32, ccl::reduction::sum,
                                   comm).wait();
                    break;
                case OP_ALLGATHER:
                    ccl::allgather(sb, rb, sendcount, ccl::datatype::float32, comm).wait();
                    break;
                case OP_BROADCAST:
                    ccl::broadcast(rb, count, ccl::datatype::float32, 0, comm).wait();
                    break;
                case OP_REDUCE_SCATTER:
                    ccl::reduce_scatter(sb, rb, sendcount, ccl::datatype::float32,
                                        ccl::reduction::sum, comm).wait();
                    break;
                }
                return now() - t0;
            };
            int warmup = o.warmup, iters = o.iters;
            double t_est = 0.0;
            if (warmup > 0) {
                t_est = max_all(run_once());
                if (o.budget > 0.0 && t_est > 0.0) {
                    double cap = std::floor(0.25 * o.budget / t_est);
                    if (cap < (double)(warmup - 1)) warmup = 1 + (int)cap;
                }
                double best = t_est;
                for (int done = 1; done < warmup; done++) best = std::min(best, run_once());
                t_est = max_all(best);
            }
            if (o.budget > 0.0) {
                if (t_est <= 0.0) t_est = max_all(run_once());
                double fit = std::floor(o.budget / std::max(t_est, 1e-9));
                if (fit < (double)iters) iters = (int)fit;
                iters = std::max(iters, o.min_iters);
            }
            times.assign((size_t)iters, 0.0);
            for (int it = 0; it < iters; it++) {
                if (it == iters - 1) {  // untimed reset before the checked iteration
                    if (op != OP_BROADCAST || rank_ != 0)
                        for (size_t i = 0; i < count; i++) rb[i] = -1.0f;
                }
                times[(size_t)it] = run_once();
            }
            long long wrong = 0;
            const float tri = (float)nranks * (float)(nranks + 1) / 2.0f;
            switch (op) {
            case OP_ALLREDUCE:
                for (size_t i = 0; i < count; i++) wrong += rb[i] != tri * pattern(i);
                break;
            case OP_ALLGATHER:
                for (int q = 0; q < nranks; q++)
                    for (size_t i = 0; i < sendcount; i++)
                        wrong += rb[(size_t)q * sendcount + i] != gather_pattern(q, i);
                break;
            case OP_BROADCAST:
                for (size_t i = 0; i < count; i++) wrong += rb[i] != pattern(i);
                break;
            case OP_REDUCE_SCATTER:
                for (size_t i = 0; i < sendcount; i++)
                    wrong += rb[i] != tri * pattern((size_t)rank_ * sendcount + i);
                break;
            }
            long long wrong_all = sum_all(wrong);
            double med = max_all(median(times));
            if (rank_ == 0) {
                double n = (double)nranks;
                double f = op == OP_ALLREDUCE ? 2.0 * (n - 1.0) / n
                         : (op == OP_ALLGATHER || op == OP_REDUCE_SCATTER) ? (n - 1.0) / n : 1.0;
                double algbw = med > 0.0 ? (double)bytes / med / 1e9 : 0.0;
                fprintf(json, "{\"impl\": \"%s\", \"op\": \"%s\", \"bytes\": %zu, \"count\": %zu, "
                       "\"dtype\": \"float32\", \"time_us\": %.3f, \"algbw\": %.6g, "
                       "\"busbw\": %.6g, \"wrong\": %lld, \"iters\": %d, \"warmup\": %d, "
                       "\"np\": %d}\n",
                       o.impl.c_str(), op_names[op], bytes, count, med * 1e6, algbw, algbw * f,
                       wrong_all, iters, warmup, nranks);
                fflush(json);
            }
        }
    }
    ccl::barrier(comm).wait();
    if (rank_ == 0) unlink(kf);  // every rank has read it long ago
    fclose(json);
    return 0;
}
