#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/<target>/ (committed; run
again after a wire-format change). Each seed is one well-formed or typically
malformed input in the layout the target's header comment describes."""
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent

HELLO_MAGIC, ACCEPT_MAGIC, FRAME_MAGIC, VERSION = 0x53484C48, 0x53484C41, 0x53484C46, 3
JOB = 0x0123456789ABCDEF
TCP, SHM, ARENA = 1, 2, 4  # auth::Link


def hello(job=JOB, rank=0, size=9, to=1, version=VERSION, magic=HELLO_MAGIC, link=TCP, extra=0):
    return struct.pack("<IHBBQIIIIQ", magic, version, link, 0, job, rank, size, to, 0, extra) + bytes(32) + bytes(32)


def accept(link=TCP):
    return struct.pack("<IHBB", ACCEPT_MAGIC, VERSION, link, 0) + bytes(64)


def frame(space, seq, length, step=0, kind=1, magic=FRAME_MAGIC, count=None, payload=True):
    count = length if count is None else count
    fp = struct.pack("<BBBBIQ", 0, 0, 0, 0, 0, count)
    h = struct.pack("<IBBHIIQQ", magic, kind, space, 0, step, 0, seq, length) + fp
    return h + (bytes((i * 7) & 0xFF for i in range(length)) if payload else b"")


def store_frame(body):
    return struct.pack("<I", len(body)) + body


def s(text):
    b = text.encode()
    return struct.pack("<I", len(b)) + b


def write(target, name, data):
    d = HERE / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


# fuzz_handshake: mode byte (bit 7: re-sign; bits 0-2: receiving rank - 1; bits 3-4: the link it
# arrives on: TCP, shared memory, arena), then a Hello [+ Accept].
write("fuzz_handshake", "valid_resigned", bytes([0x80]) + hello())
write("fuzz_handshake", "unsigned", bytes([0x00]) + hello())
write("fuzz_handshake", "other_job", bytes([0x80]) + hello(job=JOB + 1))
write("fuzz_handshake", "bad_rank", bytes([0x81]) + hello(rank=7, to=2))
write("fuzz_handshake", "wrong_target", bytes([0x80]) + hello(to=3))
write("fuzz_handshake", "old_version", bytes([0x80]) + hello(version=2)[:24])
write("fuzz_handshake", "http", bytes([0x00]) + b"GET / HTTP/1.0\r\n\r\n")
write("fuzz_handshake", "with_accept", bytes([0x80]) + hello() + accept())
write("fuzz_handshake", "shm_valid", bytes([0x88]) + hello(link=SHM, extra=1 << 21))
write("fuzz_handshake", "arena_valid", bytes([0x90]) + hello(link=ARENA))
write("fuzz_handshake", "tcp_on_shm", bytes([0x88]) + hello(link=TCP))

# fuzz_tcp_stream: mode (bit 0: a valid handshake first; bit 1: EOF; bit 2: the transport connects),
# plan (receives), then the bytes.
ONE_P2P_64 = 1 | (1 << 2)
ONE_COLL_256 = 1 | (2 << 2)
TWO = 2 | (3 << 2) | (1 << 4)  # a 1 KiB p2p receive (seq 0), a 64-byte p2p one (seq 1)
write("fuzz_tcp_stream", "p2p_match", bytes([1, ONE_P2P_64]) + frame(1, 0, 64))
write("fuzz_tcp_stream", "coll_match", bytes([1, ONE_COLL_256]) + frame(0, 0, 256))
write("fuzz_tcp_stream", "coll_two_frames", bytes([3, ONE_COLL_256]) + frame(0, 0, 256) + frame(0, 0, 256, step=1))
write("fuzz_tcp_stream", "p2p_unexpected_then_match", bytes([1, TWO]) + frame(1, 5, 100) + frame(1, 1, 64) +
      frame(1, 0, 1024))
write("fuzz_tcp_stream", "size_mismatch", bytes([1, ONE_P2P_64]) + frame(1, 0, 65))
write("fuzz_tcp_stream", "fp_mismatch", bytes([1, ONE_COLL_256]) + frame(0, 0, 256, count=3))
write("fuzz_tcp_stream", "later_collective", bytes([1, ONE_COLL_256]) + frame(0, 4, 256))
write("fuzz_tcp_stream", "bad_magic", bytes([1, ONE_P2P_64]) + frame(1, 0, 64, magic=0xDEADBEEF))
write("fuzz_tcp_stream", "bad_kind", bytes([1, ONE_P2P_64]) + frame(1, 0, 64, kind=7))
write("fuzz_tcp_stream", "cut_payload_eof", bytes([3, ONE_P2P_64]) + frame(1, 0, 64)[:80])
write("fuzz_tcp_stream", "huge_p2p", bytes([1, ONE_P2P_64]) + frame(1, 9, 1 << 40, payload=False))
write("fuzz_tcp_stream", "raw_hello_unsigned", bytes([0, ONE_P2P_64]) + hello(job=0xFEED, size=2) + frame(1, 0, 64))
write("fuzz_tcp_stream", "raw_junk", bytes([2, 0]) + b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
# Mode bit 2: the transport connects (rank 0) and reads the target's Accept, then its frames.
write("fuzz_tcp_stream", "connector_p2p_match", bytes([5, ONE_P2P_64]) + frame(1, 0, 64))
write("fuzz_tcp_stream", "connector_coll_eof", bytes([7, ONE_COLL_256]) + frame(0, 0, 256) + frame(0, 1, 8))
write("fuzz_tcp_stream", "connector_unexpected", bytes([5, TWO]) + frame(1, 3, 10) + frame(1, 0, 1024))
write("fuzz_tcp_stream", "connector_raw_accept", bytes([4, ONE_P2P_64]) + accept() + frame(1, 0, 64))
write("fuzz_tcp_stream", "connector_junk_eof", bytes([6, ONE_P2P_64]) + b"SSH-2.0-OpenSSH_9.2\r\n")

# fuzz_store_server: mode (bit 0: server secret; bit 1: valid hello and proof made by the target;
# bits 2-4: chunk size 1 << k), then the connection's bytes.
HELLO_PLACEHOLDER = bytes(40)
PROOF_PLACEHOLDER = bytes(32)
REQUESTS = (store_frame(b"\x01" + s("key") + s("value")) +          # SET
            store_frame(b"\x02" + s("key")) +                         # GET
            store_frame(b"\x03" + s("n") + struct.pack("<q", -5)) +   # ADD
            store_frame(b"\x04" + struct.pack("<I", 2) + s("key") + s("n")) +  # CHECK
            store_frame(b"\x05" + struct.pack("<I", 1) + s("key")) +  # WAIT
            store_frame(b"\x06" + s("key")) +                         # DELETE
            store_frame(b"\x08" + struct.pack("<I", 2) + s("n") + s("n")))  # MULTI_GET
write("fuzz_store_server", "plain_requests", bytes([2 | (5 << 2)]) + HELLO_PLACEHOLDER + REQUESTS)
write("fuzz_store_server", "secret_requests", bytes([3 | (3 << 2)]) + HELLO_PLACEHOLDER + PROOF_PLACEHOLDER + REQUESTS)
write("fuzz_store_server", "secret_bytewise", bytes([3]) + HELLO_PLACEHOLDER + PROOF_PLACEHOLDER +
      store_frame(b"\x01" + s("k") + s("v")))
write("fuzz_store_server", "no_secret_client", bytes([1]) +
      struct.pack("<IHH", 0x43534853, 1, 0) + bytes(32))
write("fuzz_store_server", "forged_proof", bytes([1 | (6 << 2)]) +
      struct.pack("<IHH", 0x43534853, 1, 1) + bytes(32) + bytes(range(32)) + REQUESTS)
write("fuzz_store_server", "bad_frames", bytes([2 | (7 << 2)]) + HELLO_PLACEHOLDER +
      b"\xff\xff\xff\xff" + store_frame(b"\x7f") + store_frame(b"\x04\xff\xff\xff\xff"))
write("fuzz_store_server", "junk", bytes([0]) + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
