"""TCP over both families: node 0's listener (one dual-stack socket where the host has IPv6),
every address a name resolves to (IPv6 and IPv4 interleaved), a connect that tries them in
turn within a deadline, and a peer's address as people write it."""

from __future__ import annotations

import errno
import ipaddress
import socket
import time

from entrypoint.plan.values import host_port

ANY = "::"  # every address of both families; 0.0.0.0 where the host has no IPv6
ANY_IPV4 = "0.0.0.0"
# What binding :: answers on a host without IPv6 (disabled in the kernel, or no address).
_NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)
ATTEMPT = 2.0  # seconds one address may take before the next is tried (happy eyeballs, simply)
MAX_ADDRESSES = 16  # a name with more addresses is tried on its first ones


def listen(bind: str, port: int, backlog: int = 4096) -> socket.socket:
    """A listening socket on (bind, port). `ANY` means both families: one AF_INET6 socket
    with IPV6_V6ONLY off, or AF_INET 0.0.0.0 where the host has no IPv6. OSError as bind
    raises it."""
    if bind == ANY:
        sock = _dual_stack(port, backlog)
        if sock is not None:
            return sock
        bind = ANY_IPV4
    sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def _dual_stack(port: int, backlog: int) -> socket.socket | None:
    """One socket on :: that IPv4 peers reach too (as ::ffff:a.b.c.d), or None without IPv6."""
    if not socket.has_ipv6:
        return None
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as err:
        if err.errno in _NO_IPV6:
            return None
        raise
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((ANY, port))
        sock.listen(backlog)
    except OSError as err:
        sock.close()
        if err.errno in _NO_IPV6:
            return None
        raise
    return sock


def bare_ip(ip: str) -> str:
    """An address as people write it: an IPv4-mapped IPv6 address as its IPv4 address."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:  # a zone (fe80::1%eth0) or not an address: as given
        return ip
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def peer_text(sockaddr: tuple) -> str:
    """`1.2.3.4:5` or `[fd00::2]:5` for a socket address of either family."""
    return host_port(bare_ip(str(sockaddr[0])), int(sockaddr[1]))


def addresses(host: str, port: int) -> list[tuple[int, tuple]]:
    """(family, socket address) for every address `host` resolves to, in the resolver's order
    (RFC 6724) with the families interleaved from the first one's: fd00::2, 10.0.0.2, fd00::3.
    OSError (socket.gaierror) when the name does not resolve."""
    seen: set[tuple] = set()
    by_family: dict[int, list[tuple[int, tuple]]] = {}
    for family, _, _, _, sockaddr in socket.getaddrinfo(
        host, port, socket.AF_UNSPEC, socket.SOCK_STREAM
    ):
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr not in seen:
            seen.add(sockaddr)
            by_family.setdefault(family, []).append((family, sockaddr))
    lists = list(by_family.values())
    out: list[tuple[int, tuple]] = []
    for i in range(max((len(one) for one in lists), default=0)):
        out.extend(one[i] for one in lists if i < len(one))
    return out[:MAX_ADDRESSES]


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """A connected socket to the first of `host`'s addresses that answers, each tried for at
    most ATTEMPT seconds (the last for what is left), all within `timeout`. The last address's
    OSError when none answers."""
    deadline = time.monotonic() + timeout
    found = addresses(host, port)
    if not found:
        raise OSError(errno.EADDRNOTAVAIL, f"{host} has no IPv4 or IPv6 address")
    last: OSError | None = None
    for i, (family, sockaddr) in enumerate(found):
        left = deadline - time.monotonic()
        if left <= 0 and last is not None:
            break
        wait = max(0.05, left if i == len(found) - 1 else min(ATTEMPT, left))
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(wait)
            sock.connect(sockaddr)
        except OSError as err:
            sock.close()
            last = err
            continue
        sock.settimeout(None)
        return sock
    assert last is not None
    raise last
