"""The service's log lines: one handler on the ``better_compute`` logger, plain text or JSON lines
(``BC_LOG_FORMAT``), each carrying the request id of the request it was written for.

The request id lives in a context variable set by the access-log middleware, so any line written while a
request is served (an error's traceback included) names it; lines written outside a request say ``-``.
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from typing import Literal

from pythonjsonlogger.json import JsonFormatter

LOGGER = "better_compute"
HANDLER_NAME = "better_compute"
NO_REQUEST = "-"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
# uvicorn's own loggers: in JSON mode their lines (warnings, errors) become JSON as well
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default=NO_REQUEST)


class RequestIdFilter(logging.Filter):
    """Gives every record a ``request_id`` (the current request's, or ``-``) unless it carries one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


def formatter(log_format: Literal["text", "json"]) -> logging.Formatter:
    """The formatter of ``log_format``: text lines, or JSON objects with ``timestamp`` (ISO 8601, UTC),
    ``level``, ``name``, ``message``, the record's extra fields and ``exc_info`` (the traceback)."""
    if log_format == "json":
        return JsonFormatter(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level"},
            timestamp=True,
            json_ensure_ascii=False,
        )
    return logging.Formatter(TEXT_FORMAT)


def configure_logging(log_format: Literal["text", "json"]) -> None:
    """Write the ``better_compute`` logger's INFO and above to stderr in ``log_format`` (idempotent: a
    second call replaces the handler, so apps built one after another in a process log each line once).
    Records still propagate to the root logger (pytest's log capture, a host application's handlers)."""
    logger = logging.getLogger(LOGGER)
    for handler in list(logger.handlers):
        if handler.get_name() == HANDLER_NAME:
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(formatter(log_format))
    handler.addFilter(RequestIdFilter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    if log_format == "json":
        for name in UVICORN_LOGGERS:
            for uvicorn_handler in logging.getLogger(name).handlers:
                uvicorn_handler.setFormatter(formatter("json"))
