"""The node's heartbeat while its trainer runs comes from a thread of its own
(entrypoint.supervise.supervisor.Beats): a supervising loop held up in one of its steps does not
silence the node; a loop stuck for good does; a beat that comes late is said. Over a real TCP
connection, read as node 0 reads it (CI's run of 2026-11-27 lost a node whose heartbeats
stopped for 5 s under stress-ng)."""

from __future__ import annotations

import socket
import threading
import time

from entrypoint.control import messages as m
from entrypoint.control.control_channel import Channel
from entrypoint.control.node_stats import NodeStats
from entrypoint.control.rank_records import RankReport
from entrypoint.control.transport import Lines
from entrypoint.plan.settings import Settings
from entrypoint.supervise.supervisor import Beats, Turn


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, text: str, **_fields) -> None:
        self.lines.append(text)


class Ranks:
    def reports(self, _now: float) -> list:
        return [RankReport(0, 7, 0.1, None, 0.05, False)]


class Stats:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def read(self) -> NodeStats:
        time.sleep(self.delay)
        return NodeStats(load=0.5)


def _pair() -> tuple[Channel, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    node = socket.create_connection(listener.getsockname())
    node0, _ = listener.accept()
    listener.close()
    return Channel(node, "127.0.0.1"), node0


def _beats(node0: socket.socket, seconds: float) -> list[float]:
    """When each beat arrived at node 0, over `seconds`."""
    lines, got, end = Lines(), [], time.monotonic() + seconds
    node0.settimeout(0.1)
    while time.monotonic() < end:
        try:
            data = node0.recv(65536)
        except TimeoutError:
            continue
        for line in lines.feed(data):
            if isinstance(m.decode(line, m.FROM_NODES), m.Beat):
                got.append(time.monotonic())
    return got


def test_beats_go_on_while_the_loop_is_held_up_and_stop_once_it_is_stuck():
    channel, node0 = _pair()
    log = Log()
    settings = Settings(heartbeat_interval=0.1, heartbeat_timeout=1)
    turn = Turn(settings.heartbeat_timeout, log)  # the loop never turns again: held up
    beats = Beats(channel, settings, Stats(), Ranks(), turn, stuck_after=1.5)
    try:
        got = _beats(node0, 3.0)
    finally:
        beats.stop()
        channel.close()
        node0.close()
    start = turn.began
    during = [t - start for t in got if t - start <= 1.4]
    after = [t - start for t in got if t - start > 1.7]
    # Every 0.1 s while the loop is held up (well past the 1 s heartbeat timeout), none once
    # it has been stuck for 1.5 s.
    assert len(during) >= 8 and max(during) > 1.1, during
    assert not after, after
    assert not log.lines, log.lines


def test_a_late_beat_is_said():
    channel, node0 = _pair()
    log = Log()
    settings = Settings(heartbeat_interval=0.1, heartbeat_timeout=1)
    turn = Turn(settings.heartbeat_timeout, log)
    # Reading the figures takes 0.8 s: each beat comes 0.9 s after the one before.
    beats = Beats(channel, settings, Stats(0.8), Ranks(), turn)
    try:
        _beats(node0, 2.2)
    finally:
        beats.stop()
        channel.close()
        node0.close()
    assert any(
        "heartbeat went 0.9 s after the one before" in line and "starved of CPU or stopped" in line
        for line in log.lines
    ), log.lines


def test_two_threads_sending_at_once_never_mix_their_lines():
    channel, node0 = _pair()
    lines, seen = Lines(), []

    def send(kind: str) -> None:
        for _ in range(300):
            channel.send(m.Signal(10) if kind == "s" else m.Beat())

    threads = [threading.Thread(target=send, args=(k,)) for k in "sb"]
    for t in threads:
        t.start()
    node0.settimeout(2)
    while len(seen) < 600:
        for line in lines.feed(node0.recv(65536)):
            seen.append(type(m.decode(line, m.FROM_NODES)).__name__)
    for t in threads:
        t.join()
    channel.close()
    node0.close()
    assert sorted(set(seen)) == ["Beat", "Signal"] and len(seen) == 600
