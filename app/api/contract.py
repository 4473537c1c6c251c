"""The OpenAPI document as strict as the service (docs/api.md, "The contract").

FastAPI writes the document from the models; three things it leaves out or says in a way generated
clients misread are settled here, once, for the served ``/openapi.json`` and the checked-in copy alike:

- **servers**: the address the document was read from (relative ``/``, so /docs works on any port), then the
  address ``better-compute serve`` answers on with its defaults.
- **security of every operation**: ``/healthz`` and ``/readyz`` need no key (the request guard passes
  them, app/api/guard.py), so they declare ``security: []``; ``/metrics`` is open unless
  ``BC_METRICS_REQUIRE_KEY`` is on, so it declares either no key or the bearer key
  (``[{}, {"HTTPBearer": []}]``); every ``/v1/`` route declares the bearer key through its
  ``current_principal`` dependency.
- **request schemas say what may be left out, and which names a map takes**: a field with a default is
  absent from ``required`` already, but openapi-typescript (with its default ``defaultNonNullable``)
  reads a ``default`` on a component's property as "always present" and makes the field required, so a
  client could not leave out ``binding`` or ``spot``. In the schemas reachable from a request body the
  default is therefore stated in the property's description (``Default: `device`.``), not as the
  ``default`` keyword. A map whose keys pydantic checks against a pattern (``resources``, ``labels``)
  gets the pattern in ``propertyNames`` too: ``patternProperties`` alone only constrains the values of
  matching keys and lets any other key through.

Every rule on a single value is written on the model itself, with standard keywords (decimal amounts
through :class:`app.jsonnum.JsonDecimal`, patterns, enums); ``tests/api/test_openapi_standard.py`` fails
when a keyword outside JSON Schema 2020-12 / OpenAPI 3.1 appears anywhere in the document.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI

from app.api.deps import bearer
from app.api.guard import GUARDED_PREFIX, METRICS_PATH
from app.client.api import DEFAULT_SERVER

SCHEMA_REF = "#/components/schemas/"
SERVERS = [
    {
        "url": "/",
        "description": "the address this document was read from (what /docs' Try it out calls, on any port)",
    },
    {
        "url": DEFAULT_SERVER,
        "description": "`better-compute serve` with its default --host and --port; a deployment answers "
        "at its own address",
    },
]


def strict_contract(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (an OpenAPI 3.1 dict as FastAPI writes it) with servers, every operation's security
    and the request schemas settled as the module docstring says. Changes ``document`` and returns it;
    applying it twice changes nothing more."""
    document.setdefault("servers", SERVERS)
    for path, item in document.get("paths", {}).items():
        for operation in item.values():
            if "security" in operation or path.startswith(GUARDED_PREFIX):
                continue
            if path == METRICS_PATH:  # a key only where the deployment asks for one (docs/metrics.md)
                operation["security"] = [{}, {bearer.scheme_name: []}]
            else:
                operation["security"] = []  # public: the guard asks no key outside /v1/
    schemas = document.get("components", {}).get("schemas", {})
    for name in sorted(request_schema_names(document)):
        for schema in _object_schemas(schemas[name]):
            _defaults_described(schema)
            _key_pattern_declared(schema)
    return document


def request_schema_names(document: dict[str, Any]) -> set[str]:
    """The component schemas a request body refers to, directly or through other schemas."""
    schemas = document.get("components", {}).get("schemas", {})
    found: set[str] = set()
    pending = [
        operation["requestBody"]
        for item in document.get("paths", {}).values()
        for operation in item.values()
        if "requestBody" in operation
    ]
    while pending:
        for ref in _refs(pending.pop()):
            name = ref.removeprefix(SCHEMA_REF)
            if ref.startswith(SCHEMA_REF) and name not in found and name in schemas:
                found.add(name)
                pending.append(schemas[name])
    return found


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _object_schemas(schema: Any) -> Iterator[dict[str, Any]]:
    """``schema`` and every schema nested in it (properties, items, anyOf members, ...), not following
    ``$ref`` and not entering values (``default``, ``enum``, ``const``, ``examples``)."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "$defs", "dependentSchemas"):
            for member in value.values():
                yield from _object_schemas(member)
        elif key in ("allOf", "anyOf", "oneOf", "prefixItems"):
            for member in value:
                yield from _object_schemas(member)
        elif key in ("items", "additionalProperties", "propertyNames", "not", "if", "then", "else"):
            yield from _object_schemas(value)


def _defaults_described(schema: dict[str, Any]) -> None:
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict) and "default" in prop:
            default = prop.pop("default")
            text = default if isinstance(default, str) and default else json.dumps(default)
            said = prop.get("description", "").rstrip()
            if said and not said.endswith("."):
                said += "."
            prop["description"] = f"{said} Default: `{text}`.".lstrip()


def _key_pattern_declared(schema: dict[str, Any]) -> None:
    patterns = list(schema.get("patternProperties", {}))
    if len(patterns) == 1 and "additionalProperties" not in schema:
        names = schema.setdefault("propertyNames", {})
        names.setdefault("pattern", patterns[0])


def install_contract(app: FastAPI) -> None:
    """Serve (and write, ``better-compute openapi``) the document through :func:`strict_contract`;
    install after :func:`app.api.errors.install_error_handlers`, whose document this one refines."""
    documented = app.openapi
    strict: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not strict:
            strict.update(strict_contract(documented()))
        return strict

    app.openapi = openapi  # type: ignore[method-assign]
