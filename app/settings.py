"""One typed Settings object, read once from the environment and passed in (STYLE.md habit 8).

Environment variables: ``DATABASE_URL`` (unset -> embedded PostgreSQL), ``BC_BOOTSTRAP_ADMIN_KEY``,
``BC_DATA_DIR``, ``BC_SCHEDULER_WEIGHTS`` (JSON object, scorer id -> weight), ``BC_SCHEDULER_TOP_N``,
``BC_SCHEDULER_PLUGINS`` (JSON list of ``module:attribute`` import paths), ``BC_CAPACITY_MAX_ATTEMPTS``,
``BC_CAPACITY_MAX_LEAD`` (how far ahead a window may start: seconds or an ISO 8601 duration such as
``P366D``), ``BC_LIFECYCLE_INTERVAL`` (seconds between the lifecycle controller's sweeps),
``BC_FLEET_HOSTS_FILE`` (TOML of SSH hosts for fleet collection).
"""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from pathlib import Path

from pydantic import Field
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
    # shortlist size floor: max(shortlist_min, 8 x topN) (seed 000, "The shortlist")
    capacity_shortlist_min: int = Field(default=48, ge=1)
    # a reservation's start is at most this far ahead of the database clock (422 naming ``start``)
    capacity_max_lead: timedelta = Field(default=timedelta(days=366), gt=timedelta(0))
    # the lifecycle controller ends reservations within this many seconds of their end
    lifecycle_interval: float = Field(default=5.0, gt=0, le=3600)
    fleet_hosts_file: Path | None = None
    db_pool_size: int = Field(default=10, ge=1, le=200)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()
