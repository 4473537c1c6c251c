"""Recording proxies for the declared-reads tests (docs/extending.md, "What a filter reads"): a
:class:`Recorder` notes ``(owner, field)`` for every read made through a :class:`RecordingSeq` or a
:class:`RecordingProxy`, so a test can compare what a step read with what it declares."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Log = set[tuple[str, str]]  # (owner, field)


class Recorder:
    """Who is running now; what each owner read."""

    def __init__(self) -> None:
        self.owner = "?"
        self.log: Log = set()

    def read(self, field: str) -> None:
        self.log.add((self.owner, field))


class RecordingSeq(tuple):  # type: ignore[type-arg]
    """A tuple that records ``field`` whenever it is looked at."""

    rec: Recorder
    field: str

    def __new__(cls, items: Any, rec: Recorder, field: str) -> RecordingSeq:
        made = super().__new__(cls, items)
        made.rec, made.field = rec, field
        return made

    def __iter__(self) -> Iterator[Any]:
        self.rec.read(self.field)
        return super().__iter__()

    def __len__(self) -> int:
        self.rec.read(self.field)
        return super().__len__()

    def __getitem__(self, i: Any) -> Any:
        self.rec.read(self.field)
        return super().__getitem__(i)


class RecordingProxy:
    """Records ``<prefix><attribute>`` for every attribute read, then answers the real one (or its stand-in
    from ``wrap``). ``record_wrapped=False``: a stand-in records its own reads (e.g. names vs amounts of a
    mapping), so reaching it records nothing."""

    def __init__(
        self,
        real: Any,
        rec: Recorder,
        prefix: str,
        wrap: dict[str, Any] | None = None,
        record_wrapped: bool = True,
    ) -> None:
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_rec", rec)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_wrap", wrap or {})
        object.__setattr__(self, "_record_wrapped", record_wrapped)

    def __getattr__(self, name: str) -> Any:
        if self._record_wrapped or name not in self._wrap:
            self._rec.read(self._prefix + name)
        return self._wrap.get(name, getattr(self._real, name))
