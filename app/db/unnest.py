"""Amounts per resource as one bound pair of arrays: ``unnest(:names, :amounts) AS wanted(resource,
amount)``, one row per resource, so a statement charges or holds several resources at once (the
guarded commit's scalar holdings, :mod:`app.capacity.commit`, and the quota charge,
:mod:`app.quota.service`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg


def wanted_amounts(names: str, amounts: str) -> Any:
    """``unnest(:<names>, :<amounts>) AS wanted(resource, amount)``: the bind parameters ``names``
    (``text[]``) and ``amounts`` (``numeric[]``, in the same order) as a table of ``(resource text,
    amount numeric)`` rows."""
    return (
        sa.func.unnest(
            sa.bindparam(names, type_=pg.ARRAY(sa.Text)),
            sa.bindparam(amounts, type_=pg.ARRAY(sa.Numeric)),
        )
        .table_valued(sa.column("resource", sa.Text), sa.column("amount", sa.Numeric))
        .render_derived(name="wanted")
    )
