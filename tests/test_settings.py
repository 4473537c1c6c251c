"""Settings are checked at start (docs/operating.md, "Settings"): a bad one stops `better-compute serve`
with one line on stderr naming it, and exit 2; docs/operating.md lists every setting."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from app.settings import Settings, SettingsError, load_settings, setting_name
from tests.servers import REPO, free_port, running_server

pytestmark = pytest.mark.slow  # a long module: it starts early in a parallel run (tests/conftest.py)


def _serve(env_overrides: dict[str, str], database_url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BC_")}
    env.update({"DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1", **env_overrides})
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# (environment, the setting the line must name, a word the line must hold)
BAD_SETTINGS = [
    ({"BC_SCHEDULER_WEIGHTS": '{"sprad": 1}'}, "BC_SCHEDULER_WEIGHTS", "binpack, spread, topology, numa"),
    ({"BC_SCHEDULER_WEIGHTS": '{"spread": -0.5}'}, "BC_SCHEDULER_WEIGHTS", "below 0"),
    ({"BC_SCHEDULER_WEIGHTS": "{spread: 1}"}, "BC_SCHEDULER_WEIGHTS", "JSON object"),
    ({"BC_CAPACITY_MAX_LEAD": "1 year"}, "BC_CAPACITY_MAX_LEAD", "ISO 8601"),
    ({"BC_CAPACITY_MAX_LEAD": "0"}, "BC_CAPACITY_MAX_LEAD", "above 0"),
    ({"BC_SCHEDULER_PLUGINS": '["tests.no_such_module:plugin"]'}, "BC_SCHEDULER_PLUGINS", "no_such_module"),
    ({"BC_SCHEDULER_PLUGINS": '["tests.example_plugins"]'}, "BC_SCHEDULER_PLUGINS", "module:attribute"),
    ({"BC_SCHEDULER_TOP_N": "0"}, "BC_SCHEDULER_TOP_N", "greater than or equal to 1"),
    ({"BC_CAPACITY_EARLIEST_PLANS": "0"}, "BC_CAPACITY_EARLIEST_PLANS", "greater than or equal to 1"),
    ({"BC_CAPACITY_BACKFILL_DEPTH": "-1"}, "BC_CAPACITY_BACKFILL_DEPTH", "greater than or equal to 0"),
    ({"BC_CAPACITY_BACKFILL_DEPTH": "many"}, "BC_CAPACITY_BACKFILL_DEPTH", "integer"),
    ({"DATABASE_URL": "mysql://root@127.0.0.1/compute"}, "DATABASE_URL", "postgresql://"),
]


@pytest.mark.parametrize(
    ("env", "setting", "hint"),
    BAD_SETTINGS,
    ids=[f"{s}={next(iter(e.values()))}" for e, s, _ in BAD_SETTINGS],
)
def test_a_bad_setting_stops_serve_with_one_line_and_exit_2(
    env: dict[str, str], setting: str, hint: str, database_url: str
) -> None:
    """Checked before the database is touched: nothing on stdout, one line on stderr that starts with
    the setting's name and says what it accepts (no traceback)."""
    done = _serve(env, database_url)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{setting}: ") and hint in lines[0], lines[0]
    assert done.stdout == ""


def test_an_unreachable_or_wrong_database_is_one_line_without_the_password(database_url: str) -> None:
    """A refused connection and a database that does not exist: one line naming DATABASE_URL and the
    host, never the password."""
    refused = f"postgresql://postgres:s3cret@127.0.0.1:{free_port()}/compute"
    missing = re.sub(r"/[^/]*$", "/no_such_database_bc", database_url)
    for url, why in (
        (refused, "connection refused"),
        (missing, 'database "no_such_database_bc" does not exist'),
    ):
        done = _serve({}, url)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2, done.stderr
        assert len(lines) == 1 and lines[0].startswith("DATABASE_URL: cannot connect to "), done.stderr
        assert why in lines[0] and "s3cret" not in lines[0]


@pytest.mark.parametrize(
    ("text", "lead"),
    [("86400", timedelta(days=1)), ("90.5", timedelta(seconds=90.5)), ("P366D", timedelta(days=366))],
)
def test_max_lead_takes_seconds_or_an_iso_duration(
    monkeypatch: pytest.MonkeyPatch, text: str, lead: timedelta
) -> None:
    monkeypatch.setenv("BC_CAPACITY_MAX_LEAD", text)
    assert load_settings().capacity_max_lead == lead


def test_a_secret_is_never_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:s3cret@host:notaport/db")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert refused.value.setting == "DATABASE_URL" and "s3cret" not in str(refused.value)


def test_serve_starts_with_max_lead_in_seconds(database_url: str, tmp_path: Path) -> None:
    """BC_CAPACITY_MAX_LEAD given in seconds, as documented, serves (it used to stop the service)."""
    with running_server(database_url, tmp_path, extra_env={"BC_CAPACITY_MAX_LEAD": "86400"}) as server:
        assert httpx.get(server.url + "/healthz").status_code == 200


def test_operating_doc_lists_every_setting() -> None:
    """The "Settings" table of docs/operating.md names exactly the environment variables of Settings."""
    text = (REPO / "docs" / "operating.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", section, flags=re.MULTILINE))
    assert documented == {setting_name(field) for field in Settings.model_fields}
