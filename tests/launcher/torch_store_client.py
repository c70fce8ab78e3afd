"""A minimal client of torch's TCPStore wire protocol (what torch's env://
rendezvous speaks to the workers' store that shoalrun hosts), so that test
workers reach the store without importing torch (seconds per process).
test_fault_tolerance.py also runs torch's own client once."""
import socket
import struct
import time


class Store:
    def __init__(self, host, port, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((host, int(port)), timeout=timeout)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sock.sendall(struct.pack("<BI", 0, 0x3C85F7CE))  # VALIDATE

    @staticmethod
    def _str(v):
        v = v.encode() if isinstance(v, str) else v
        return struct.pack("<Q", len(v)) + v

    def _key(self, k):
        return self._str("/" + k)  # torch's client puts "/" before every key

    def _recv(self, n):
        b = b""
        while len(b) < n:
            chunk = self.sock.recv(n - len(b))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            b += chunk
        return b

    def set(self, key, value):
        self.sock.sendall(bytes([1]) + self._key(key) + self._str(value))

    def get(self, key, timeout=30.0):
        self.wait([key], timeout)
        self.sock.sendall(bytes([3]) + self._key(key))
        (n,) = struct.unpack("<Q", self._recv(8))
        return self._recv(n)

    def add(self, key, delta):
        self.sock.sendall(bytes([4]) + self._key(key) + struct.pack("<q", delta))
        return struct.unpack("<q", self._recv(8))[0]

    def check(self, keys):
        self.sock.sendall(bytes([5]) + struct.pack("<Q", len(keys)) + b"".join(self._key(k) for k in keys))
        return self._recv(1) == b"\0"

    def wait(self, keys, timeout=30.0):
        """Blocks until every key exists; socket.timeout after `timeout` (the
        connection is then unusable)."""
        self.sock.sendall(bytes([6]) + struct.pack("<Q", len(keys)) + b"".join(self._key(k) for k in keys))
        self.sock.settimeout(timeout)
        try:
            assert self._recv(1) == b"\0"
        finally:
            self.sock.settimeout(None)
