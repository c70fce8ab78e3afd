#!/usr/bin/env python3
"""What plain TCP moves over loopback in a ring: the floor under a
bandwidth-optimal allreduce over TCP on one host.

An allreduce of n bytes over p ranks that is bandwidth-optimal (ring,
direct, Rabenseifner) sends and receives 2 (p-1)/p n bytes per rank. Over
loopback each of those bytes is copied twice by the kernel (into the socket
buffer and out of it) on the same cores as every other rank, with no
reduction and no protocol. This sends exactly that many bytes from every
rank to the next while receiving as many from the previous one, with plain
sockets, and reports the time of the slowest rank per iteration: the time
no TCP allreduce of n bytes on this host can beat by much, against which
shoal-tcp and Gloo (python3 -m bench.compare --impls shoal-tcp,gloo) are read.

  bench/probes/loopback_ring.py --np 4 --bytes 16M [--iters 7]

Stdlib only. Prints one JSON line: {"np", "allreduce_bytes", "bytes_per_rank",
"median_ms", "best_ms"}.
"""
import argparse
import json
import multiprocessing as mp
import socket
import statistics
import threading
import time

PORT = 29870


def _parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def _rank(r, p, nbytes, iters, barrier, results):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", PORT + r))
    listener.listen(1)
    barrier.wait()  # every rank listens before any connects
    out = socket.create_connection(("127.0.0.1", PORT + (r + 1) % p))
    inc, _ = listener.accept()
    listener.close()
    for s in (out, inc):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    send, recv = bytearray(nbytes), bytearray(nbytes)
    view = memoryview(recv)
    times = []
    for _ in range(iters):
        barrier.wait()
        t0 = time.perf_counter()
        sender = threading.Thread(target=out.sendall, args=(send,))
        sender.start()
        got = 0
        while got < nbytes:
            got += inc.recv_into(view[got:], nbytes - got)
        sender.join()
        times.append(time.perf_counter() - t0)
    results.put((r, times))
    out.close()
    inc.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--bytes", default="16M", help="the allreduce's size n (default 16M)")
    ap.add_argument("--iters", type=int, default=7)
    a = ap.parse_args()
    if a.np < 2:
        ap.error("--np must be at least 2")
    n = _parse_size(a.bytes)
    per_rank = 2 * (a.np - 1) * n // a.np
    barrier, results = mp.Barrier(a.np), mp.Queue()
    procs = [mp.Process(target=_rank, args=(r, a.np, per_rank, a.iters, barrier, results)) for r in range(a.np)]
    for p in procs:
        p.start()
    per = [results.get(timeout=300)[1] for _ in procs]
    for p in procs:
        p.join()
    slowest = [max(t[i] for t in per) for i in range(a.iters)]
    print(json.dumps({"np": a.np, "allreduce_bytes": n, "bytes_per_rank": per_rank,
                      "median_ms": round(statistics.median(slowest) * 1e3, 2),
                      "best_ms": round(min(slowest) * 1e3, 2)}))


if __name__ == "__main__":
    main()
