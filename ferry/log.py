"""Structured logging set-up shared by every Kube-Ferry process."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog


def configure(level: str = "info", json: bool = False, stream: TextIO | None = None) -> None:
    """Route structlog (and stdlib logging) to one stream, as key=value or JSON lines."""
    out = stream or sys.stderr
    lvl = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=lvl, stream=out, format="%(message)s")
    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
