"""etcd's v3 API through its JSON gateway (`/v3/kv/range`, `/v3/kv/txn`, `/v3/lease/grant`...):
the few calls the job's state and node 0's election need, over HTTP or HTTPS (a client
certificate, etcd's auth) on the standard library. No election or replication is written here:
etcd's Raft does both; this module only asks it. A call that no endpoint answers within its
deadline raises `EtcdUnreachable`; one that etcd refuses raises `EtcdRefused` with etcd's own
words."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

TIMEOUT = 2.0  # seconds one request may take on one endpoint before the next is tried
# etcd checks a password with bcrypt, whose CPU a loaded node's etcd may take seconds to find
# (2 s timed out beside stress-ng and 4 test processes on 2 cores)
AUTH_TIMEOUT = 8.0
NOT_FOUND = 5  # gRPC's NOT_FOUND: etcd's "requested lease not found"
# etcd's refusals while it has no leader, which pass once it elects one (etcdserver/errors.go)
TRANSIENT = ("leader changed", "no leader", "request timed out", "too many requests")
# etcd's refusals of a call whose token it dropped (its simple tokens end after 5 idle
# minutes), or that carried none yet (`credentials`, before auth was on): "permission denied"
# where a client certificate came instead (the job's own etcd's, whose certificates name no
# user). The job's user holds etcd's root role: nothing else is denied to it.
UNTOKENED = ("invalid auth token", "user name is empty", "permission denied")
REELECTION = 5.0  # seconds a refusal of TRANSIENT is asked again (etcd elects within 1 to 2 s)


class EtcdError(Exception):
    """etcd could not do what was asked."""


class EtcdUnreachable(EtcdError):
    """No endpoint answered in time."""


class EtcdRefused(EtcdError):
    """etcd answered with an error (its message is the exception's)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Value:
    """A key's value as etcd holds it: the bytes, the revision that created the key (unique and
    growing: a fencing token) and the one that last changed it, and its lease (0: none)."""

    data: bytes
    created: int
    modified: int
    lease: int = 0

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass(frozen=True)
class Change:
    """One change a watch saw: "PUT" or "DELETE" of the key, at its revision."""

    kind: str
    key: bytes
    revision: int


def range_end(prefix: str) -> bytes:
    """The end of etcd's range of every key that starts with `prefix` (its last byte plus 1)."""
    data = prefix.encode()
    return data[:-1] + bytes([data[-1] + 1])


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _value(kv: dict[str, Any]) -> Value:
    return Value(
        data=base64.b64decode(kv.get("value", "")),
        created=int(kv.get("create_revision", 0)),
        modified=int(kv.get("mod_revision", 0)),
        lease=int(kv.get("lease", 0)),
    )


class Etcd:
    """A client of one etcd cluster's JSON gateway: its endpoints tried in turn, the one that
    answered last tried first."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        timeout: float = TIMEOUT,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """`tls`: speak HTTPS with it (its trusted CAs, and the certificate this client shows)."""
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.tls = tls
        self.token = ""  # etcd's auth token, once `login` has one
        self._credentials: tuple[str, str] | None = None

    def call(
        self,
        path: str,
        body: dict[str, Any],
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """POST body to /v3/<path> on the first endpoint that answers; its JSON answer. While
        etcd elects its own leader (a member was lost) it refuses for a second or two: asked
        again until REELECTION has passed. `deadline` (time.monotonic()): nothing is tried
        after it, no endpoint and no second ask (a lease's fence must not wait on them)."""
        end = time.monotonic() + REELECTION
        if deadline is not None:
            end = min(end, deadline)
        authenticated = False
        while True:
            try:
                return self._call(path, body, timeout, deadline)
            except EtcdRefused as exc:
                stale = self._credentials is not None and any(x in str(exc) for x in UNTOKENED)
                if stale and not authenticated:
                    self._authenticate()
                    authenticated = True
                elif not any(x in str(exc) for x in TRANSIENT) or time.monotonic() > end:
                    raise
                else:
                    time.sleep(0.1)

    def _call(
        self, path: str, body: dict[str, Any], timeout: float | None, deadline: float | None
    ) -> dict[str, Any]:
        last: Exception | None = None
        for host, port in list(self.endpoints):
            wait = timeout or self.timeout
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    break
            try:
                answer = self._post(host, port, path, body, wait)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                last = exc
                continue
            if (host, port) != self.endpoints[0]:  # the one that answered goes first next time
                self.endpoints.remove((host, port))
                self.endpoints.insert(0, (host, port))
            if "error" in answer or ("code" in answer and "message" in answer):
                raise EtcdRefused(
                    str(answer.get("message") or answer.get("error")), int(answer.get("code", 0))
                )
            return answer
        where = ", ".join(f"{h}:{p}" for h, p in self.endpoints)
        raise EtcdUnreachable(f"no etcd endpoint answered /v3/{path} ({where}): {last}")

    def _connection(self, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
        if self.tls is not None:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self.tls)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = self.token
        return headers

    def _post(self, host: str, port: int, path: str, body: dict[str, Any], timeout: float) -> Any:
        conn = self._connection(host, port, timeout)
        try:
            conn.request("POST", f"/v3/{path}", json.dumps(body), self._headers())
            response = conn.getresponse()
            text = response.read()
            try:
                return json.loads(text or b"{}")
            except ValueError:  # not etcd's gateway, or its refusal in words
                said = text[:200].decode(errors="replace").strip()
                raise ValueError(f"HTTP {response.status}, not etcd's JSON: {said!r}") from None
        finally:
            conn.close()

    # -- auth -----------------------------------------------------------------------------

    def login(self, user: str, password: str) -> None:
        """etcd's auth: every later call carries the token etcd gives this user, and asks for a
        new one when etcd has dropped it (a simple token ends after 5 idle minutes)."""
        self._credentials = (user, password)
        self._authenticate()

    def credentials(self, user: str, password: str) -> None:
        """As `login`, later: the first call etcd refuses for want of a user logs in (a cluster
        whose auth another member turns on)."""
        self._credentials = (user, password)

    def _authenticate(self) -> None:
        user, password = self._credentials or ("", "")
        self.token = ""
        answer = self.call(
            "auth/authenticate", {"name": user, "password": password}, timeout=AUTH_TIMEOUT
        )
        self.token = str(answer["token"])

    # -- keys -----------------------------------------------------------------------------

    def get(self, key: str) -> Value | None:
        kvs = self.call("kv/range", {"key": _b64(key)}).get("kvs") or []
        return _value(kvs[0]) if kvs else None

    def put(self, key: str, data: bytes | str, lease: int = 0) -> int:
        """Set key; the revision it made."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(data)}
        if lease:
            body["lease"] = str(lease)
        return int(self.call("kv/put", body)["header"]["revision"])

    def delete(self, key: str, prefix: bool = False) -> int:
        """Remove key (nothing if absent), or every key under it if `prefix`; the revision of
        etcd's answer."""
        body = {"key": _b64(key)} | ({"range_end": _b64(range_end(key))} if prefix else {})
        return int(self.call("kv/deleterange", body)["header"]["revision"])

    def keys(self, prefix: str) -> list[bytes]:
        """The names of the keys under `prefix` (their values left out)."""
        body = {"key": _b64(prefix), "range_end": _b64(range_end(prefix)), "keys_only": True}
        return [base64.b64decode(kv["key"]) for kv in self.call("kv/range", body).get("kvs") or []]

    def create(self, key: str, data: bytes | str, lease: int = 0) -> tuple[bool, Value | None]:
        """Set key only if it does not exist (one transaction: its create revision is 0). (True,
        the new value) if this call created it; (False, the value that was there) if not."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(data)}
        if lease:
            put["lease"] = str(lease)
        return self._txn(
            [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            put,
            key,
        )

    def put_if(self, key: str, data: bytes | str, guard: str, created: int) -> bool:
        """Set key only while the key `guard` still exists with that create revision (the
        writer's term as node 0, say): one transaction. False if guard is gone or newer."""
        put = {"key": _b64(key), "value": _b64(data)}
        compare = [
            {
                "key": _b64(guard),
                "result": "EQUAL",
                "target": "CREATE",
                "create_revision": str(created),
            }
        ]
        return self._txn(compare, put, key)[0]

    def _txn(
        self, compare: list[dict[str, Any]], put: dict[str, Any], key: str
    ) -> tuple[bool, Value | None]:
        answer = self.call(
            "kv/txn",
            {
                "compare": compare,
                "success": [{"request_put": put}, {"request_range": {"key": _b64(key)}}],
                "failure": [{"request_range": {"key": _b64(key)}}],
            },
        )
        ranges = [r["response_range"] for r in answer.get("responses", []) if "response_range" in r]
        kvs = (ranges[-1].get("kvs") or []) if ranges else []
        return bool(answer.get("succeeded")), (_value(kvs[0]) if kvs else None)

    # -- leases ---------------------------------------------------------------------------

    def grant(self, ttl: int) -> int:
        """A new lease of ttl seconds; its ID."""
        return int(self.call("lease/grant", {"TTL": ttl})["ID"])

    def keepalive(self, lease: int, deadline: float | None = None) -> int:
        """Renew a lease: the seconds it has now, 0 if etcd no longer has it. Nothing is tried
        after `deadline` (time.monotonic())."""
        try:
            answer = self.call("lease/keepalive", {"ID": str(lease)}, deadline=deadline)
        except EtcdRefused as exc:
            if exc.code == NOT_FOUND:
                return 0
            raise
        return int(answer.get("result", {}).get("TTL", 0))

    def revoke(self, lease: int) -> None:
        """End a lease now: every key it holds is deleted."""
        try:
            self.call("lease/revoke", {"ID": str(lease)})
        except EtcdRefused as exc:
            if exc.code != NOT_FOUND:
                raise

    # -- watch ----------------------------------------------------------------------------

    def watch(self, key: str, since: int, timeout: float) -> Iterator[Change]:
        """The changes of key from revision `since` on, as etcd streams them, until `timeout`
        seconds pass with none (then the iterator ends). EtcdUnreachable if no endpoint opens
        the stream."""
        request = {"create_request": {"key": _b64(key), "start_revision": str(since)}}
        deadline = time.monotonic() + timeout
        for host, port in list(self.endpoints):
            conn = self._connection(host, port, max(0.1, timeout))
            try:
                conn.request("POST", "/v3/watch", json.dumps(request), self._headers())
                response = conn.getresponse()
                if response.status != 200:
                    raise EtcdRefused(response.read().decode(errors="replace")[:200], 0)
                yield from _events(conn, response, deadline)
                return
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
                    return  # the wait ran out with nothing to see
                continue
            finally:
                conn.close()
        raise EtcdUnreachable(f"no etcd endpoint opened a watch of {key}")


def _events(
    conn: http.client.HTTPConnection, response: http.client.HTTPResponse, deadline: float
) -> Iterator[Change]:
    while (left := deadline - time.monotonic()) > 0:
        if conn.sock is not None:
            conn.sock.settimeout(left)  # each line waits only until the watch's end
        line = response.readline()
        if not line:
            return
        result = json.loads(line).get("result", {})
        for event in result.get("events", []):
            kv = event.get("kv", {})
            yield Change(
                event.get("type", "PUT"),
                base64.b64decode(kv.get("key", "")),
                int(kv.get("mod_revision", 0)),
            )
