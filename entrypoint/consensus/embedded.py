"""An etcd cluster the job carries itself: its first 3 or 5 members each start one etcd member,
bootstrapped from the roster every node already shares (etcd's static bootstrap: each member is
told the whole initial cluster), so no discovery service is needed. What to run is a pure
function of the roster; starting, waiting and stopping the process is the edge. With a job token,
the cluster is closed to strangers twice over, keyed from the token:
- every port speaks TLS and admits only a certificate signed by the job's CA, whose key every
  node derives from the token (`job_tls`): the members' peer ports, and their client ports,
  where each node of the job presents a certificate of its own;
- etcd's own auth: one user, its password derived from the token, so every node of the job
  knows it and nobody else does."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from entrypoint.consensus.etcd import Etcd, EtcdError, EtcdRefused
from entrypoint.plan.values import host_port

USER = "multinode"  # etcd's user of the job (granted etcd's root role)
SIZES = (5, 3)  # members, the largest that the job's nodes allow; fewer than 3 survive no loss


@dataclass(frozen=True)
class EtcdMember:
    """One member of the embedded cluster: its name, host and two ports."""

    name: str
    host: str
    client_port: int
    peer_port: int
    secure: bool = False  # its ports speak TLS (a job with a token)

    @property
    def client_url(self) -> str:
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{host_port(self.host, self.client_port)}"

    @property
    def peer_url(self) -> str:
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{host_port(self.host, self.peer_port)}"


@dataclass(frozen=True)
class JobTLS:
    """A node's TLS files: the job's CA certificate, the node's own certificate and key (a
    member serves it on both its ports, and every node presents it as etcd's client)."""

    ca: Path
    cert: Path
    key: Path


def cluster_size(nodes: int) -> int:
    """How many of the job's nodes run an etcd member: 5 from 5 nodes, 3 from 3, else 0 (a
    cluster of 1 or 2 survives no member's loss, so node 0's loss would end the job anyway)."""
    return next((size for size in SIZES if nodes >= size), 0)


def members_from(
    hosts: Sequence[str], base_port: int, secure: bool = False
) -> tuple[EtcdMember, ...]:
    """The embedded cluster of a job whose members run on `hosts` (in member order): its first
    `cluster_size` members, member i on ports base_port + 2i (clients) and + 2i + 1 (peers), so
    that members sharing a host (one machine, several nodes) never share a port; `secure`:
    their ports speak TLS."""
    size = cluster_size(len(hosts))
    return tuple(
        EtcdMember(f"m{i}", hosts[i], base_port + 2 * i, base_port + 2 * i + 1, secure)
        for i in range(size)
    )


def chosen(
    entries: Sequence[str], base_port: int, secure: bool = False
) -> tuple[tuple[int, ...], tuple[EtcdMember, ...]]:
    """Node 0's choice in its `go` ("MEMBER=HOST", in the cluster's order): the job's members
    that run one, and the cluster."""
    members = tuple(int(e.partition("=")[0]) for e in entries)
    return members, members_from([e.partition("=")[2] for e in entries], base_port, secure)


def base_port(stated: int | None, control_port: int) -> int:
    """The first of the embedded members' ports: ENTRYPOINT_ETCD_PORT, else two above the
    control port (its metrics take the one between), or below it where that would pass 65535."""
    if stated is not None:
        return stated
    span = 2 * max(SIZES)
    return control_port + 2 if control_port + 1 + span <= 65535 else control_port - span - 1


def command(
    binary: str,
    me: EtcdMember,
    cluster: Sequence[EtcdMember],
    data_dir: str,
    job: str,
    anywhere: str = "::",
    tls: JobTLS | None = None,
) -> list[str]:
    """etcd's command line for member `me` of `cluster`, bootstrapped statically; `job` names
    the cluster (etcd's initial-cluster-token), so two jobs' members never mix. A member whose
    host is a name listens on `anywhere` (every address: `any_address()`). With `tls`, both its
    ports admit only a certificate the job's CA signed: its peers', and its clients'."""
    initial = ",".join(f"{m.name}={m.peer_url}" for m in cluster)
    bind = _bind(me.host, anywhere)
    scheme = "https" if me.secure else "http"
    secured = (
        [
            f"--peer-cert-file={tls.cert}",
            f"--peer-key-file={tls.key}",
            f"--peer-trusted-ca-file={tls.ca}",
            "--peer-client-cert-auth",
            f"--cert-file={tls.cert}",
            f"--key-file={tls.key}",
            f"--trusted-ca-file={tls.ca}",
            "--client-cert-auth",
        ]
        if tls is not None
        else []
    )
    return [
        binary,
        f"--name={me.name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={scheme}://{host_port(bind, me.client_port)}",
        f"--advertise-client-urls={me.client_url}",
        f"--listen-peer-urls={scheme}://{host_port(bind, me.peer_port)}",
        f"--initial-advertise-peer-urls={me.peer_url}",
        f"--initial-cluster={initial}",
        "--initial-cluster-state=new",
        f"--initial-cluster-token=multinode-{job}",
        *secured,
    ]


def _bind(host: str, anywhere: str) -> str:
    """An address the member's host is written as, else every address."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return anywhere
    return host


def any_address() -> str:
    """Every address of this host: `::` (both families), or 0.0.0.0 where it has no IPv6."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
    except OSError:
        return "0.0.0.0"
    return "::"


def password(token: str | bytes) -> str:
    """etcd's password of the job's user: derived from the job token, never the token itself
    (etcd stores a hash of it; a reader of etcd's files learns nothing of the token)."""
    key = token.encode() if isinstance(token, str) else token
    return hmac.new(key, b"multinode etcd user", hashlib.sha256).hexdigest()


# The job's CA key as PKCS#8 DER: this prefix, then the 32-byte Ed25519 seed (RFC 8410).
_ED25519_PKCS8 = bytes.fromhex("302e020100300506032b657004220420")
CA_SUBJECT = "/CN=multinode-job-etcd"
_CA_CONFIG = """[ca]
default_ca = job
[job]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = any
unique_subject = no
[any]
organizationName = supplied
organizationalUnitName = optional
[peer]
basicConstraints = CA:FALSE
keyUsage = digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = {names}
"""


def job_tls(directory: Path, token: str | bytes, name: str, hosts: Iterable[str]) -> JobTLS:
    """A node's TLS files in `directory` (emptied first), made with openssl: the job's CA, its
    Ed25519 key derived from the token (every node derives the same, nobody without the token
    can), and the node's certificate `name`, signed by it, for serving and for clients alike.
    It names `hosts`: a member's host and the addresses it reaches the other members from (etcd
    checks a peer's address against its certificate, and a client the host it asked for), and
    no common name (etcd's JSON gateway refuses a client certificate with one once auth is on:
    it would not be the user, the password's token is). The
    CA's key is deleted once it has signed. Valid from 2000 on, so that no node's clock running
    behind another's rejects its certificate. Both pass OpenSSL's strict checks (RFC 5280's
    key usages and key identifiers), which Python 3.13 asks for.

    Raises:
        OSError: openssl is missing or failed (its own words).
    """
    key = token.encode() if isinstance(token, str) else token
    seed = hmac.new(key, b"multinode etcd peer CA", hashlib.sha256).digest()
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    names = list(dict.fromkeys(_san(h) for h in hosts)) or [f"DNS:{name}"]
    (directory / "ca.cnf").write_text(_CA_CONFIG.format(names=", ".join(names)))
    (directory / "index.txt").write_text("")
    (directory / "serial").write_text("01\n")
    (directory / "ca.der").write_bytes(_ED25519_PKCS8 + seed)
    steps = [
        "pkey -inform DER -in ca.der -out ca.key",
        f"req -x509 -new -key ca.key -subj {CA_SUBJECT} -days 36500 -out ca.crt "
        "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign "
        "-addext subjectKeyIdentifier=hash",
        "req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout peer.key "
        f"-subj /O=multinode-job/OU={name} -out peer.csr",
        "ca -batch -config ca.cnf -keyfile ca.key -cert ca.crt -in peer.csr -out peer.crt "
        "-startdate 20000101000000Z -enddate 21000101000000Z -extensions peer -notext",
    ]
    try:
        for step in steps:
            done = subprocess.run(
                ["openssl", *step.split()], cwd=directory, capture_output=True, text=True
            )
            if done.returncode != 0:
                raise OSError(f"openssl {step.split()[0]}: {done.stderr.strip()[-300:]}")
    finally:
        for secret in ("ca.der", "ca.key"):
            (directory / secret).unlink(missing_ok=True)
    return JobTLS(directory / "ca.crt", directory / "peer.crt", directory / "peer.key")


def client_context(tls: JobTLS) -> ssl.SSLContext:
    """What a node of the job speaks to its own etcd with: it trusts only the job's CA, checks
    that the member is the host it asked for, and presents its own certificate."""
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default, on every Python
    context.load_cert_chain(str(tls.cert), str(tls.key))
    return context


def _san(host: str) -> str:
    """A host as a certificate's subjectAltName names it."""
    try:
        return f"IP:{ipaddress.ip_address(host)}"
    except ValueError:
        return f"DNS:{host}"


def sources(cluster: Sequence[EtcdMember], me: EtcdMember) -> list[str]:
    """The addresses this host reaches the other members from (its routes choose them; no
    packet is sent), and its own host's: what its certificate names."""
    found: set[str] = set()
    for other in cluster:
        try:
            for family, _, _, _, where in socket.getaddrinfo(other.host, other.peer_port):
                with socket.socket(family, socket.SOCK_DGRAM) as probe:
                    probe.connect(where)
                    found.add(probe.getsockname()[0])
        except OSError:
            continue  # not resolvable from here yet: its own name covers it
    try:
        found |= {str(a[4][0]) for a in socket.getaddrinfo(me.host, None)}
    except OSError:
        pass
    return sorted(a.partition("%")[0] for a in found)


def binary() -> str | None:
    """The etcd this image carries (docker/Dockerfile), or None."""
    return shutil.which("etcd")


class Embedded:
    """This node's etcd member as a child process."""

    def __init__(
        self,
        me: EtcdMember,
        cluster: Sequence[EtcdMember],
        data_dir: Path,
        job: str,
        log: Path,
        path: str | None = None,
        wrap: Callable[[list[str]], list[str]] = list,
        tls: JobTLS | None = None,
    ) -> None:
        """`wrap`: the command line as started (the entrypoint's: one that dies with it);
        `tls`: its TLS files (`job_tls`)."""
        found = path or binary()
        if not found:
            raise FileNotFoundError(
                "etcd is not installed in this image (apt-get install etcd-server)"
            )
        self.me, self.cluster, self.tls = me, tuple(cluster), tls
        self.argv = wrap(command(found, me, cluster, str(data_dir), job, any_address(), tls))
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_ready(etcd: Etcd, timeout: float) -> None:
    """Block until the cluster answers a read (it has a leader, so a quorum of members is up);
    EtcdError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            etcd.get("/multinode/ready")
            return
        except EtcdRefused as exc:
            if "user name is empty" in str(exc) or "auth" in str(exc).lower():
                return  # it answers, and asks who is asking: auth is on already
            if time.monotonic() > deadline:
                raise
        except EtcdError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def secure(etcd: Etcd, token: str | bytes) -> None:
    """Close the cluster to anyone without the job token: the job's user with the token's
    password and etcd's root role, then etcd's auth on; from then on `etcd` authenticates as
    that user. Run it once by one member (member 0 of the cluster); a second run finds the
    user there and auth on, and only authenticates."""
    secret = password(token)
    try:
        etcd.call("auth/user/add", {"name": USER, "password": secret})
        etcd.call("auth/user/grant", {"user": USER, "role": "root"})
        etcd.call("auth/user/add", {"name": "root", "password": secret})
        etcd.call("auth/user/grant", {"user": "root", "role": "root"})
        etcd.call("auth/enable", {})
    except EtcdRefused as exc:
        if "already exists" not in str(exc) and "user name is empty" not in str(exc):
            raise
    etcd.login(USER, secret)
