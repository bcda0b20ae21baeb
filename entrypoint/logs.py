"""structlog, configured once: readable on a terminal, JSON lines otherwise; the node rank in
every line; informative lines from node 0 only unless asked; secrets masked; optionally a
per-node file in ENTRYPOINT_LOG_DIR."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import structlog

from entrypoint import secrets

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def _masker(values: tuple[str, ...]):
    def processor(_logger, _name, event_dict):
        if values:
            for key, value in event_dict.items():
                if isinstance(value, str):
                    event_dict[key] = secrets.mask(value, values)
                elif isinstance(value, (list, tuple)):
                    event_dict[key] = [secrets.mask(str(v), values) for v in value]
        return event_dict
    return processor


class _Tee:
    """Write each rendered line to stderr and to the node's log file."""

    def __init__(self, path: Path | None) -> None:
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1)

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)
        if self._file:
            self._file.write(message + "\n")

    log = debug = info = warning = warn = error = critical = exception = msg


def setup(*, node_rank: int | None = None, level: str = "info", fmt: str = "auto",
          all_nodes: bool = False, log_dir: Path | None = None,
          secret_values: tuple[str, ...] = ()) -> structlog.stdlib.BoundLogger:
    quiet = node_rank not in (None, 0) and not all_nodes
    threshold = max(_LEVELS[level], logging.WARNING) if quiet else _LEVELS[level]
    console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer = (structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
                if console else structlog.processors.JSONRenderer())
    path = None if log_dir is None or node_rank is None else log_dir / f"node{node_rank}.log"
    tee = _Tee(path)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _masker(secret_values),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=lambda *_: tee,
        cache_logger_on_first_use=False,
    )
    log = structlog.get_logger("entrypoint")
    return log.bind(node=node_rank) if node_rank is not None else log
