"""structlog, configured once: readable on a terminal, JSON lines otherwise; the node rank in
every line; informative lines from node 0 only unless asked; secrets masked; optionally a
per-node file in ENTRYPOINT_LOG_DIR.

Nothing here blocks the caller: lines go into a bounded queue that one writer thread empties
into stderr and the log file. Node 0's control server logs from its own thread; a stderr that
nobody reads (a stuck log shipper, a full pipe) or a full disk must never delay a verdict to
the other nodes. When the queue is full a line is dropped and counted, and the count is said
once the writer can write again.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, Protocol

import structlog

from entrypoint.plan import secrets
from entrypoint.plan.settings import Settings

EventDict = MutableMapping[str, Any]


class Logger(Protocol):
    """What the node's code logs through: structlog's bound logger (`setup`), or a test's."""

    def debug(self, event: str, **fields: Any) -> Any: ...
    def info(self, event: str, **fields: Any) -> Any: ...
    def warning(self, event: str, **fields: Any) -> Any: ...
    def error(self, event: str, **fields: Any) -> Any: ...


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
QUEUE_LINES = 10000  # lines held while stderr is slow; beyond this they are dropped, counted


def _masker(values: tuple[str, ...]) -> Callable[[Any, str, EventDict], EventDict]:
    def processor(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
        return secrets.mask_data(event_dict, values)

    return processor


def _lines_below(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
    """Console: a `traceback` list (the failure summary) is shown as indented lines under the
    event, readable; JSON keeps it as a list in the same line."""
    lines = event_dict.pop("traceback", None)
    if lines:
        event_dict["event"] = (
            str(event_dict.get("event", "")) + "".join(f"\n    {line}" for line in lines) + "\n"
        )
    return event_dict


def _traceback_last(_logger: Any, _name: str, event_dict: EventDict) -> EventDict:
    """JSON: the event first, then the traceback's lines (a list), as one reads them."""
    if "traceback" in event_dict:
        event_dict["traceback"] = event_dict.pop("traceback")
    return event_dict


class Writer(threading.Thread):
    """The one thread that writes this process's log lines: to stderr (fd 2, unbuffered, so
    that no lock is held by a blocked write) and to the node's log file."""

    def __init__(self, path: Path | None, fd: int = 2, size: int = QUEUE_LINES) -> None:
        super().__init__(name="entrypoint-log-writer", daemon=True)
        self.fd = fd
        self.path = path
        self.queue: queue.Queue = queue.Queue(maxsize=size)
        self.dropped = 0  # lines dropped because the queue was full, not yet said
        self.dropped_total = 0
        self.file = None
        self.file_error: str | None = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.file = path.open("a", buffering=1)
            except OSError as err:
                self.file_error = f"{path}: {err.strerror or err}"
                self.put(
                    f"entrypoint: cannot write the node's log file {self.file_error}; "
                    "logging to stderr only",
                    to_file=False,
                )
        self.start()

    def put(self, line: str, *, to_file: bool = True) -> None:
        """Queue one line; never blocks."""
        try:
            self.queue.put_nowait((line, to_file))
        except queue.Full:
            self.dropped += 1
            self.dropped_total += 1

    def run(self) -> None:
        while True:
            line, to_file = self.queue.get()
            try:
                if self.dropped:
                    count, self.dropped = self.dropped, 0
                    self._write(
                        f"entrypoint: {count} log line(s) dropped: stderr was not being "
                        "read fast enough",
                        to_file=True,
                    )
                self._write(line, to_file)
            finally:
                self.queue.task_done()

    def _write(self, line: str, to_file: bool) -> None:
        data = (line + "\n").encode(errors="replace")
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError:
            pass  # stderr closed: nothing to tell it
        if to_file and self.file is not None:
            try:
                self.file.write(line + "\n")
            except (OSError, ValueError) as err:
                # A full disk or a vanished mount: say it once, on stderr, and go on without it.
                self.file_error = f"{self.path}: {getattr(err, 'strerror', None) or err}"
                try:
                    self.file.close()
                except OSError:
                    pass
                self.file = None
                self._write(
                    f"entrypoint: stopped writing the node's log file "
                    f"{self.file_error}; logging to stderr only",
                    to_file=False,
                )

    def flush(self, timeout: float = 3.0) -> bool:
        """Wait until every queued line is written, at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self.queue.unfinished_tasks


_writer: Writer | None = None


def writer() -> Writer:
    """This process's writer (stderr only until setup() names a file)."""
    global _writer
    if _writer is None:
        _writer = Writer(None)
        atexit.register(_writer.flush)
    return _writer


def last_word(line: str) -> None:
    """The process's last line (the one-line error): after every queued log line, in one
    write, so that it never lands inside another line."""
    if _writer is not None:
        _writer.flush()
    sys.stderr.write(line + "\n")  # one write: print() writes the newline apart
    sys.stderr.flush()


def echo(line: str) -> None:
    """A line of the trainer's stderr, passed on without blocking (not into the log file)."""
    writer().put(line, to_file=False)


class _Tee:
    """structlog's logger: each rendered line goes to the writer."""

    def __init__(self, out: Writer) -> None:
        self._out = out

    def msg(self, message: str) -> None:
        self._out.put(message)

    log = debug = info = warning = warn = error = critical = exception = msg


def console(fmt: str) -> bool:
    """Whether lines are for a person (a terminal, or asked for) rather than JSON lines."""
    return fmt == "console" or (fmt == "auto" and sys.stderr.isatty())


def for_node(
    settings: Settings, member: int, secret_values: tuple[str, ...], head: bool = False
) -> structlog.stdlib.BoundLogger:
    """`setup` for member `member` of a job, as its logging settings ask (level, format, all
    nodes, directory)."""
    return setup(
        node_rank=member,
        level=settings.log_level,
        fmt=settings.log_format,
        all_nodes=settings.log_all_nodes,
        log_dir=settings.log_dir,
        secret_values=secret_values,
        head=head,
    )


def setup(
    *,
    node_rank: int | None = None,
    level: str = "info",
    fmt: str = "auto",
    all_nodes: bool = False,
    log_dir: Path | None = None,
    secret_values: tuple[str, ...] = (),
    head: bool = False,
) -> structlog.stdlib.BoundLogger:
    """The node's logger: every level on node 0 (or on `head`, the node that took node 0's seat
    over), warnings and errors only elsewhere unless `all_nodes`."""
    global _writer
    quiet = node_rank not in (None, 0) and not all_nodes and not head
    threshold = max(_LEVELS[level], logging.WARNING) if quiet else _LEVELS[level]
    readable = console(fmt)
    renderer = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if readable
        else structlog.processors.JSONRenderer()
    )
    path = None if log_dir is None or node_rank is None else log_dir / f"node{node_rank}.log"
    if _writer is None or path != _writer.path:
        if _writer is not None:
            _writer.flush()
        _writer = Writer(path)
        atexit.register(_writer.flush)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _masker(secret_values),
            _lines_below if readable else _traceback_last,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=lambda *_: _Tee(_writer),
        cache_logger_on_first_use=False,
    )
    log = structlog.get_logger("entrypoint")
    return log.bind(node=node_rank) if node_rank is not None else log
