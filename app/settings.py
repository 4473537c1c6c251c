"""One typed Settings object, read once from the environment and passed in (STYLE.md habit 8).

Environment variables: ``DATABASE_URL`` (unset -> embedded PostgreSQL), ``BC_BOOTSTRAP_ADMIN_KEY``,
``BC_DATA_DIR``, ``BC_SCHEDULER_WEIGHTS`` (JSON object, scorer id -> weight), ``BC_SCHEDULER_TOP_N``,
``BC_SCHEDULER_PLUGINS`` (JSON list of ``module:attribute`` import paths), ``BC_CAPACITY_MAX_ATTEMPTS``,
``BC_FLEET_HOSTS_FILE`` (TOML of SSH hosts for fleet collection), ``BC_CORS_ORIGINS`` (JSON list of
browser origins allowed to call the API), ``BC_LOG_FORMAT`` (``text`` or ``json``),
``BC_METRICS_GAUGE_TTL_SECONDS`` (how long the gauges read from PostgreSQL at a scrape are reused);
request bounds ``BC_MAX_BODY_BYTES``, ``BC_MAX_IMPORT_BODY_BYTES``, ``BC_MAX_PLACEMENT_BODY_BYTES``,
``BC_MAX_JSON_DEPTH``; rate limits ``BC_RATE_LIMIT`` and ``BC_AUTH_FAILURE_RATE_LIMIT`` (``limits``
notation: ``100/second``, ``5/minute``); serving ``BC_LIMIT_CONCURRENCY`` and ``BC_KEEP_ALIVE_SECONDS``
(docs/operating.md); agents ``BC_CAPACITY_ENFORCE_DEVICE_LIMITS``, ``BC_NODE_HEARTBEAT_GRACE`` (seconds),
``BC_NODE_LIVENESS_SWEEP_SECONDS`` (docs/agent.md).
``BC_CAPACITY_PREEMPTION`` (default on: regular work may preempt spot work, docs/preemption.md),
``BC_CAPACITY_MAX_LEAD`` (how far ahead a window may start: seconds or an ISO 8601 duration such as
``P366D``), ``BC_LIFECYCLE_INTERVAL`` (seconds between the lifecycle controller's sweeps),
``BC_LIFECYCLE_SWEEP`` (seconds between two full sweeps of the pending reservations, the safety net of
the wake edges; docs/lifecycle.md),
``BC_FLEET_HOSTS_FILE`` (TOML of SSH hosts for fleet collection).
"""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Service settings; capacity and scheduler options follow seed 000 ("Two placers")."""

    model_config = SettingsConfigDict(env_prefix="BC_", extra="ignore", populate_by_name=True)

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    bootstrap_admin_key: str | None = None
    data_dir: Path | None = None
    # scheduler: { weights, topN, plugins } (seed 000, "Scorers")
    scheduler_weights: dict[str, float] = Field(default_factory=dict)
    scheduler_top_n: int = Field(default=5, ge=1, le=100)
    scheduler_plugins: list[str] = Field(default_factory=list)
    # capacity: { maxAttempts } (seed 000, "Commit and lock order")
    capacity_max_attempts: int = Field(default=3, ge=1, le=16)
    # capacity: { placer, maxBatch } (seed 000, "Two placers"; docs/scaling.md)
    capacity_placer: Literal["inline", "pool-lease"] = "inline"
    capacity_max_batch: int = Field(default=64, ge=1, le=1024)
    # shortlist size floor: max(shortlist_min, 8 x topN) (seed 000, "The shortlist")
    capacity_shortlist_min: int = Field(default=48, ge=1)
    # a reservation's start is at most this far ahead of the database clock (422 naming ``start``)
    capacity_max_lead: timedelta = Field(default=timedelta(days=366), gt=timedelta(0))
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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()
