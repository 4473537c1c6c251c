"""The round trips of an inline reserve (issue 15, done-when 3): at most 10 per POST /v1/reservations,
counted on the app's own engine (statements, BEGIN / COMMIT / SAVEPOINT, and pool pre-pings), plus the
request's audit row, inserted in the same transaction before its COMMIT (docs/operating.md, "Audit
log"): 11."""

from __future__ import annotations

from typing import Any

import httpx

from tests.factories import add_node, gpu_node, make_pool, reservation
from tests.round_trips import counting

MAX_ROUND_TRIPS = 10 + 1  # the reserve's own, and the audit row's INSERT


async def test_an_inline_reserve_takes_at_most_ten_round_trips_and_its_audit_row(
    app: Any, admin_client: httpx.AsyncClient
) -> None:
    pool = await make_pool(admin_client)
    for name in ("a", "b", "c"):
        await add_node(admin_client, pool, gpu_node(name))
    engine = app.state.services.engine
    # warm: the pool cache is loaded and the statements prepared on the pooled connections
    for _ in range(3):
        r = await admin_client.post("/v1/reservations", json=reservation(pool, 1, resources={"cpu": 2}))
        assert r.status_code == 201 and r.json()["status"] == "placed", r.text
    with counting(engine) as trips:
        r = await admin_client.post("/v1/reservations", json=reservation(pool, 1, resources={"cpu": 2}))
    assert r.status_code == 201 and r.json()["status"] == "placed", r.text
    assert trips.count <= MAX_ROUND_TRIPS, f"{trips.count} round trips:\n{trips}"
    audit = [i for i, sent in enumerate(trips.sent) if sent.startswith("INSERT INTO audit_events")]
    assert len(audit) == 1 and trips.sent[audit[0] + 1] == "COMMIT", (
        f"one audit INSERT before COMMIT:\n{trips}"
    )
