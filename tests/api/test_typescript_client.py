"""The contract as TypeScript tools read it (issue 22, "Done when" 6; docs/api.md, "The contract"):
Redocly's recommended rules find no error in ``openapi/openapi.json``, and the request bodies of the
README's curl examples type-check, as object literals, against the types ``openapi-typescript`` generates
from it, under ``tsc --strict``; bodies the service refuses do not.

Runs where node and npm are installed (as on CI) and skips elsewhere. The tools are pinned in
``tests/ts/package.json`` and ``package-lock.json`` and installed once with ``npm ci`` into a cache folder
keyed by the two files (``$BC_TS_TOOLS_CACHE``, else ``$XDG_CACHE_HOME/better-compute``, else
``~/.cache/better-compute``), so later runs need no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tests" / "ts"
DOC = ROOT / "openapi" / "openapi.json"
BODY_ROUTES = ("/v1/capacity/preview", "/v1/reservations")
# curl ... http://HOST/v1/reservations -d '{...}': the route and the single-quoted body
CURL_BODY = re.compile(r"curl [^\n]*?https?://[^/\s]+(/v1/[\w/.-]+) -d '(\{.*?\})'", re.S)
# a shell variable spliced into the quoted body: '{"poolId": "'$POOL'"}'
SPLICED = re.compile(r"'\"?\$\{?(\w+)\}?\"?'")
QUIET = {"REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true", "NO_UPDATE_NOTIFIER": "1"}


def readme_request_bodies(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``(route, body)`` for each curl example in ``text`` that sends a JSON body to one of
    :data:`BODY_ROUTES`; a spliced shell variable (``'$POOL'``) becomes its lower-cased name."""
    found = []
    for route, quoted in CURL_BODY.findall(text):
        if route in BODY_ROUTES:
            found.append((route, json.loads(SPLICED.sub(lambda m: m.group(1).lower(), quoted))))
    return found


def test_the_readme_bodies_are_found() -> None:
    bodies = readme_request_bodies((ROOT / "README.md").read_text())
    assert {route for route, _ in bodies} == set(BODY_ROUTES)
    preview = next(body for route, body in bodies if route == "/v1/capacity/preview")
    assert preview["poolId"] == "pool" and preview["devices"][0]["topology"] == "nvlink-all"
    assert "binding" not in preview and "spot" not in preview  # the fields a client must be able to omit


def test_a_spliced_variable_and_other_routes() -> None:
    text = (
        'curl -s -H "$H" http://127.0.0.1:8000/v1/reservations -d \'{"poolId": "\'$POOL\'",\n'
        ' "x": 1}\'\n'
        'curl -s http://127.0.0.1:8000/v1/pools -d \'{"name": "a"}\'\n'
    )
    assert readme_request_bodies(text) == [("/v1/reservations", {"poolId": "pool", "x": 1})]


@pytest.fixture(scope="session")
def ts_tools() -> Path:
    """The folder whose ``node_modules`` holds the pinned tools; installed on first use."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the TypeScript contract checks run where they are (CI)")
    manifest = [(TOOLS / name).read_bytes() for name in ("package.json", "package-lock.json")]
    digest = hashlib.sha256(b"\0".join(manifest)).hexdigest()[:16]
    cache = os.environ.get("BC_TS_TOOLS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "better-compute"
    )
    folder = Path(cache) / f"ts-tools-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    installed = folder / "tools"
    if not (installed / "node_modules" / ".package-lock.json").exists():
        staging = folder / f"staging-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for name in ("package.json", "package-lock.json"):
            shutil.copy(TOOLS / name, staging / name)
        result = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **QUIET},
        )
        assert result.returncode == 0, "npm ci (tests/ts) failed:\n" + result.stderr[-3000:]
        try:
            staging.rename(installed)  # another session may have finished first: keep its copy
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return installed


def _tool(tools: Path, name: str, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tools / "node_modules" / ".bin" / name), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **QUIET},
    )


def test_redocly_finds_no_error(ts_tools: Path, tmp_path: Path) -> None:
    result = _tool(ts_tools, "redocly", "lint", DOC, "--format=json", cwd=tmp_path)
    report = json.loads(result.stdout)
    errors = [
        f"{p['ruleId']}: {p['message']} at {p['location'][0]['pointer']}"
        for p in report["problems"]
        if p["severity"] == "error"
    ]
    assert report["totals"]["errors"] == 0, errors


def _body_type(route: str) -> str:
    return f'NonNullable<paths["{route}"]["post"]["requestBody"]>["content"]["application/json"]'


# bodies the service refuses: each must fail to type-check too (an unused @ts-expect-error is an error)
MINIMAL = {"tenantId": "demo", "poolId": "p", "duration": 60, "idempotencyKey": "k"}
REFUSED = [
    ("/v1/reservations", {k: v for k, v in MINIMAL.items() if k != "duration"}),
    ("/v1/reservations", {**MINIMAL, "spot": "yes"}),
    ("/v1/capacity/preview", {**MINIMAL, "binding": "vm"}),
    ("/v1/capacity/preview", {**MINIMAL, "nodeLabels": {}}),
    ("/v1/capacity/preview", {**MINIMAL, "devices": [{"class": "gpu", "count": "8"}]}),
]


def test_the_readme_bodies_type_check_against_the_generated_client(ts_tools: Path, tmp_path: Path) -> None:
    generated = _tool(ts_tools, "openapi-typescript", DOC, "--output", tmp_path / "api.d.ts", cwd=tmp_path)
    assert generated.returncode == 0, generated.stderr
    lines = ['import type { paths } from "./api";', ""]
    for index, (route, body) in enumerate(readme_request_bodies((ROOT / "README.md").read_text())):
        lines.append(f"export const readme{index}: {_body_type(route)} = {json.dumps(body, indent=2)};")
    for index, (route, body) in enumerate(REFUSED):
        lines += [
            "// @ts-expect-error the service refuses this body",
            f"export const refused{index}: {_body_type(route)} = {json.dumps(body)};",
        ]
    (tmp_path / "readme.ts").write_text("\n".join(lines) + "\n")
    checked = _tool(
        ts_tools,
        "tsc",
        "--strict",
        "--noEmit",
        "--skipLibCheck",  # the generated .d.ts and TypeScript's own: the check is on the bodies
        "--target",
        "es2022",
        "--module",
        "es2022",
        "--moduleResolution",
        "bundler",
        "readme.ts",
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr + "\n" + "\n".join(lines)
