"""A real etcd on loopback for the tests (Debian's etcd-server: `.ci/run` installs it), and a TCP
relay in front of it that a test can cut, as a network cut would."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from entrypoint.consensus.embedded import USER, JobTLS, client_context, job_tls, password, secure
from entrypoint.consensus.etcd import Etcd
from tests.unit.ports import free_ports


class EtcdServer:
    """One etcd member, its client port on 127.0.0.1; with `tls`, that port serves https with its
    certificate and admits only clients with one its CA signed (etcd's --client-cert-auth)."""

    def __init__(self, data: Path, tls: JobTLS | None = None) -> None:
        binary = shutil.which("etcd")
        assert binary, "etcd is not installed: apt-get install etcd-server (.ci/run does)"
        self.port = free_ports(2)
        scheme = "https" if tls else "http"
        client, peer = f"{scheme}://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.port + 1}"
        self.url = client
        secured = (
            [f"--cert-file={tls.cert}", f"--key-file={tls.key}", f"--trusted-ca-file={tls.ca}",
             "--client-cert-auth"]
            if tls else []
        )  # fmt: skip
        self.log = data / "etcd.log"
        self.proc = subprocess.Popen(
            [binary, "--name", "t", "--data-dir", str(data / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"t={peer}", *secured],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return
            except OSError:
                assert self.proc.poll() is None, self.log.read_text()[-2000:]
                time.sleep(0.05)
        raise AssertionError("etcd did not listen within 30 s: " + self.log.read_text()[-2000:])

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


PLATFORM = "the platform's CA, not the job's 0123"  # seeds a CA (embedded.job_tls) and a password


def secured(data: Path) -> tuple[EtcdServer, dict[str, str]]:
    """A real etcd as a platform might give one: https with a certificate the platform's CA
    signed, admitting only clients with one it signed too, its auth on (user `multinode`); and
    the ENTRYPOINT_ETCD* settings a job needs to use it."""
    server = EtcdServer(data, tls=job_tls(data / "server", PLATFORM, "etcd", ["127.0.0.1"]))
    client = job_tls(data / "client", PLATFORM, "trainer", ())
    try:
        secure(Etcd([server.endpoint], tls=client_context(client)), PLATFORM)
    except BaseException:
        server.stop()
        raise
    return server, {
        "ENTRYPOINT_ETCD": server.url,
        "ENTRYPOINT_ETCD_CACERT": str(client.ca),
        "ENTRYPOINT_ETCD_CERT": str(client.cert),
        "ENTRYPOINT_ETCD_KEY": str(client.key),
        "ENTRYPOINT_ETCD_USER": USER,
        "ENTRYPOINT_ETCD_PASSWORD": password(PLATFORM),
    }


class Relay:
    """Forwards a loopback port to etcd's until `cut()`: from then on nothing crosses it either
    way and new connections hang unanswered, as a node cut off the network sees (silence, not
    a refusal)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self.cut_at: float | None = None
        self.hung_up_at: float | None = None
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def cut(self) -> None:
        self.cut_at = time.monotonic()

    def hang_up(self) -> None:
        """Close both ends of every connection across it, and each new one at once: what a node
        sees when the other end's process ends (or a box between them resets the connection)."""
        self.hung_up_at = time.monotonic()
        for sock in self.open:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        while True:
            inner, _ = self.listener.accept()
            if self.hung_up_at is not None:
                inner.close()
                continue
            if self.cut_at is not None:
                self.held.append(inner)  # accepted, never answered
                continue
            try:
                outer = socket.create_connection(self.target, 2)
            except OSError:
                inner.close()
                continue
            outer.settimeout(None)  # a quiet stretch is no cut: only `cut()` stops it
            self.open += [inner, outer]
            for a, b in ((inner, outer), (outer, inner)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.cut_at is None:
                    dst.sendall(data)
        except OSError:
            pass
