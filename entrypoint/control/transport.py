"""The entrypoints' own channel between nodes: JSON lines over TCP to node 0's control port.

Node 0 runs a `Server` (entrypoint.control.control_server: a thread carrying out the pure
`Conductor`'s actions); every node, node 0 included, is a client with a `Channel`
(entrypoint.control.control_channel). This module holds what both sides share: the errors, the line
framing, the open-files limit. `connect` is how a node waits for node 0 in any start order: it
retries name resolution and connection with backoff, prints progress, and gives up after
ENTRYPOINT_JOIN_TIMEOUT with a message naming the address, the port, the time waited and the likely
causes.

Anything that can reach the port can connect (a port scanner, a health probe, a node of another
job), so the server trusts nothing: every line is decoded into a typed message and checked
(entrypoint.control.messages) before the Conductor sees it; a connection counts as a node only after
the handshake (its job identity and, with ENTRYPOINT_JOB_TOKEN, an HMAC over node 0's
challenge); one that sends garbage, a line longer than MAX_LINE, nothing within HELLO_TIMEOUT,
or that is one too many, is dropped and logged with its address, and the job goes on. Writes
never block: what a slow peer cannot take waits in its own buffer, up to a limit.
"""

from __future__ import annotations

import resource

from entrypoint.control import messages as m
from entrypoint.control.identity import Identity
from entrypoint.plan.errors import EXIT_CONFIG, EXIT_PEERS, EntrypointError

PROTOCOL = m.PROTOCOL
MAX_LINE = m.MAX_LINE
NO_IDENTITY = Identity()  # no platform job id, no token


class PeersError(EntrypointError):
    """The master or a peer is unavailable: exit EXIT_PEERS with this one line."""

    exit_code = EXIT_PEERS


class Refused(PeersError):
    """Node 0 refused this node (another job, a wrong token), or node 0 could not prove it
    belongs to this job: a configuration error, exit 2."""

    exit_code = EXIT_CONFIG


class Lines:
    """Split a byte stream into lines, each byte looked at once however it arrives, and at
    most `limit` bytes held for a line not yet complete."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.buffer = bytearray()
        self.limit = limit
        self.scanned = 0  # bytes of `buffer` known to hold no newline

    def feed(self, data: bytes) -> list[bytes]:
        """The complete, non-blank lines; ValueError when a line passes the limit."""
        self.buffer += data
        lines, start = [], 0
        while (end := self.buffer.find(b"\n", max(start, self.scanned))) >= 0:
            if end - start > self.limit:
                raise ValueError(f"a line of more than {self.limit} bytes")
            line = bytes(self.buffer[start:end])
            if line.strip():
                lines.append(line)
            start = end + 1
        if start:
            del self.buffer[:start]
        self.scanned = len(self.buffer)
        if self.scanned > self.limit:
            raise ValueError(f"a line of more than {self.limit} bytes")
        return lines


def raise_open_files_limit() -> int:
    """Node 0 holds a socket per node: lift the soft limit on open files to the hard one
    (often 1024 soft on a bare machine). Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
        except (ValueError, OSError):
            pass
    return soft
