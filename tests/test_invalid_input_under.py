"""``InvalidInput.under``: the one way an error is re-wrapped one level down (app/errors.py)."""

from __future__ import annotations

import pytest

from app.errors import InvalidInput, NotFound, errors_under
from app.fleet.build_plan import FleetBuildRefused

CASES = [
    # (error path, prefix, label, want path, want message)
    ("targets.3.node.cpus", "fleet", None, "fleet.targets.3.node.cpus", "bad"),
    ("", "fleet", None, "fleet", "bad"),
    (None, "fleet", None, "fleet", "bad"),
    ("program", "estimate", None, "estimate.program", "bad"),
    ("targets.0", "", "fleet.json", "targets.0", "fleet.json: bad"),
    ("free_cpus", "capacity.ws", "capacity.ws", "capacity.ws.free_cpus", "capacity.ws: bad"),
]


@pytest.mark.parametrize(("path", "prefix", "label", "want_path", "want_message"), CASES)
def test_under(path: str | None, prefix: str, label: str | None, want_path: str, want_message: str) -> None:
    error = InvalidInput("bad", path=path, details={"errors": [1]})
    wrapped = error.under(prefix, label=label)
    assert type(wrapped) is InvalidInput
    assert (wrapped.path, wrapped.message) == (want_path, want_message)
    assert wrapped.details == {"errors": [1], "path": want_path}
    assert wrapped.to_body()["error"]["code"] == "INVALID_INPUT"
    assert (error.path, error.message) == (path, "bad")  # the original is unchanged


def test_under_keeps_or_sets_the_type() -> None:
    refused = FleetBuildRefused("no", path="collect.x").under("body")
    assert type(refused) is FleetBuildRefused and refused.path == "body.collect.x"
    converted = InvalidInput("bad", path="a").under("capacity.ws", as_type=FleetBuildRefused)
    assert type(converted) is FleetBuildRefused and converted.status == 422
    assert InvalidInput("bad").under("").path is None


def test_errors_under_re_raises_the_block_s_invalid_input_one_level_down() -> None:
    with pytest.raises(InvalidInput) as caught, errors_under("request"):
        raise FleetBuildRefused("bad", path="cpus")
    assert type(caught.value) is FleetBuildRefused and caught.value.path == "request.cpus"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(NotFound) as other, errors_under("request"):
        raise NotFound("gone")
    assert other.value.details == {}  # not an InvalidInput: unchanged
    with errors_under("request"):
        pass
