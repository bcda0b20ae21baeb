"""A small real trainer for the supervision tests, without torch: its ranks step in lockstep
through a collective of their own (each step a max-reduce over TCP, served by rank 0, as gloo's
all-reduce makes every rank wait for the slowest and fails them all when a peer is lost), keep a
'checkpoint' (the last step, in <FAULT_OUT>/ckpt) that a restart resumes from, and fault on
request. torch is not what these tests are about (the supervisor is): torchrun still starts the
workers, but none of them pays torch's import. torch's own behaviour (process groups, the Flight
Recorder, DDP) is tests/hang_trainer.py's and tests/allreduce_check.py's.

RANK, WORLD_SIZE and MASTER_ADDR come from the launcher (torchrun, or the entrypoint itself);
FAULT_PORT is the port rank 0 serves the collective on, at MASTER_ADDR.

FAULT_OUT       directory for ckpt and the per-rank reports (rank<R>.json)
FAULT_STEPS     steps to run (default 400; each step sleeps FAULT_STEP_SECONDS, default 0.05)
FAULT_CRASH     "<rank>:<step>": that rank raises at that step, on the first start only
FAULT_CRASH_SAY text added to that exception's message (a secret's value, to see it masked)
FAULT_DUMP      "1": that rank first writes <TORCH_FR_DUMP_TEMP_FILE><rank> (or the old name's,
                TORCH_NCCL_DEBUG_INFO_TEMP_FILE), as NCCL dumps each rank's Flight Recorder when
                a collective times out (no NCCL here)
FAULT_EXIT      "<rank>:<step>:<code>": that rank exits with that code (or "abort": os.abort(),
                as XLA and NCCL do on a fatal error) at that step, on the first start only; it
                writes <FAULT_OUT>/exiting<rank> first
FAULT_HANG      "<rank>:<step>,...": those ranks hang at that step, deaf to SIGTERM (as a rank stuck
                in an NCCL collective is)
FAULT_WAIT      "<rank>:<step>,...": those ranks wait at that step (outside any collective) until a
                signal comes, then record it and exit 128 + its number
FAULT_NOISE     lines of 100 characters each rank writes to stderr every step
FAULT_SAY_EVERY rank 0 prints `[fault] step <N>/<FAULT_STEPS>` every that many steps (as a
                trainer logs its progress; the container tests' faults wait for such a line)
Every signal a rank receives is appended to <FAULT_OUT>/signals<rank> (one number a line).
"""

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

out = Path(os.environ["FAULT_OUT"])
out.mkdir(parents=True, exist_ok=True)
steps = int(os.environ.get("FAULT_STEPS", "400"))
pause = float(os.environ.get("FAULT_STEP_SECONDS", "0.05"))
crash = os.environ.get("FAULT_CRASH", "")
exit_at = os.environ.get("FAULT_EXIT", "")
noise = int(os.environ.get("FAULT_NOISE", "0"))
say_every = int(os.environ.get("FAULT_SAY_EVERY", "0"))
hang = os.environ.get("FAULT_HANG", "").split(",")
wait_at = os.environ.get("FAULT_WAIT", "").split(",")
waiting = False
restart = int(os.environ.get("ENTRYPOINT_RESTART_COUNT", "0"))
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
stop_signal = None
signal_at = None  # when a signal reached this rank itself (not through the shared flag)
JOIN_TIMEOUT = 60  # seconds every rank has to reach rank 0's collective


class PeerLost(RuntimeError):
    pass


def _address() -> tuple:
    host, port = os.environ["MASTER_ADDR"].strip("[]"), int(os.environ["FAULT_PORT"])
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    return family, address


class Line:
    """One end of a connection, a line at a time (written whole with sendall, never buffered)."""

    def __init__(self, conn: socket.socket):
        self.conn, self.reader = conn, conn.makefile("rb")

    def send(self, text: str) -> None:
        self.conn.sendall(text.encode() + b"\n")

    def receive(self) -> str:
        try:
            return self.reader.readline().decode()
        except OSError:  # reset by a peer that died: lost, as a closed connection is
            return ""

    def close(self) -> None:
        for end in (self.reader, self.conn):
            try:
                end.close()
            except OSError:
                pass


def serve(listener: socket.socket) -> None:
    """Rank 0's side: every rank's value each round, the max back to all; a rank lost (its
    connection closed before the job's end) closes every connection, so every rank fails."""
    peers = []
    while len(peers) < world:
        conn, _ = listener.accept()
        peers.append(Line(conn))
    listener.close()
    while True:
        values = [peer.receive() for peer in peers]
        if not all(values):
            for peer in peers:
                peer.close()
            return
        for peer in peers:
            try:
                peer.send(str(max(int(v) for v in values)))
            except OSError:
                pass


def connect():
    """This rank's line to the collective (rank 0 starts serving it first), and rank 0's server."""
    family, address = _address()
    server = None
    if rank == 0:
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(world)
        server = threading.Thread(target=serve, args=(listener,), daemon=True)
        server.start()
    end = time.monotonic() + JOIN_TIMEOUT
    while True:
        try:
            conn = socket.create_connection(address[:2], timeout=None)
            if conn.getsockname() == conn.getpeername():  # TCP's self-connect: no one listens yet
                conn.close()
                raise ConnectionRefusedError("connected to itself")
            return Line(conn), server
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def max_reduce(channel: Line, value: int) -> int:
    channel.send(str(value))
    got = channel.receive()
    if not got:
        raise PeerLost(f"rank {rank}: a peer left the collective (connection closed)")
    return int(got)


def on_signal(number, _frame):
    global stop_signal, signal_at
    with open(out / f"signals{os.environ.get('RANK', '?')}", "a") as seen:
        seen.write(f"{number}\n")
    if waiting:
        os._exit(128 + number)
    if number in (signal.SIGTERM, signal.SIGUSR1):
        stop_signal = number
        signal_at = signal_at or time.time()


for sig in (
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGABRT,
    signal.SIGSEGV,
    signal.SIGINT,
    signal.SIGHUP,
):
    signal.signal(sig, on_signal)

channel, server = connect()
ckpt = out / "ckpt"


def save(step: int) -> None:
    """The checkpoint written whole or not at all (a rank killed mid-write leaves the last)."""
    part = out / f"ckpt.{rank}.part"
    part.write_text(str(step))
    os.replace(part, ckpt)


start = int(ckpt.read_text()) if ckpt.exists() else 0
print(f"rank {rank}/{world} starts at step {start} (restart {restart})", flush=True)
(out / f"started{rank}.{restart}").write_text(str(os.getpid()))
# The job token's variables this worker sees: none (they are the entrypoints').
(out / f"token_env{rank}").write_text(json.dumps(sorted(k for k in os.environ if "JOB_TOKEN" in k)))
signals_seen = []
step = start
for step in range(start + 1, steps + 1):
    if crash and restart == 0 and crash == f"{rank}:{step}":
        if os.environ.get("FAULT_DUMP") == "1":
            prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
            prefix = prefix or os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
            Path(prefix + str(rank)).write_bytes(b"a dump")
        raise ValueError(
            f"injected failure on rank {rank} at step {step}"
            + os.environ.get("FAULT_CRASH_SAY", "")
        )
    if exit_at and restart == 0 and exit_at.startswith(f"{rank}:{step}:"):
        code = exit_at.split(":")[2]
        (out / f"exiting{rank}").write_text(code)
        if code == "abort":
            os.abort()
        os._exit(int(code))
    if restart == 0 and f"{rank}:{step}" in wait_at:
        waiting = True
        time.sleep(3600)
    if restart == 0 and f"{rank}:{step}" in hang:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    for _ in range(noise):
        print(f"rank {rank} step {step} " + "n" * 80, file=sys.stderr)
    flag = max_reduce(channel, 0 if stop_signal is None else stop_signal)
    if flag:  # a signal on any rank stops every rank
        signals_seen.append(flag)
        if rank == 0:
            save(step - 1)
        break
    time.sleep(pause)
    if rank == 0 and say_every and step % say_every == 0:
        print(f"[fault] step {step}/{steps}", flush=True)
    if rank == 0 and step % 20 == 0:
        save(step)
report = {
    "rank": rank,
    "world_size": world,
    "start": start,
    "last_step": step,
    "restart": restart,
    "signal": signals_seen[0] if signals_seen else None,
    "signal_at": signal_at,
}
(out / f"rank{rank}.json").write_text(json.dumps(report))
channel.close()
if server is not None:  # the last round's answers reach every rank before rank 0 leaves
    server.join(timeout=30)
sys.exit(128 + signals_seen[0] if signals_seen else 0)
