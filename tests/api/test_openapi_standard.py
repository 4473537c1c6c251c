"""The contract is as strict as the service, in words every tool reads (issue 22; docs/api.md, "The
contract"): every schema keyword in ``openapi/openapi.json`` is a JSON Schema 2020-12 / OpenAPI 3.1 one
(or an ``x-`` extension), the document names its servers and the security of every operation, request
schemas carry no ``default`` that openapi-typescript would turn into a required field, and for the rules
written as keywords the document and the service decide a table of values alike."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ValidationError

from app.api.contract import request_schema_names, strict_contract
from app.api.guard import GUARDED_PREFIX

ROOT = Path(__file__).resolve().parents[2]
DOC = json.loads((ROOT / "openapi" / "openapi.json").read_text())

# JSON Schema 2020-12: core, applicator, unevaluated, validation, meta-data, format-annotation, content
# vocabularies; then the OpenAPI 3.1 Schema Object's own fields.
STANDARD_KEYWORDS = frozenset(
    {
        "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment",
        "$defs",
        "prefixItems", "items", "contains", "additionalProperties", "properties", "patternProperties",
        "dependentSchemas", "propertyNames", "if", "then", "else", "allOf", "anyOf", "oneOf", "not",
        "unevaluatedItems", "unevaluatedProperties",
        "type", "const", "enum", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
        "maxContains", "minContains", "maxProperties", "minProperties", "required", "dependentRequired",
        "title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples",
        "format",
        "contentEncoding", "contentMediaType", "contentSchema",
        "discriminator", "xml", "externalDocs", "example",
    }
)  # fmt: skip
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SCHEMA_VALUES = (
    "items", "contains", "additionalProperties", "propertyNames", "if", "then", "else", "not",
    "unevaluatedItems", "unevaluatedProperties", "contentSchema",
)  # fmt: skip


def _schemas_of(schema: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in ``schema`` with its location, following the keywords that hold schemas
    and never entering values (``enum``, ``const``, ``default``, ``examples``)."""
    if not isinstance(schema, dict):
        return  # a boolean schema
    yield where, schema
    for key, value in schema.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for name, member in value.items():
                yield from _schemas_of(member, f"{where}/{key}/{name}")
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for index, member in enumerate(value):
                yield from _schemas_of(member, f"{where}/{key}/{index}")
        elif key in SCHEMA_VALUES:
            yield from _schemas_of(value, f"{where}/{key}")


def _document_schemas(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema of an OpenAPI 3.1 document: the components' and those inline in parameters, request
    bodies, responses and their headers."""
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        yield from _schemas_of(schema, f"#/components/schemas/{name}")
    for path, item in doc["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            for parameter in op.get("parameters", []):
                yield from _schemas_of(parameter.get("schema"), f"{where} parameter {parameter['name']}")
            for media, content in op.get("requestBody", {}).get("content", {}).items():
                yield from _schemas_of(content.get("schema"), f"{where} body {media}")
            for status, answer in op["responses"].items():
                for media, content in answer.get("content", {}).items():
                    yield from _schemas_of(content.get("schema"), f"{where} {status} {media}")
                for header, spec in answer.get("headers", {}).items():
                    yield from _schemas_of(spec.get("schema"), f"{where} {status} header {header}")


def non_standard_keywords(doc: dict[str, Any]) -> list[str]:
    """``location: keyword`` for each keyword that is neither standard nor an ``x-`` extension."""
    return [
        f"{where}: {key}"
        for where, schema in _document_schemas(doc)
        for key in schema
        if key not in STANDARD_KEYWORDS and not key.startswith("x-")
    ]


def test_every_schema_keyword_is_standard() -> None:
    assert non_standard_keywords(DOC) == []


def test_the_walk_reaches_deep_schemas_and_sees_a_private_keyword() -> None:
    planted = copy.deepcopy(DOC)
    amount = planted["components"]["schemas"]["ReservationRequest"]["properties"]["resources"]
    [value] = amount["patternProperties"].values()
    value["gt"] = 0  # what pydantic wrote before JsonDecimal
    operation = planted["paths"]["/v1/capacity/preview"]["post"]
    operation["requestBody"]["content"]["application/json"]["schema"] = {
        "anyOf": [{"$ref": "#/components/schemas/ReservationRequest"}, {"max_digits": 20}],
        "x-note": "extensions are allowed",
    }
    found = non_standard_keywords(planted)
    assert len(found) == 2, found
    assert found[0].startswith("#/components/schemas/ReservationRequest/properties/resources/")
    assert (
        found[0].endswith(": gt")
        and found[1] == "POST /v1/capacity/preview body application/json/anyOf/1: max_digits"
    )


def test_the_document_names_a_server() -> None:
    assert DOC["servers"] and all(server["url"] for server in DOC["servers"])


def test_every_operation_declares_its_security() -> None:
    bearer = [
        name for name, scheme in DOC["components"]["securitySchemes"].items() if scheme["type"] == "http"
    ]
    assert bearer == ["HTTPBearer"]
    public = set()
    for path, item in DOC["paths"].items():
        for method, op in item.items():
            assert "security" in op, (method, path)
            if path.startswith(GUARDED_PREFIX):
                assert op["security"] == [{"HTTPBearer": []}], (method, path)
            elif path == "/metrics":  # open unless BC_METRICS_REQUIRE_KEY is on: no key, or the bearer key
                assert op["security"] == [{}, {"HTTPBearer": []}]
                assert {"401", "403"} <= set(op["responses"])
            else:
                assert op["security"] == [], (method, path)
                public.add(path)
    assert public == {"/healthz", "/readyz"}


def test_request_schemas_state_defaults_in_words_not_as_a_default_keyword() -> None:
    """openapi-typescript makes a component property with ``default`` required; a request field with a
    default must stay optional for the client that sends it."""
    names = request_schema_names(DOC)
    assert {"ReservationRequest", "DeviceRequestBody", "NodeCreate", "TaintBody"} <= names
    schemas = DOC["components"]["schemas"]
    for name in names:
        for where, schema in _schemas_of(schemas[name], name):
            for prop, spec in schema.get("properties", {}).items():
                assert "default" not in spec, f"{where}.{prop}"
    binding = schemas["ReservationRequest"]["properties"]["binding"]
    assert binding["description"] == "Default: `device`."
    assert "binding" not in schemas["ReservationRequest"]["required"]
    # an answer keeps its defaults: only request schemas are changed
    assert schemas["ErrorDetail"]["properties"]["details"]["default"] == {}


def test_the_refinement_is_idempotent_and_leaves_declared_security() -> None:
    again = strict_contract(copy.deepcopy(DOC))
    assert again == DOC


def test_a_map_names_the_keys_it_takes() -> None:
    resources = DOC["components"]["schemas"]["ReservationRequest"]["properties"]["resources"]
    [pattern] = resources["patternProperties"]
    assert resources["propertyNames"]["pattern"] == pattern
    validator = Draft202012Validator(resources)
    assert validator.is_valid({"gpu.mem": 1}) and not validator.is_valid({"CPUs": 1})


# -- the document and the service decide alike -------------------------------------------------------


def _resolved(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator({**schema, "components": DOC["components"]})


def _accepts(model: type[BaseModel], body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


def _selecting(expression: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"class": "gpu", "count": 1, "selector": {"matchExpressions": [expression]}}]


RESERVATION = {"tenantId": "acme", "poolId": "pool_1", "duration": "1h", "idempotencyKey": "k-1"}


# Values the service accepts or refuses; JSON Schema validators work on binary floats, so the table keeps
# to amounts a float holds exactly (0.1 is valid per the specification's multipleOf but not to every
# validator: docs/api.md, "The contract").
@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("resources", {"cpu": 4}, True),
        ("resources", {"cpu": 0.5}, True),
        ("resources", {"cpu": 0.000001}, True),
        ("resources", {"cpu": 0}, False),
        ("resources", {"cpu": -2}, False),
        ("resources", {"cpu": 0.0000005}, False),
        ("resources", {"cpu": 1e14}, False),
        ("resources", {"cpu": 99999999999999}, True),
        ("resources", {"cpu": "4"}, False),
        ("resources", {"cpu": True}, False),
        ("resources", {"CPU": 1}, False),
        ("duration", "90m", True),
        ("duration", " 2 h ", True),
        ("duration", 3600, True),
        ("duration", 366 * 86400, True),
        ("duration", 366 * 86400 + 1, False),
        ("duration", "0m", False),
        ("duration", 0, False),
        ("duration", "1y", False),
        ("duration", "1.5h", False),
        ("duration", True, False),
        ("binding", "node", True),
        ("binding", "vm", False),
        ("spot", "yes", False),
        ("start", "2026-12-01T12:00:00Z", True),
        ("idempotencyKey", "a b", False),
        ("devices", [{"class": "gpu", "count": 0}], False),
        ("devices", [{"class": "gpu", "count": 4097}], False),
        ("devices", [{"class": "GPU", "count": 1}], False),
        ("devices", _selecting({"key": "9x", "op": "Exists"}), False),
        ("devices", _selecting({"key": "a" * 254, "op": "Exists"}), False),
        ("devices", _selecting({"key": "x", "op": "In", "values": ["v"] * 65}), False),
        ("devices", [{"class": "gpu", "count": 1, "topology": "ring"}], False),
        ("gang", {"members": 0}, False),
    ],
)  # fmt: skip
def test_a_reservation_request_field_is_decided_alike(field: str, value: Any, ok: bool) -> None:
    from app.placement.request import ReservationRequest

    body = {**RESERVATION, field: value}
    if field != "resources" and field != "devices":
        body["resources"] = {"cpu": 1}  # a request claims something
    assert _accepts(ReservationRequest, body) is ok, body
    schema = DOC["components"]["schemas"]["ReservationRequest"]
    assert _resolved(schema).is_valid(body) is ok, body


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("rack", True),
        ("a" * 63, True),
        ("a" * 64, False),  # no prefix: the whole key is the name
        ("example.com/" + "a" * 63, True),
        ("example.com/" + "a" * 64, False),
        ("p" * 253 + "/name", True),
        ("p" * 254 + "/name", False),
        ("9rack", False),
        ("rack zone", False),
    ],
)
def test_a_label_key_is_decided_alike(key: str, ok: bool) -> None:
    from app.inventory.schemas import LabelsBody, TaintBody

    assert _accepts(LabelsBody, {"labels": {key: "v"}}) is ok
    assert _resolved(DOC["components"]["schemas"]["LabelsBody"]).is_valid({"labels": {key: "v"}}) is ok
    assert _accepts(TaintBody, {"key": key}) is ok
    assert _resolved(DOC["components"]["schemas"]["TaintBody"]).is_valid({"key": key}) is ok


@pytest.mark.parametrize(
    ("resource", "ok"),
    [
        ({"allocatable": 64}, True),
        ({"allocatable": 0}, True),
        ({"allocatable": -1}, False),
        ({"allocatable": 1e18}, False),
        ({"allocatable": 0.25, "ratio": 1000}, True),
        ({"allocatable": 1, "ratio": 1000.5}, False),
        ({"allocatable": 1, "ratio": 0}, False),
        ({"allocatable": 1, "ratio": 0.0000005}, False),
    ],
)
def test_an_inventory_amount_is_decided_alike(resource: dict[str, Any], ok: bool) -> None:
    from app.inventory.schemas import ResourceBody

    assert _accepts(ResourceBody, resource) is ok
    assert _resolved(DOC["components"]["schemas"]["ResourceBody"]).is_valid(resource) is ok


@pytest.mark.parametrize(
    ("limit", "ok"), [(16, True), (0, True), (-1, False), (0.0000005, False), (Decimal(1), True)]
)
def test_a_quota_limit_is_decided_alike(limit: Any, ok: bool) -> None:
    from app.api.quota import QuotaBody

    body = {"limits": {"gpu": limit}}
    assert _accepts(QuotaBody, body) is ok
    as_json = {"limits": {"gpu": float(limit) if isinstance(limit, Decimal) else limit}}
    assert _resolved(DOC["components"]["schemas"]["QuotaBody"]).is_valid(as_json) is ok
