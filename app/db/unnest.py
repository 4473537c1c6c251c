"""Rows bound as arrays: ``unnest(:a, :b, ...) AS name(a, b, ...)``, one row per index, so one statement
(compiled once) writes or locks many rows (:func:`bound_rows`). Amounts per resource are one such pair,
``unnest(:names, :amounts) AS wanted(resource, amount)``, so a statement charges or holds several
resources at once (the guarded commit's scalar holdings, :mod:`app.capacity.commit.single`, and the quota
charge, :mod:`app.quota.charges`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg


def bound_rows(name: str, *columns: tuple[str, str | sa.BindParameter[Any], Any]) -> Any:
    """``unnest(:p1, :p2, ...) AS <name>(c1, c2, ...)`` for ``columns`` of ``(column, parameter, element
    type)``: the parameter is a bind parameter's name (bound as an array of the element type) or a bind
    parameter already made (shared with other parts of a statement). The arrays are of equal length, in
    row order."""
    params = [
        param if isinstance(param, sa.BindParameter) else sa.bindparam(param, type_=pg.ARRAY(kind))
        for _, param, kind in columns
    ]
    return (
        sa.func.unnest(*params)
        .table_valued(*(sa.column(column, kind) for column, _, kind in columns))
        .render_derived(name=name)
    )


def wanted_amounts(names: str, amounts: str) -> Any:
    """``unnest(:<names>, :<amounts>) AS wanted(resource, amount)``: the bind parameters ``names``
    (``text[]``) and ``amounts`` (``numeric[]``, in the same order) as a table of ``(resource text,
    amount numeric)`` rows."""
    return bound_rows("wanted", ("resource", names, sa.Text), ("amount", amounts, sa.Numeric))
