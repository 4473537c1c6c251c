"""``create_app()``: routers, error handlers and the lifespan (engine, embedded database, pool cache,
the lifecycle controller)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import Depends, FastAPI

from app.api import (
    agents,
    audit,
    health,
    iam,
    inventory,
    node_maintenance,
    quota,
    reservation_batch,
    reservations,
    ui,
    usage,
)
from app.api.audit_trail import AuditTrail
from app.api.contract import install_contract
from app.api.cors import BrowserCors
from app.api.deps import Services
from app.api.errors import install_error_handlers
from app.api.guard import RequestGuard
from app.api.text_guard import check_json_body
from app.capacity.config import CapacityConfig, PlanTokenKeys
from app.capacity.controllers.backfill import START_PLANNED, plan_pool, start_all_planned
from app.capacity.controllers.lifecycle import Lifecycle, LifecycleTask, default_tasks
from app.capacity.controllers.repair_first import BOOKING_REPAIR, REPAIR_LISTENER, RepairController
from app.capacity.controllers.wake import LISTENER_RETRY, WAKE_LISTENER, WAKE_PENDING, WakeController
from app.capacity.planning.snapshot import PoolCache
from app.capacity.queue.worker import QUEUE_LISTENER, QUEUE_WORKER, QueueWorker
from app.db import rate_counters
from app.db.engine import create_engine, migrate_async, resolve_database_url
from app.iam import audit_log
from app.iam.audit_log import AUDIT_PRUNE_SECONDS, PRUNE_AUDIT
from app.iam.key_cache import PrincipalCache
from app.inventory.liveness_task import HEARTBEAT_LIVENESS, sweep_once
from app.observability.logs import configure_logging
from app.observability.metrics import scrape_from
from app.observability.middleware import AccessLogMiddleware
from app.observability.multiprocess import process_exited
from app.placement.options import SchedulerOptions
from app.placement.plugins import SchedulerPlugin, load_plugins
from app.placement.scorers import SCORER_NAMES
from app.settings import Settings, SettingsError, get_settings

API_VERSION = "0.1.0"
PRUNE_RATE_WINDOWS = "prune-rate-windows"  # the lifecycle task, and how often it runs (seconds)
PRUNE_RATE_WINDOWS_SECONDS = 60.0


def scheduler_plugins(settings: Settings) -> tuple[SchedulerPlugin, ...]:
    """The plugins of ``BC_SCHEDULER_PLUGINS``, imported, and ``BC_SCHEDULER_WEIGHTS`` checked against
    the scorers they and the built-ins declare. Raises :class:`~app.settings.SettingsError` (one line)
    for a path that does not import a plugin or a weight of no scorer (docs/operating.md, "Settings")."""
    try:
        plugins = load_plugins(settings.scheduler_plugins)
    except ValueError as exc:
        raise SettingsError("BC_SCHEDULER_PLUGINS", str(exc)) from None
    known = [*SCORER_NAMES, *(scorer.id for plugin in plugins for scorer in plugin.scorers)]
    unknown = sorted(set(settings.scheduler_weights) - set(known))
    if unknown:
        raise SettingsError(
            "BC_SCHEDULER_WEIGHTS",
            f"no scorer is named {', '.join(repr(name) for name in unknown)}",
            f"weights >= 0 of the scorers {', '.join(known)}",
        )
    return plugins


def capacity_config(settings: Settings) -> CapacityConfig:
    """Scheduler options and max attempts from settings (plugins loaded by import path). Raises
    :class:`~app.settings.SettingsError` for a bad plugin path or a weight of no scorer."""
    options = SchedulerOptions(
        weights=dict(settings.scheduler_weights),
        top_n=settings.scheduler_top_n,
        plugins=scheduler_plugins(settings),
    )
    return CapacityConfig(
        options=options,
        max_attempts=settings.capacity_max_attempts,
        shortlist_min=settings.capacity_shortlist_min,
        enforce_device_limits=settings.capacity_enforce_device_limits,
        max_lead=settings.capacity_max_lead,
        earliest_plans=settings.capacity_earliest_plans,
        backfill_depth=settings.capacity_backfill_depth,
        preemption=settings.capacity_preemption,
        placer=settings.capacity_placer,
        max_batch=settings.capacity_max_batch,
        plan_tokens=PlanTokenKeys(settings.plan_token_secret, settings.plan_token_ttl),
    )


def lifecycle_tasks(
    settings: Settings,
    wake: WakeController | None = None,
    queue: QueueWorker | None = None,
    repair: RepairController | None = None,
) -> list[LifecycleTask]:
    """The lifecycle controller's tasks (docs/lifecycle.md): the built-in ones, the liveness sweep of
    agents' nodes, the audit log's prune (docs/operating.md, "Audit log"), the prune of ended rate-limit
    windows and, when given, the wake-edge controller's listener and wake task, the pool-lease worker's,
    and BookingRepair's listener and task (repair first), each safe with several replicas."""
    liveness = LifecycleTask(
        HEARTBEAT_LIVENESS,
        settings.node_liveness_sweep_seconds,
        partial(sweep_once, grace_seconds=settings.node_heartbeat_grace),
    )
    prune = LifecycleTask(
        PRUNE_AUDIT, AUDIT_PRUNE_SECONDS, partial(audit_log.prune, retention=settings.audit_retention)
    )
    # the deployment's rate-limit windows that ended (docs/operating.md, "Rate limits")
    prune_rates = LifecycleTask(PRUNE_RATE_WINDOWS, PRUNE_RATE_WINDOWS_SECONDS, rate_counters.prune)
    tasks = [*default_tasks(settings.lifecycle_interval), liveness, prune, prune_rates]
    if wake is not None:
        tasks += [
            LifecycleTask(WAKE_PENDING, wake.sweep_seconds, wake.run),
            LifecycleTask(WAKE_LISTENER, LISTENER_RETRY, wake.listen),
            # planned starts come due (docs/lifecycle.md, "Planned starts")
            LifecycleTask(
                START_PLANNED, settings.lifecycle_interval, partial(start_all_planned, config=wake.config)
            ),
        ]
    if repair is not None:  # BookingRepair on its own task, ahead of the wakes (docs/lifecycle.md)
        tasks += [
            LifecycleTask(BOOKING_REPAIR, repair.sweep_seconds, repair.run),
            LifecycleTask(REPAIR_LISTENER, LISTENER_RETRY, repair.listen),
        ]
    if queue is not None:  # the pool-lease batch worker (issue 15): idle until a queue edge
        tasks += [
            LifecycleTask(QUEUE_WORKER, queue.sweep_seconds, queue.run),
            LifecycleTask(QUEUE_LISTENER, LISTENER_RETRY, queue.listen),
        ]
    return tasks


def create_app(settings: Settings | None = None, *, run_migrations: bool = True) -> FastAPI:
    """The FastAPI application. On start it resolves the database (``DATABASE_URL`` or the embedded
    PostgreSQL), migrates it to head when ``run_migrations``, and builds the shared services."""
    settings = settings or get_settings()
    config = capacity_config(settings)
    configure_logging(settings.log_format)
    scrape_from(settings.metrics_multiprocess_dir)  # with several workers: every worker's metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = resolve_database_url(settings.database_url, settings.data_dir)
        if run_migrations:
            await migrate_async(url)
        engine = create_engine(url, pool_size=settings.db_pool_size)
        cache = PoolCache()
        keys = PrincipalCache(settings.key_cache_seconds)
        app.state.services = Services(
            engine=engine, cache=cache, capacity=config, settings=settings, keys=keys
        )
        wake = WakeController(cache, config, settings.lifecycle_sweep)
        queue = QueueWorker(cache, config, settings.lifecycle_sweep)
        repair = RepairController(cache, config, settings.lifecycle_interval)
        lifecycle = Lifecycle(engine, lifecycle_tasks(settings, wake, queue, repair))
        wake.poke = partial(lifecycle.poke, WAKE_PENDING)
        wake.plan_pool = lambda engine, pool_id: plan_pool(engine, cache, config, pool_id)
        wake.yield_to = repair.wait_for_repairs  # repair first: a wake waits while a repair is asked for
        repair.poke = partial(lifecycle.poke, BOOKING_REPAIR)
        queue.poke = partial(lifecycle.poke, QUEUE_WORKER)
        app.state.queue = queue
        app.state.lifecycle = lifecycle
        app.state.wake = wake
        app.state.repair = repair
        lifecycle.start()
        demo = None
        if settings.demo_agents:  # `serve --demo`: the service heartbeats the demo pool's nodes itself
            from app.inventory.demo_pool import run_demo_heartbeats

            demo = asyncio.create_task(run_demo_heartbeats(engine))
        try:
            yield
        finally:
            if demo is not None:
                demo.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await demo
            await lifecycle.stop()
            await engine.dispose()
            process_exited(settings.metrics_multiprocess_dir)

    app = FastAPI(
        dependencies=[Depends(check_json_body)],
        title="better-compute",
        version=API_VERSION,
        description="Reserve, preview and release GPUs on pools of nodes; explain where work should run.",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc are app/api/ui.py's, with their assets served here (offline)
        redoc_url=None,
    )
    install_error_handlers(app)
    install_contract(app)  # after the error shapes: it refines their document
    app.add_middleware(RequestGuard, settings=settings)  # inner: authenticate and bound the body first
    app.add_middleware(AuditTrail)  # around the guard: its 401/403/413 are recorded too
    from app.api import placement

    # in the order requests are matched: the batch route before the reservation routes
    # (/v1/reservations/batch is not a reservation id); last the dashboard and the docs pages, which are
    # not in the OpenAPI document
    routers = (
        health.router,
        iam.router,
        inventory.router,
        node_maintenance.router,
        quota.router,
        reservation_batch.router,
        reservations.router,
        agents.router,
        audit.router,
        usage.router,
        placement.router,
        ui.router,
    )
    for router in routers:
        app.include_router(router)
    # middlewares, innermost first (each add wraps the ones before): CORS, then the access log outermost
    if settings.cors_origins:
        app.add_middleware(BrowserCors, origins=settings.cors_origins)
    app.add_middleware(AccessLogMiddleware, routes=app.routes)
    return app


def create_app_without_migrations() -> FastAPI:
    """The app for ``better-compute serve`` (uvicorn factory): the CLI migrated before starting."""
    return create_app(run_migrations=False)
