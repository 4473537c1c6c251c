"""A lean HTTP/1.1 keep-alive client for benchmarks: one connection, one request at a time.

httpx spends about 2-3 ms of CPU per request on this machine, as much as the service's own work for a
quiet heartbeat, and the benchmark's clients share the service's two cores: a flood sent through httpx
measured the client. This one writes prebuilt request bytes and reads the status line, the headers up to
``Content-Length`` and the body, nothing else (no redirects, no chunked bodies: the service always sends
``Content-Length``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class RawConnection:
    """One keep-alive connection to ``base_url`` (``http://host:port``) sending ``headers`` each time."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in {"Host": parts.netloc, **headers}.items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: Any) -> tuple[int, bytes]:
        """POST ``body`` (JSON-encoded) to ``path``: ``(status, response body)``; reconnects once when the
        server closed the connection."""
        data = json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"POST {path} HTTP/1.1\r\n{self._headers}Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode()
        for attempt in (1, 2):
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            try:
                self._writer.write(head + data)
                return await self._answer()
            except (ConnectionError, asyncio.IncompleteReadError):
                await self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _answer(self) -> tuple[int, bytes]:
        assert self._reader is not None
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        body = await self._reader.readexactly(length) if length else b""
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass
        self._reader = self._writer = None
