"""Shared pieces of the response models: the strict base, JSON numbers and the paging fields."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

Number = int | float
"""A JSON number as the service writes it: whole amounts as integers (``29``), others as floats (``0.5``).
``int | float`` (not ``float``) so a whole number is not re-serialised as ``29.0``."""


Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
"""An ISO 8601 time with its UTC offset, as the service writes it (``2026-12-01T12:00:00.123456+00:00``);
text, not a parsed time, so the answer keeps the service's spelling."""


class ApiModel(BaseModel):
    """A response model: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


NEXT_CURSOR = Field(
    default=None,
    description="Pass as `cursor` to read the next page; null on the last page.",
)
