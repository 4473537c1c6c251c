"""Parse ``nvidia-smi topo -m`` (and ``topo -mp``) output exactly as operators paste it.

Source rule: the fixtures in ``tests/data/topo/`` (real output from real hosts) and the format notes that came
with them (the NVML ``nvmlGpuTopologyLevel_t`` enum: SINGLE=PIX, MULTIPLE=PXB, HOSTBRIDGE=PHB, NODE,
SYSTEM=SYS; ``NV#`` = a bonded set of # NVLinks; the 2015-16 legend's ``SOC`` = socket-level link). The
parser is pure: text in, :class:`~app.inventory.topo_matrix.TopoMatrix` out, no I/O.

What real output looks like, and how each quirk is handled:

* **Separators.** nvidia-smi writes TABs; the header line starts with an empty cell; the diagonal is
  ``" X "``.
  A terminal copy expands TABs to 8-column stops, so a line without any TAB is cut back into cells on that
  8-column grid (an 8-column gap is an empty cell). A space-aligned line that does not sit on the grid falls
  back to whitespace splitting.
* **ANSI escapes** (``ESC[4m`` ... ``ESC[0m`` around the header when writing to a TTY) are removed first.
* **Header.** Device names (``GPU<n>``, ``NIC<n>``, ``mlx5_<n>``, ``mlx4_0``, ...) then the trailing labels
  ``CPU Affinity``, ``NUMA Affinity`` and ``GPU NUMA ID`` (any leading subset, in that order). The labels are
  found by name, not position, so a header mangled by copy-paste (no leading TAB, single spaces) still parses.
  ``GPU<n>`` columns are GPUs, every other device column is a NIC.
* **Trailing cells of GPU rows.** The first cell after the matrix is ``CPU Affinity`` (possibly empty, e.g. in
  a one-CPU cgroup); after it, empty cells are padding (nvidia-smi writes an extra TAB before ``N/A`` and
  before ``GPU NUMA ID``) and the non-empty cells fill the remaining labels in order.
* **NIC rows** carry no affinity: they end after the matrix, with ``" X"``/``" X "`` or with empty cells.
* **Legends.** A ``Legend:`` block (``KIND = text``) and a ``NIC Legend:`` block (``  NICn: mlx5_x``) may
  follow the matrix after a blank line; both are optional.

What is strict and what is a warning: placement needs only the GPU count and the GPU x GPU block, so a
malformed header, a missing, repeated or short row, a bad diagonal or a bad cell *inside* the GPU x GPU block
raises :class:`app.errors.InvalidInput` with ``path="topo"`` and the 1-based line number in the message and in
``details["line"]``. A malformed cell *outside* that block (a GPU x NIC or NIC x NIC cell, a NIC row's extra
values, a CPU/NUMA affinity or GPU NUMA ID that does not parse, surplus trailing values) is left out and
reported in :attr:`TopoMatrix.warnings` (``"line 3: ..."``). Real output from a VM can carry a GPU x NIC
cell merged with the CPU-affinity column (``PH0-115``, where ``PHB`` and ``0-115`` ran together): the
link is dropped with a warning and ``0-115`` is still read as the GPU's CPU Affinity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.errors import InvalidInput, quote_input
from app.inventory.topo_matrix import (
    CPU_AFFINITY,
    GPU_NUMA_ID,
    NUMA_AFFINITY,
    TRAILING_LABELS,
    TopoMatrix,
    parse_cpu_list,
)

__all__ = ["parse_topo_matrix"]

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_LABEL_RE = re.compile(r"CPU[ \t]+Affinity|NUMA[ \t]+Affinity|GPU[ \t]+NUMA[ \t]+ID")
_GPU_RE = re.compile(r"GPU\d+")
_DEVICE_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.:\-]*")
# A link cell: X (self), NV<n>, or an upper-case kind (SYS, NODE, PHB, PXB, PIX, SOC, or a future kind).
_LINK_RE = re.compile(r"X|NV\d+|[A-Z][A-Z0-9]{1,7}")
_NIC_LEGEND_RE = re.compile(r"\s*([A-Za-z][A-Za-z0-9_]*)\s*:\s*(\S+)\s*")
_LEGEND_ENTRY_RE = re.compile(r"\s*(\S+)\s*=\s*(.*?)\s*")
# A link kind run together with the CPU-affinity cell that follows it (``PH0-115``): kind prefix, CPU list.
_MERGED_AFFINITY_RE = re.compile(r"([A-Z]{1,7}?)(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)")
_TAB_STOP = 8


def _error(message: str, line: int) -> InvalidInput:
    return InvalidInput(f"nvidia-smi topo: line {line}: {message}", path="topo", details={"line": line})


def _grid_cells(line: str) -> list[str] | None:
    """Cut a space-aligned line (TABs expanded to 8-column stops) back into its TAB cells.

    Each cell starts on a tab stop (the diagonal ``" X "`` one column after it) and the gap after a cell runs
    to the next stop; every further 8 columns of blanks is one empty cell. ``None`` when the line does not
    sit on the grid.
    """
    cells: list[str] = []
    next_stop = 0
    for m in re.finditer(r"\S+", line):
        start, end, tok = m.start(), m.end(), m.group()
        if start % _TAB_STOP == 0:
            cell_start = start
        elif tok == "X" and start % _TAB_STOP == 1:
            cell_start = start - 1
        else:
            return None
        if cell_start < next_stop:
            return None
        cells.extend([""] * ((cell_start - next_stop) // _TAB_STOP))
        cells.append(tok)
        next_stop = (end // _TAB_STOP + 1) * _TAB_STOP
    return cells


def _split_row(line: str) -> tuple[list[str], bool]:
    """A matrix line as ``(cells, was_tab_separated)``; cells are stripped, the first is the row label."""
    if "\t" in line:
        return [c.strip() for c in line.split("\t")], True
    cells = _grid_cells(line)
    if cells is None:
        cells = line.split()
    return [c.strip() for c in cells], False


def _parse_header(header: str, lineno: int) -> tuple[list[str], list[str]]:
    """Split the header into device column names and trailing labels (canonical spelling, in order)."""
    matches = list(_LABEL_RE.finditer(header))
    device_part = header[: matches[0].start()] if matches else header
    labels: list[str] = []
    pos = matches[0].start() if matches else len(header)
    for m in matches:
        if header[pos : m.start()].strip():
            raise _error(f"unexpected header text {quote_input(header[pos : m.start()].strip())}", lineno)
        labels.append(" ".join(m.group().split()))
        pos = m.end()
    if header[pos:].strip():
        raise _error(f"unexpected header text {quote_input(header[pos:].strip())}", lineno)
    expected_order = [lab for lab in TRAILING_LABELS if lab in labels]
    if labels != expected_order:
        raise _error(f"header labels {labels} are not in nvidia-smi order {list(TRAILING_LABELS)}", lineno)
    devices = device_part.split()
    if not devices:
        raise _error("header names no devices", lineno)
    seen: set[str] = set()
    for name in devices:
        if not _DEVICE_NAME_RE.fullmatch(name):
            raise _error(f"bad device name {quote_input(name)} in header", lineno)
        if name in seen:
            raise _error(f"device {name} appears twice in header", lineno)
        seen.add(name)
    if not any(_GPU_RE.fullmatch(d) for d in devices):
        raise _error("header names no GPU column (expected GPU0, GPU1, ...)", lineno)
    return devices, labels


def _warn(warnings: list[str], message: str, line: int) -> None:
    warnings.append(f"line {line}: {message}")


def _trailing_values(
    trailing: list[str], labels: list[str], row: str, lineno: int, warnings: list[str]
) -> dict[str, str]:
    """Assign a GPU row's trailing cells to the header's labels (see the module docstring); values the
    header has no column for are left out with a warning."""
    values: dict[str, str] = {}
    if not labels:
        if any(trailing):
            _warn(
                warnings,
                f"row {row} has {len(trailing)} cells beyond the matrix but no trailing columns",
                lineno,
            )
        return values
    rest_labels = labels
    rest = trailing
    if labels[0] == CPU_AFFINITY:
        values[CPU_AFFINITY] = trailing[0] if trailing else ""
        rest_labels, rest = labels[1:], trailing[1:]
    filled = [c for c in rest if c]
    if len(filled) > len(rest_labels):
        _warn(warnings, f"row {row} has more trailing values than the header's columns {labels}", lineno)
    values.update(zip(rest_labels, filled, strict=False))
    return values


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse ``nvidia-smi topo -m`` / ``topo -mp`` output (TAB- or space-aligned) into a :class:`TopoMatrix`.

    ``text`` is the command's output as printed or pasted: an optional leading blank line, the header, one
    row per device column (in any order), then optionally a blank line, ``Legend:`` and ``NIC Legend:``
    blocks. Link texts are kept exactly as printed (``NV12``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``,
    the legacy ``SOC``); ``topo -mp`` simply has no ``NV#`` cells.

    Raises :class:`app.errors.InvalidInput` (``path="topo"``, ``details["line"]`` 1-based) when the header
    names no GPU, a row is unknown, repeated, missing or short, a GPU x GPU cell is not a link kind, a GPU
    row's diagonal is not ``X``, a line follows the matrix that is no legend, or a ``NIC Legend`` entry
    names an unknown NIC. Malformed cells outside the GPU x GPU block are warnings (module docstring).
    """
    if not isinstance(text, str):
        raise _error("expected text", 1)
    lines = [_ANSI_RE.sub("", ln).rstrip("\r\n").rstrip() for ln in text.split("\n")]
    idx = _header_index(lines)
    devices, labels = _parse_header(lines[idx], idx + 1)
    grid = _Grid(devices=devices, labels=labels)
    end = _parse_rows(lines, idx + 1, grid)
    legend, nic_legend = _parse_legends(lines, end, set(grid.nics))
    gpu_links, gpu_nic_links, nic_nic_links, asymmetric = _pair_links(grid)
    cpu_affinity, numa_affinity, gpu_numa = _affinities(grid)
    return TopoMatrix(
        gpus=tuple(grid.gpus),
        nics=tuple(grid.nics),
        nic_legend=nic_legend,
        gpu_links=gpu_links,
        gpu_nic_links=gpu_nic_links,
        nic_nic_links=nic_nic_links,
        cpu_affinity=cpu_affinity,
        numa_affinity=numa_affinity,
        gpu_numa_id=gpu_numa,
        legend=legend,
        layout="tab" if grid.tab_rows else "space",
        asymmetric_pairs=tuple(asymmetric),
        warnings=tuple(grid.warnings),
    )


@dataclass
class _Grid:
    """The matrix as it is read: the header's ``devices`` (columns, GPUs and NICs) and trailing
    ``labels``; then, row by row, ``matrix`` (row -> its link cells), each GPU row's trailing values and
    line, the cells left out (``bad_cells``, (row, column)), the warnings and how many rows were TAB-split."""

    devices: list[str]
    labels: list[str]
    matrix: dict[str, list[str]] = field(default_factory=dict)
    trailing_by_gpu: dict[str, tuple[dict[str, str], int]] = field(default_factory=dict)
    bad_cells: set[tuple[str, str]] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    tab_rows: int = 0
    col: dict[str, int] = field(init=False)
    gpus: list[str] = field(init=False)
    nics: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.col = {name: i for i, name in enumerate(self.devices)}
        self.gpus = [d for d in self.devices if _GPU_RE.fullmatch(d)]
        self.nics = [d for d in self.devices if d not in self.gpus]


def _header_index(lines: list[str]) -> int:
    """The index of the header: the first non-blank line."""
    idx = 0
    while idx < len(lines) and not lines[idx].strip():
        idx += 1
    if idx == len(lines):
        raise _error("empty input (expected the output of nvidia-smi topo -m)", 1)
    return idx


def _parse_rows(lines: list[str], idx: int, grid: _Grid) -> int:
    """Read the device rows from ``lines[idx]`` into ``grid`` up to a blank or legend line; returns the
    index after the last row. Raises for an unknown, repeated, short or missing row."""
    n = len(grid.devices)
    while (
        idx < len(lines)
        and lines[idx].strip()
        and not lines[idx].lstrip().startswith(("Legend", "NIC Legend"))
    ):
        lineno = idx + 1
        cells, was_tab = _split_row(lines[idx])
        grid.tab_rows += was_tab
        label = cells[0]
        if label not in grid.col:
            raise _error(f"row {quote_input(label)} is not a column of the header", lineno)
        if label in grid.matrix:
            raise _error(f"row {label} appears twice", lineno)
        links = cells[1 : 1 + n]
        if len(links) < n:
            raise _error(f"row {label} has {len(links)} link cells, expected {n}", lineno)
        trailing = _check_cells(grid, label, links, cells[1 + n :], lineno)
        grid.matrix[label] = links
        if label in grid.gpus:
            grid.trailing_by_gpu[label] = (
                _trailing_values(trailing, grid.labels, label, lineno, grid.warnings),
                lineno,
            )
        elif any(trailing):
            _warn(
                grid.warnings,
                f"NIC row {label} has values beyond the matrix: {[c for c in trailing if c]}; left out",
                lineno,
            )
        idx += 1
    missing = [d for d in grid.devices if d not in grid.matrix]
    if missing:
        raise _error(f"no row for {', '.join(missing)}", idx + 1 if idx < len(lines) else len(lines))
    return idx


def _check_cells(grid: _Grid, label: str, links: list[str], trailing: list[str], lineno: int) -> list[str]:
    """Check row ``label``'s link cells: a GPU x GPU cell must be a link kind (``X`` on the diagonal) or
    the parse fails; any other bad cell is a warning and left out (``grid.bad_cells``). A last cell that
    merged a link with the CPU affinity gives the affinity back: returns the row's trailing values."""
    devices, n = grid.devices, len(grid.devices)
    for j, cell in enumerate(links):
        strict = label in grid.gpus and devices[j] in grid.gpus
        if j == grid.col[label]:
            if cell == "X":
                continue
            if strict:
                raise _error(f"row {label}: diagonal cell is {quote_input(cell)}, expected X", lineno)
            _warn(grid.warnings, f"row {label}: diagonal cell is {quote_input(cell)}, expected X", lineno)
        elif cell != "X" and _LINK_RE.fullmatch(cell):
            continue
        elif strict:
            raise _error(f"row {label}, column {devices[j]}: {quote_input(cell)} is not a link kind", lineno)
        else:
            merged = _MERGED_AFFINITY_RE.fullmatch(cell)
            if merged and label in grid.gpus and j == n - 1 and CPU_AFFINITY in grid.labels:
                trailing = [merged.group(2), *trailing]
                _warn(
                    grid.warnings,
                    f"row {label}, column {devices[j]}: {quote_input(cell)} is a link merged with the "
                    "CPU affinity "
                    f"{merged.group(2)}; the {label}-{devices[j]} link is left out",
                    lineno,
                )
            else:
                _warn(
                    grid.warnings,
                    f"row {label}, column {devices[j]}: {quote_input(cell)} is not a link kind; left out",
                    lineno,
                )
        grid.bad_cells.add((label, devices[j]))
    return trailing


Links = dict[tuple[str, str], str]


def _pair_links(grid: _Grid) -> tuple[Links, Links, Links, list[tuple[str, str]]]:
    """Each device pair once (header order): GPU-GPU, GPU-NIC (GPU order, then NIC column order) and
    NIC-NIC links, without the cells left out, and the pairs whose two cells differ."""
    devices, matrix, col, gpus, nics = grid.devices, grid.matrix, grid.col, grid.gpus, grid.nics
    gpu_links: Links = {}
    gpu_nic_links: Links = {}
    nic_nic_links: Links = {}
    asymmetric: list[tuple[str, str]] = []
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            ab, ba = matrix[a][col[b]], matrix[b][col[a]]
            a_bad, b_bad = (a, b) in grid.bad_cells, (b, a) in grid.bad_cells
            if ab != ba and not (a_bad or b_bad):
                asymmetric.append((a, b))
            if a in gpus and b in gpus:
                gpu_links[(a, b)] = ab
            elif a in gpus or b in gpus:
                g, nic = (a, b) if a in gpus else (b, a)
                if (g, nic) not in grid.bad_cells:
                    gpu_nic_links[(g, nic)] = matrix[g][col[nic]]
            elif not a_bad:
                nic_nic_links[(a, b)] = ab
            elif not b_bad:
                nic_nic_links[(a, b)] = ba
    gpu_nic_links = {
        (g, nic): gpu_nic_links[(g, nic)] for g in gpus for nic in nics if (g, nic) in gpu_nic_links
    }
    return gpu_links, gpu_nic_links, nic_nic_links, asymmetric


def _affinities(
    grid: _Grid,
) -> tuple[dict[str, str | None], dict[str, list[int] | None], dict[str, int | None] | None]:
    """Each GPU's CPU affinity (text), NUMA affinity (node list) and GPU NUMA ID (None: no such column);
    unparsable values are warnings and left out (None)."""
    cpu_affinity: dict[str, str | None] = {}
    numa_affinity: dict[str, list[int] | None] = {}
    gpu_numa: dict[str, int | None] | None = {} if GPU_NUMA_ID in grid.labels else None
    for g in grid.gpus:
        values, lineno = grid.trailing_by_gpu[g]
        cpu_affinity[g] = _cpu_affinity(grid, g, values, lineno)
        numa_affinity[g] = _numa_affinity(grid, g, values, lineno)
        if gpu_numa is not None:
            gpu_numa[g] = _gpu_numa_id(grid, g, values, lineno)
    return cpu_affinity, numa_affinity, gpu_numa


def _cpu_affinity(grid: _Grid, g: str, values: dict[str, str], lineno: int) -> str | None:
    cpu = values.get(CPU_AFFINITY) if CPU_AFFINITY in grid.labels else None
    if cpu is not None and cpu.upper() == "N/A":
        return None
    if cpu:
        try:
            parse_cpu_list(cpu)
        except ValueError:
            _warn(
                grid.warnings, f"row {g}: CPU Affinity {quote_input(cpu)} is not a CPU list; left out", lineno
            )
            return None
    return cpu


def _numa_affinity(grid: _Grid, g: str, values: dict[str, str], lineno: int) -> list[int] | None:
    numa_text = values.get(NUMA_AFFINITY, "")
    if not numa_text or numa_text.upper() == "N/A":
        return None
    try:
        return parse_cpu_list(numa_text)
    except ValueError:
        _warn(
            grid.warnings,
            f"row {g}: NUMA Affinity {quote_input(numa_text)} is not a NUMA node list; left out",
            lineno,
        )
        return None


def _gpu_numa_id(grid: _Grid, g: str, values: dict[str, str], lineno: int) -> int | None:
    gid = values.get(GPU_NUMA_ID, "")
    if not gid or gid.upper() == "N/A":
        return None
    if gid.isdigit():
        return int(gid)
    _warn(grid.warnings, f"row {g}: GPU NUMA ID {quote_input(gid)} is not a number; left out", lineno)
    return None


def _parse_legends(lines: list[str], idx: int, nics: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Read the optional ``Legend:`` and ``NIC Legend:`` blocks after the matrix (from line index ``idx``)."""
    legend: dict[str, str] = {}
    nic_legend: dict[str, str] = {}
    block: str | None = None
    for i in range(idx, len(lines)):
        raw = lines[i]
        stripped = raw.strip()
        if not stripped:
            continue
        lineno = i + 1
        if stripped == "Legend:":
            block = "legend"
            continue
        if stripped == "NIC Legend:":
            block = "nic"
            continue
        if block == "legend":
            m = _LEGEND_ENTRY_RE.fullmatch(raw)
            if m:
                legend[m.group(1)] = m.group(2)
            # Free text inside the legend (a wrapped description) is tolerated.
            continue
        if block == "nic":
            m = _NIC_LEGEND_RE.fullmatch(raw)
            if not m:
                raise _error(f"NIC Legend entry {quote_input(stripped)} is not 'NICn: name'", lineno)
            if m.group(1) not in nics:
                raise _error(f"NIC Legend names {m.group(1)}, which is not a NIC column", lineno)
            nic_legend[m.group(1)] = m.group(2)
            continue
        raise _error(f"unexpected line after the matrix: {quote_input(stripped[:60])}", lineno)
    return legend, nic_legend
