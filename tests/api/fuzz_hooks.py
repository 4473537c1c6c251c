"""Schemathesis hooks (loaded through ``SCHEMATHESIS_HOOKS`` by tests/api/test_fuzz.py): besides the
strings the schema allows, path and query parameters also take text PostgreSQL cannot store (a NUL),
which answered 500 on 11 routes before issue 9."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st

UNSTORABLE = ("\x00", "a\x00b", "\x00" * 3 + "pool")


def _with_unstorable(values: dict[str, Any] | None) -> st.SearchStrategy[Any]:
    names = sorted(k for k, v in (values or {}).items() if isinstance(v, str))
    if not names:
        return st.just(values)
    poisoned = st.tuples(st.sampled_from(names), st.sampled_from(UNSTORABLE)).map(
        lambda pick: {**(values or {}), pick[0]: pick[1]}
    )
    return st.one_of(st.just(values), poisoned)


@schemathesis.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> st.SearchStrategy[Any]:
    return _with_unstorable(path_parameters)


@schemathesis.hook
def flatmap_query(context: Any, query: dict[str, Any]) -> st.SearchStrategy[Any]:
    return _with_unstorable(query)
