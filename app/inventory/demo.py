"""The demo pool: real ``nvidia-smi`` outputs shipped as package data, listed in a manifest.

The files live in ``app/inventory/examples/`` (installed with the package, so ``better-compute serve --demo``
works from a wheel); ``examples/demo-pool`` at the repository root is a symlink to that folder. See
``docs/inventory-import.md``.

Manifest (``demo-pool.json``)::

    {"pool": "demo", "description": "...", "nodes": [
      {"name": "dgx-a100-01", "topo": "dgx-a100.topo.txt", "xml": "h200.nvidia-smi-q.xml"?,
       "source": "what machine this is"?, "labels": {"rack": "r1"}?,
       "resources": {"cpu": {"allocatable": 256, "ratio": 1},
                     "memory": {"allocatable": 2097152, "ratio": 1}}}]}

File names are relative to the manifest's folder and may not leave it. Memory is in MiB, cpu in cores.
The only I/O here is reading the manifest and the files it names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from app.errors import InvalidInput
from app.inventory.importer import ImportedNode, build_imported_node

__all__ = ["EXAMPLES_DIR", "MANIFEST_NAME", "DemoNode", "load_demo_manifest"]

EXAMPLES_DIR: Path = Path(__file__).resolve().parent / "examples"
MANIFEST_NAME = "demo-pool.json"

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_LABEL_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9._/-]*")
_RESOURCE_RE = re.compile(r"[a-z][a-z0-9._/-]*")
_NODE_KEYS = {"name", "topo", "xml", "labels", "resources", "source", "description"}


@dataclass(frozen=True)
class DemoNode:
    """One manifest node: ``name``; ``node``, the :class:`ImportedNode` built from its files; ``labels``,
    the manifest's operator labels; ``resources``, ``{name: {"allocatable": Decimal, "ratio": Decimal}}``
    (cpu in cores, memory in MiB); and the raw ``topo_text`` / ``xml_text`` for callers that import through
    ``POST /v1/pools/{poolId}/nodes/import``-shaped bodies."""

    name: str
    node: ImportedNode
    labels: dict[str, str]
    resources: dict[str, dict[str, Decimal]]
    topo_text: str
    xml_text: str | None = None


def _bad(message: str, path: str) -> InvalidInput:
    return InvalidInput(f"demo manifest: {message}", path=path)


def _read(base: Path, rel: Any, path: str) -> str:
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute():
        raise _bad("a file name relative to the manifest is required", path)
    target = (base / rel).resolve()
    if base.resolve() not in target.parents:
        raise _bad(f"{rel!r} leaves the manifest's folder", path)
    try:
        return target.read_text(encoding="utf-8")
    except OSError as exc:
        raise _bad(f"cannot read {rel!r} ({exc.strerror or exc})", path) from None


def _amount(value: Any, path: str, *, positive: bool) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise _bad("expected a number", path)
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise _bad(f"{value!r} is not a number", path) from None
    if not amount.is_finite() or amount < 0 or (positive and amount == 0):
        raise _bad(f"{value!r} must be {'positive' if positive else 'zero or more'}", path)
    return amount


def _resources(raw: Any, path: str) -> dict[str, dict[str, Decimal]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _bad("expected an object of resources", path)
    out: dict[str, dict[str, Decimal]] = {}
    for name, spec in raw.items():
        rpath = f"{path}.{name}"
        if not _RESOURCE_RE.fullmatch(name):
            raise _bad(f"bad resource name {name!r}", rpath)
        if not isinstance(spec, dict) or "allocatable" not in spec or set(spec) - {"allocatable", "ratio"}:
            raise _bad("expected {allocatable, ratio?}", rpath)
        out[name] = {
            "allocatable": _amount(spec["allocatable"], f"{rpath}.allocatable", positive=False),
            "ratio": _amount(spec.get("ratio", 1), f"{rpath}.ratio", positive=True),
        }
    return out


def _labels(raw: Any, path: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _bad("expected an object of labels", path)
    for key, value in raw.items():
        if not _LABEL_KEY_RE.fullmatch(key) or not isinstance(value, str):
            raise _bad(f"bad label {key!r}", f"{path}.{key}")
    return dict(raw)


def load_demo_manifest(root: Path = EXAMPLES_DIR) -> list[DemoNode]:
    """Read the demo manifest and the ``nvidia-smi`` files it names; return one :class:`DemoNode` per node,
    in manifest order.

    ``root`` is the folder holding ``demo-pool.json`` (default: the packaged ``app/inventory/examples``) or
    the manifest file itself. Each node is built with :func:`build_imported_node` (atoms named
    ``<name>-GPU<i>`` without XML, GPU UUIDs with it).

    Raises :class:`app.errors.InvalidInput` whose ``path`` names the manifest field (``nodes.3.topo``,
    ``nodes.0.resources.cpu.ratio``, ...) for a missing or malformed manifest, an unknown key, a bad or
    repeated node name, a file that cannot be read or leaves the folder, bad labels or resources; errors
    from the parsers keep their own path (``topo``, ``nvidiaSmiXml``) with the node named in the message.
    """
    manifest = root if root.is_file() else root / MANIFEST_NAME
    base = manifest.parent
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"), parse_float=Decimal)
    except OSError as exc:
        raise _bad(f"cannot read {manifest} ({exc.strerror or exc})", "manifest") from None
    except json.JSONDecodeError as exc:
        raise _bad(f"{manifest.name} is not JSON (line {exc.lineno}: {exc.msg})", "manifest") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise _bad("expected an object with a non-empty 'nodes' list", "nodes")

    out: list[DemoNode] = []
    seen: set[str] = set()
    for i, raw in enumerate(doc["nodes"]):
        path = f"nodes.{i}"
        if not isinstance(raw, dict):
            raise _bad("expected an object", path)
        unknown = set(raw) - _NODE_KEYS
        if unknown:
            raise _bad(f"unknown keys {sorted(unknown)}", f"{path}.{sorted(unknown)[0]}")
        name = raw.get("name")
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or len(name) > 128:
            raise _bad(f"bad node name {name!r}", f"{path}.name")
        if name in seen:
            raise _bad(f"node {name} is listed twice", f"{path}.name")
        seen.add(name)
        topo_text = _read(base, raw.get("topo"), f"{path}.topo")
        xml_text = _read(base, raw["xml"], f"{path}.xml") if raw.get("xml") is not None else None
        labels = _labels(raw.get("labels"), f"{path}.labels")
        resources = _resources(raw.get("resources"), f"{path}.resources")
        try:
            node = build_imported_node(name, topo_text, xml_text)
        except InvalidInput as exc:
            raise exc.under("", label=f"demo node {name}", as_type=InvalidInput) from None
        out.append(
            DemoNode(
                name=name,
                node=node,
                labels=labels,
                resources=resources,
                topo_text=topo_text,
                xml_text=xml_text,
            )
        )
    return out
