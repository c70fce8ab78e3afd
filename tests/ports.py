"""Ports for tests that hand an address to processes they start.

A port the kernel picks with bind(("127.0.0.1", 0)) comes from the ephemeral
range (/proc/sys/net/ipv4/ip_local_port_range), the range every outgoing
connection on the machine also draws its local port from. Between the test
closing its probe socket and a launcher listening there, any connection (a
worker's, another test's, another job's) may take it, and the launcher finds
the port "taken". The ports here come from below that range, where the
kernel never assigns one on its own: only a process that asks for the number
by name can hold it, and each is checked free (bindable) when handed out.
"""
import random
import socket

_RNG = random.SystemRandom()        # processes started together draw differently
_HANDED = set()                     # never the same port twice in one process
_SPAN = 12000                       # ports drawn from [low - span, low)


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port():
    """A port free on 127.0.0.1 now and outside the ephemeral range."""
    low = _ephemeral_low()
    first = max(1024, low - _SPAN)
    if low - first >= 256:
        for _ in range(200):
            port = _RNG.randrange(first, low)
            if port not in _HANDED and _bindable(port):
                _HANDED.add(port)
                return port
    with socket.socket() as s:      # no room below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _HANDED.add(port)
    return port


def free_ports(n):
    """n distinct free ports, sorted."""
    return sorted(free_port() for _ in range(n))
