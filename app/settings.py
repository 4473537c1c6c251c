"""One typed Settings object, read once from the environment and passed in (docs/architecture.md).

Environment variables: ``DATABASE_URL`` (unset -> embedded PostgreSQL), ``BC_BOOTSTRAP_ADMIN_KEY``,
``BC_DATA_DIR``, ``BC_SCHEDULER_WEIGHTS`` (JSON object, scorer id -> weight), ``BC_SCHEDULER_TOP_N``,
``BC_SCHEDULER_PLUGINS`` (JSON list of ``module:attribute`` import paths), ``BC_CAPACITY_MAX_ATTEMPTS``,
``BC_FLEET_HOSTS_FILE`` (TOML of SSH hosts for fleet collection), ``BC_CORS_ORIGINS`` (JSON list of
browser origins allowed to call the API), ``BC_LOG_FORMAT`` (``text`` or ``json``),
``BC_METRICS_GAUGE_TTL_SECONDS`` (how long the gauges read from PostgreSQL at a scrape are reused);
request bounds ``BC_MAX_BODY_BYTES``, ``BC_MAX_IMPORT_BODY_BYTES``, ``BC_MAX_PLACEMENT_BODY_BYTES``,
``BC_MAX_JSON_DEPTH``; rate limits ``BC_RATE_LIMIT`` and ``BC_AUTH_FAILURE_RATE_LIMIT`` (``limits``
notation: ``100/second``, ``5/minute``) and where they count, ``BC_RATE_LIMIT_STORAGE``; serving
``BC_LIMIT_CONCURRENCY`` and ``BC_KEEP_ALIVE_SECONDS`` (docs/operating.md); agents
``BC_CAPACITY_ENFORCE_DEVICE_LIMITS``, ``BC_NODE_HEARTBEAT_GRACE`` (seconds),
``BC_NODE_LIVENESS_SWEEP_SECONDS`` (docs/agent.md).
``BC_CAPACITY_PREEMPTION`` (default on: regular work may preempt spot work, docs/preemption.md),
``BC_CAPACITY_MAX_LEAD`` (how far ahead a window may start: seconds or an ISO 8601 duration such as
``P366D``), ``BC_CAPACITY_EARLIEST_PLANS`` (how many candidate starts an earliest-start search plans, at
most; docs/lifecycle.md, "Earliest start"), ``BC_CAPACITY_BACKFILL_DEPTH`` (how many pending reservations
per pool get a planned start, 0..1024; docs/lifecycle.md, "Planned starts"), ``BC_LIFECYCLE_INTERVAL``
(seconds between the lifecycle controller's sweeps),
``BC_LIFECYCLE_SWEEP`` (seconds between two full sweeps of the pending reservations, the safety net of
the wake edges; docs/lifecycle.md),
``BC_FLEET_HOSTS_FILE`` (TOML of SSH hosts for fleet collection), ``BC_METRICS_REQUIRE_KEY`` (``/metrics``
asks for an API key with ``compute:capacity:read`` on ``*``; docs/metrics.md), ``BC_PLAN_TOKEN_SECRET``
(the key plan tokens are signed with; unset: one stored in the database) and ``BC_PLAN_TOKEN_TTL``
(seconds a plan token is valid; docs/api.md, "Plan tokens"), ``BC_AUDIT_RETENTION`` (how long audit rows
are kept: seconds, ``90d``, ``12h`` or ISO 8601; docs/operating.md, "Audit log").

Every setting is checked when it is read: :func:`load_settings` raises :class:`SettingsError`, one line
naming the environment variable and what it accepts, and ``better-compute serve`` prints that line and
exits 2 (docs/operating.md, "Settings").
"""

from __future__ import annotations

import re
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

from app.database_url import hosts as database_hosts
from app.database_url import parse as parse_database_url

# what each setting whose check is not self-explanatory accepts (the second half of SettingsError's line)
ACCEPTED: dict[str, str] = {
    "DATABASE_URL": "postgresql://user[:password]@host[:port]/database, or several hosts "
    "host1:port1,host2:port2 with ?target_session_attrs=read-write",
    "BC_SCHEDULER_WEIGHTS": 'a JSON object of scorer id -> weight >= 0, e.g. {"spread": 0.5}',
    "BC_SCHEDULER_PLUGINS": "a JSON list of 'module:attribute' import paths of scheduler plugins",
    "BC_CAPACITY_MAX_LEAD": "seconds (86400) or an ISO 8601 duration (P366D), above 0",
    "BC_AUDIT_RETENTION": "seconds (7776000), a duration such as 90d, 12h, 30m or 2w, or ISO 8601 (P90D)",
    "BC_CORS_ORIGINS": 'a JSON list of origins, e.g. ["https://dash.example.com"]',
    "BC_RATE_LIMIT": "a rate such as 100/second or 6000/minute",
    "BC_AUTH_FAILURE_RATE_LIMIT": "a rate such as 10/second",
    "BC_AGENT_RATE_LIMIT": "a rate such as 5000/second",
    "BC_PLAN_TOKEN_SECRET": "at least 32 characters (the same on every replica)",
}
# settings whose value is never repeated in an error line (it may hold a password or a key)
SECRET_SETTINGS = frozenset({"DATABASE_URL", "BC_BOOTSTRAP_ADMIN_KEY", "BC_PLAN_TOKEN_SECRET"})
_SECONDS = re.compile(r"\s*[0-9]+(\.[0-9]*)?\s*")
_UNIT_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class SettingsError(ValueError):
    """A setting the service cannot start with: ``setting`` is the environment variable's name and the
    message one line, ``BC_X: <what is wrong>; accepted: <what is>`` (docs/operating.md, "Settings")."""

    def __init__(self, setting: str, problem: str, accepted: str | None = None) -> None:
        accepted = accepted if accepted is not None else ACCEPTED.get(setting)
        line = f"{setting}: {problem}" + (f"; accepted: {accepted}" if accepted else "")
        super().__init__(" ".join(line.split()))  # one line, whatever the parts held
        self.setting = setting


class Settings(BaseSettings):
    """Service settings; capacity and scheduler options follow docs/placement-rules.md ("Two placers")."""

    model_config = SettingsConfigDict(env_prefix="BC_", extra="ignore", populate_by_name=True)

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    bootstrap_admin_key: str | None = None
    data_dir: Path | None = None
    # scheduler: { weights, topN, plugins } (docs/placement-rules.md, "Scorers")
    scheduler_weights: dict[str, float] = Field(default_factory=dict)
    scheduler_top_n: int = Field(default=5, ge=1, le=100)
    scheduler_plugins: list[str] = Field(default_factory=list)
    # capacity: { maxAttempts } (docs/placement-rules.md, "Commit and lock order")
    capacity_max_attempts: int = Field(default=3, ge=1, le=16)
    # capacity: { placer, maxBatch } (docs/placement-rules.md, "Two placers"; docs/scaling.md)
    capacity_placer: Literal["inline", "pool-lease"] = "inline"
    capacity_max_batch: int = Field(default=64, ge=1, le=1024)
    # shortlist size floor: max(shortlist_min, 8 x topN) (docs/placement-rules.md, "The shortlist")
    capacity_shortlist_min: int = Field(default=48, ge=1)
    # a reservation's start is at most this far ahead of the database clock (422 naming ``start``)
    capacity_max_lead: timedelta = Field(default=timedelta(days=366), gt=timedelta(0))
    # the earliest-start search plans at most this many candidate starts (docs/lifecycle.md, "Earliest start")
    capacity_earliest_plans: int = Field(default=16, ge=1, le=256)
    # pending reservations per pool given a planned start, oldest first (docs/lifecycle.md, "Planned starts")
    capacity_backfill_depth: int = Field(default=16, ge=0, le=1024)
    # the lifecycle controller ends reservations within this many seconds of their end
    lifecycle_interval: float = Field(default=5.0, gt=0, le=3600)
    # every pool with pending reservations is planned again at least this often (wake edges' safety net)
    lifecycle_sweep: float = Field(default=30.0, gt=0, le=86400)
    fleet_hosts_file: Path | None = None
    # database connections each service process keeps open (plus a quarter more, closed when returned):
    # a request that finds none free waits for one. Too few and busy clients churn connections (each new
    # one costs PostgreSQL a backend and the driver its type lookups): 32 agents' heartbeats ran at 724/s
    # with 10 (+10) and about 1,000-1,400/s with 20-32 (bench/heartbeat.py). Two processes of 24 (+6)
    # stay well inside PostgreSQL's default max_connections of 100
    db_pool_size: int = Field(default=24, ge=1, le=200)
    # browser origins (``https://dash.example.com``) allowed to call the API; none: CORS is off
    cors_origins: list[str] = Field(default_factory=list)
    # the service's log lines (access log, errors): plain text, or one JSON object per line
    log_format: Literal["text", "json"] = "text"
    # bc_reservations / bc_atoms are read from PostgreSQL at a scrape and reused this long (seconds)
    metrics_gauge_ttl_seconds: float = Field(default=5.0, ge=0, le=300)
    # request bounds, enforced before a body is parsed (app/api/guard.py, docs/api.md)
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    max_import_body_bytes: int = Field(default=24 * 1024 * 1024, ge=1024)  # nvidia-smi -q -x XML
    max_placement_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)  # vq.* fleet documents
    max_json_depth: int = Field(default=64, ge=2, le=512)
    # per key; per client address for failed authentication (``limits`` rate notation)
    rate_limit: str = "100/second"
    auth_failure_rate_limit: str = "10/second"
    # per agent key (one whose grants are all compute:nodes:hello): a pool's agents share one key, and
    # 10,000 of them heartbeating every 10 s send 1,000 requests a second (docs/agent.md)
    agent_rate_limit: str = "5000/second"
    # where the rate limits count: postgresql (the whole deployment's windows, app/api/rate_limits.py) or
    # memory (each process on its own: N processes allow N times a limit)
    rate_limit_storage: Literal["postgresql", "memory"] = "postgresql"
    # seconds a key's principal stays cached in a process after a lookup (app/iam/key_cache.py); 0: off
    key_cache_seconds: float = Field(default=2.0, ge=0, le=60)
    # uvicorn: open connections + tasks beyond which it answers 503; idle keep-alive seconds
    limit_concurrency: int = Field(default=1000, ge=1)
    keep_alive_seconds: int = Field(default=75, ge=1, le=3600)

    @field_validator("rate_limit", "auth_failure_rate_limit", "agent_rate_limit")
    @classmethod
    def _rate(cls, value: str) -> str:
        from limits import parse

        parse(value)  # ValueError for anything but e.g. "100/second", "5 per minute"
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme.split("+")[0] not in ("postgresql", "postgres"):  # no host: a Unix socket
            raise ValueError("not a PostgreSQL URL")
        # ValueError for a port that is not a number in 0..65535, of one host or of a list of hosts
        if not database_hosts(parse_database_url(value)):
            parts.port  # noqa: B018
        return value

    @field_validator("scheduler_weights")
    @classmethod
    def _weights_not_negative(cls, value: dict[str, float]) -> dict[str, float]:
        negative = sorted(name for name, weight in value.items() if not weight >= 0)  # NaN too
        if negative:
            raise ValueError(f"weight of {', '.join(negative)} is below 0")
        return value

    @field_validator("capacity_max_lead", mode="before")
    @classmethod
    def _lead_in_seconds(cls, value: Any) -> Any:
        # the environment gives a string: plain seconds ("86400") become a number, which pydantic reads
        # as seconds; anything else must be an ISO 8601 duration ("P366D") and is left to pydantic
        if isinstance(value, str) and _SECONDS.fullmatch(value):
            return float(value)
        return value

    # requiredCapabilities: host resources ask for bc.dev/cap.devices.limits (off: nodes registered without
    # an agent have no daemon to enforce limits; see docs/agent.md)
    capacity_enforce_device_limits: bool = False
    # BC_CAPACITY_PREEMPTION: a regular request that does not fit may preempt spot work (docs/preemption.md)
    capacity_preemption: bool = True
    # liveness: an agent's node is "heartbeat lost" after this many seconds without a heartbeat (None: 3 x
    # the interval its Hello carried); the sweep runs every node_liveness_sweep_seconds
    node_heartbeat_grace: float | None = Field(default=None, gt=0)
    node_liveness_sweep_seconds: float = Field(default=5.0, gt=0, le=3600)
    # set by `serve --demo`: the service heartbeats the demo pool's nodes in process
    demo_agents: bool = False
    # set by `serve --workers N` (N > 1): prometheus_client's folder where every worker keeps its counters,
    # so that one scrape sums them all (app/observability/multiprocess.py; docs/metrics.md)
    metrics_multiprocess_dir: Path | None = Field(default=None, validation_alias="PROMETHEUS_MULTIPROC_DIR")
    # /metrics asks for an API key holding compute:capacity:read on * (off: open, as before; docs/metrics.md)
    metrics_require_key: bool = False
    # plan tokens (docs/api.md, "Plan tokens"): the HMAC key they are signed with, the same on every
    # replica (unset: a random one created once and stored in the database), and how long one is valid
    plan_token_secret: str | None = Field(default=None, min_length=32, repr=False)
    plan_token_ttl: int = Field(default=300, ge=1, le=86400)
    # how long audit rows are kept (docs/operating.md, "Audit log"): seconds, 90d, 12h, or ISO 8601
    audit_retention: timedelta = Field(default=timedelta(days=90), gt=timedelta(0))

    @field_validator("audit_retention", mode="before")
    @classmethod
    def _retention(cls, value: Any) -> Any:
        # "7776000" (seconds) and "90d" / "12h" / "30m" / "2w" become seconds; ISO 8601 ("P90D") is pydantic's
        if isinstance(value, str):
            if _SECONDS.fullmatch(value):
                return float(value)
            unit = _UNIT_DURATION.fullmatch(value.strip())
            if unit:
                return float(unit[1]) * _UNIT_SECONDS[unit[2]]
        return value


def setting_name(field: str) -> str:
    """The environment variable of a :class:`Settings` field: ``scheduler_top_n`` ->
    ``BC_SCHEDULER_TOP_N``; ``database_url`` -> ``DATABASE_URL`` (its alias)."""
    info = Settings.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, str):
        return info.validation_alias
    return "BC_" + field.upper()


def _problem(error: Any, setting: str) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "time_delta_parsing":
        message = "not a duration"
    nested = ".".join(str(part) for part in error["loc"][1:])
    where = f" at {nested}" if nested else ""
    if setting in SECRET_SETTINGS or error["type"] == "missing":
        return f"{message}{where}"
    shown = repr(error["input"]) if isinstance(error["input"], str) else str(error["input"])
    return f"{shown[:80]}{where}: {message}"


def load_settings(**values: Any) -> Settings:
    """:class:`Settings` from the environment (and ``values``, by field name). Raises
    :class:`SettingsError` for the first setting that is malformed or out of range, one line naming
    its environment variable and what it accepts."""
    try:
        return Settings(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = error["loc"]
        field = str(loc[0]) if loc else ""
        setting = field if field in SECRET_SETTINGS else setting_name(field)
        raise SettingsError(setting, _problem(error, setting)) from None
    except SourceError as exc:  # the environment held text the field's type cannot be read from (JSON)
        field = str(exc).split('"')[1] if '"' in str(exc) else ""
        setting = setting_name(field)
        raise SettingsError(setting, f"cannot be read: {exc.__cause__ or exc}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once. Raises :class:`SettingsError` (one line) for a bad one."""
    return load_settings()
