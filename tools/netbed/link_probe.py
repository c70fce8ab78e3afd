"""What the bed's links carry for plain TCP: the reference for "% of the link".

A shaped link's line rate is an upper bound; what TCP gets through it on this machine
can be less (the shaper's timer wakes late on a busy VM, and every "host" shares the
same CPUs for the kernel's copies). `tcp_probe` measures it with plain sockets, no
collective library involved, in one of two patterns:

- one stream, host 0 -> host 1 (what one TCP connection gets one way);
- `streams` connections from every host of a pair to the other at once, in both
  directions (the pattern of a hierarchical allreduce between two hosts: every local
  rank exchanging with its counterpart).

A sender sends nothing before its receiver says, with one byte back, that it is reading;
the receiver divides the bytes it got by the time from that byte to the end of the
stream, so no byte reaches a socket buffer before the clock starts (a receiver that came
late would otherwise count a buffer's worth for free). The result is the mean per
direction (GB/s, 1e9 B/s).
Stdlib only; the worker runs inside the bed's namespaces as the command line's hidden
`_probe-worker` (cli.py).
"""
import json
import os
import socket
import threading
import time

from .bed import CLI, ROOT

CHUNK = 4 << 20
PROBE_PORT = 29650


def _connect(addr, port, deadline):
    # The listener is started by the same job: retry until it is there.
    while True:
        try:
            return socket.create_connection((addr, port), timeout=5)
        except OSError:  # refused, or not routable yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)  # polling for the peer's listen()


def _send_for(sock, seconds):
    if not sock.recv(1):  # the receiver's "reading now"
        raise RuntimeError("the probe's receiver closed before it was ready")
    buf = memoryview(bytearray(CHUNK))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sock.sendall(buf)
    sock.shutdown(socket.SHUT_WR)


def _receive(sock):
    buf = bytearray(CHUNK)
    total = 0
    start = time.monotonic()
    sock.sendall(b"g")  # the sender starts on this byte: nothing is buffered before `start`
    while True:
        n = sock.recv_into(buf)
        if not n:
            break
        total += n
    return total, time.monotonic() - start


def worker(addrs, seconds, both_ways):
    """One rank of the probe job (RANK, GROUP_RANK, LOCAL_RANK from bed.job).

    Host h's local rank j pairs with local rank j of host h ^ 1; host 0 always sends,
    host 1 sends too when both_ways. Prints {"bytes": .., "seconds": ..} of what it
    received (nothing received: bytes 0)."""
    host, j = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
    peer = host ^ 1
    if peer >= len(addrs):
        print(json.dumps({"bytes": 0, "seconds": 0.0}))
        return
    deadline = time.monotonic() + 30
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((addrs[host], PROBE_PORT + j))
    lsock.listen(1)
    sends = host == 0 or both_ways
    receives = host == 1 or both_ways
    out = _connect(addrs[peer], PROBE_PORT + j, deadline) if sends else None
    inc, _ = lsock.accept() if receives else (None, None)
    lsock.close()
    t = threading.Thread(target=_send_for, args=(out, seconds)) if out else None
    if t:
        t.start()
    got, took = _receive(inc) if inc else (0, 0.0)
    if t:
        t.join()
        out.close()
    if inc:
        inc.close()
    print(json.dumps({"bytes": got, "seconds": took}))


def tcp_probe(bed, seconds=2.0, streams=1, both_ways=False, timeout=60.0):
    """GB/s per direction that plain TCP moves between hosts 0 and 1 of the bed.

    streams: connections per direction (one per local rank); both_ways: host 1 sends to
    host 0 at the same time. Returns {"GBps": per direction, "streams", "both_ways",
    "seconds"}; raises on a failed job."""
    argv = CLI + ["_probe-worker", ",".join(bed.addrs[:2]), str(seconds), "1" if both_ways else "0"]
    res = bed.job(argv, per_host=streams, hosts=2, timeout=timeout, cwd=ROOT)
    res.raise_for_status()
    per_dir = {0: [0, 0.0], 1: [0, 0.0]}
    for r in res.ranks:
        d = json.loads(r.stdout.strip().splitlines()[-1])
        if d["bytes"]:
            s = per_dir[r.host]
            s[0] += d["bytes"]
            s[1] = max(s[1], d["seconds"])
    rates = [b / t / 1e9 for b, t in per_dir.values() if b and t > 0]
    if not rates:
        raise RuntimeError("the probe received nothing")
    return {"GBps": sum(rates) / len(rates), "streams": streams, "both_ways": both_ways,
            "seconds": seconds}
