"""The one LISTEN loop of the background controllers (the wake controller,
:mod:`app.capacity.controllers.wake`, and
the queue worker, :mod:`app.capacity.queue.worker`): hold a connection that LISTENs on some channels until it
fails, pinging it every ``LISTENER_PING`` seconds so a dead connection is noticed. The caller runs it
again after its retry delay; edges sent while nobody listened were not heard, so each (re)connection
calls ``on_listening`` (the controllers make their next run a full sweep).

:class:`ListeningController` is what both controllers share: the heard set, the sweep clock, ``poke``
and :meth:`~ListeningController.listen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from app.capacity.config import CapacityConfig
from app.capacity.planning.snapshot import PoolCache

H = TypeVar("H")  # what a controller remembers of an edge it heard

LISTENER_PING = 10.0  # seconds between two checks that the listening connection is alive


async def listen_until_lost(
    engine: AsyncEngine,
    handlers: Mapping[str, Callable[[str], None]],
    on_listening: Callable[[], None],
    on_stopped: Callable[[], None],
) -> None:
    """LISTEN on every channel of ``handlers`` (channel -> ``handler(payload)``) on one connection of
    ``engine``; ``on_listening()`` once every LISTEN is registered, ``on_stopped()`` when the connection is
    lost or the task is cancelled. Returns when the connection is lost; raises what a failed ping raises
    (``SELECT 1`` within ``LISTENER_PING`` seconds, else TimeoutError)."""
    async with engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        lost = asyncio.Event()
        listeners = {channel: _listener(handler) for channel, handler in handlers.items()}

        def on_lost(_conn: Any) -> None:
            lost.set()

        raw.add_termination_listener(on_lost)
        for channel, listener in listeners.items():
            await raw.add_listener(channel, listener)
        on_listening()
        try:
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LISTENER_PING):
                        await lost.wait()
                if not lost.is_set():
                    async with asyncio.timeout(LISTENER_PING):
                        await raw.fetchval("SELECT 1")
        finally:
            on_stopped()
            if not raw.is_closed():
                with contextlib.suppress(Exception):
                    for channel, listener in listeners.items():
                        await raw.remove_listener(channel, listener)
            raw.remove_termination_listener(on_lost)


def _listener(handler: Callable[[str], None]) -> Callable[[Any, int, str, str], None]:
    """asyncpg's listener signature ``(connection, pid, channel, payload)`` around ``handler(payload)``."""

    def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        handler(payload)

    return on_notify


class ListeningController(Generic[H]):
    """A background controller of one service process: edges heard on a LISTEN connection
    (:meth:`listen`, the channels of :meth:`channels`) are remembered in ``_heard`` and ``poke`` (set
    once the lifecycle exists) starts a run now; a run sweeps every pool at most every ``sweep_seconds``
    (:meth:`sweep_due`), and right after each (re)connection."""

    def __init__(
        self,
        cache: PoolCache,
        config: CapacityConfig,
        sweep_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.config = config
        self.sweep_seconds = sweep_seconds
        self.clock = clock
        self.poke: Callable[[], None] = lambda: None
        self.listening = False  # the LISTEN is registered (tests wait for it)
        self._heard: set[H] = set()
        self._last_sweep = -math.inf

    def channels(self) -> Mapping[str, Callable[[str], None]]:
        """Channel -> ``handler(payload)``: what :meth:`listen` LISTENs on."""
        raise NotImplementedError

    def sweep_due(self) -> bool:
        """True (and the sweep clock restarted) when the last sweep is ``sweep_seconds`` old or more."""
        if self.clock() - self._last_sweep < self.sweep_seconds:
            return False
        self._last_sweep = self.clock()
        return True

    async def listen(self, engine: AsyncEngine) -> None:
        """Hold a connection that LISTENs on :meth:`channels` until it fails (the lifecycle runs this
        again after its retry delay); each (re)connection makes the next run a full sweep: edges sent
        while nobody listened were not heard (:func:`listen_until_lost`)."""
        await listen_until_lost(engine, self.channels(), self._on_listening, self._on_stopped)

    def _on_listening(self) -> None:
        self.listening = True
        self._last_sweep = -math.inf
        self.poke()

    def _on_stopped(self) -> None:
        self.listening = False
