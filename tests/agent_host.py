"""A GPU host for agent tests, built from the real H200 host fixture (``tests/data/h200-host/``).

``h200_host(gpus)`` gives the host's ``nvidia-smi topo -m`` text and ``-q -x`` XML with its one real GPU
(``gpus=1``: the fixture as it is) or the same GPU repeated (``gpus=2``: a second H200 with its own UUID
and PCI id, joined by NV18), so a test can make a device disappear by going from 2 back to 1.
``write_stand_in(folder)`` writes an ``nvidia-smi`` script that prints the files of a host folder (the one
thing stood in for is the GPU).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data" / "h200-host"
H200_TOPO = (DATA / "topo-m.txt").read_text()
H200_XML = (DATA / "nvidia-smi-q.xml").read_text()
H200_MIG = (DATA / "mig-nvlink.txt").read_text()
FIRST_UUID = "GPU-00000000-1111-2222-3333-444444444444"
SECOND_UUID = "GPU-00000000-1111-2222-3333-555555555555"


def h200_host(gpus: int = 1) -> tuple[str, str]:
    """``(topo text, XML)`` of the H200 host with 1 or 2 GPUs."""
    if gpus == 1:
        return H200_TOPO, H200_XML
    assert gpus == 2
    start = H200_XML.index("<gpu id=")
    end = H200_XML.index("</gpu>") + len("</gpu>")
    gpu = H200_XML[start:end]
    second = gpu.replace("00000000:00:06.0", "00000000:00:07.0").replace("06</pci_device>", "07</pci_device>")
    second = second.replace(FIRST_UUID, SECOND_UUID).replace("<minor_number>0<", "<minor_number>1<")
    xml = H200_XML[:start] + gpu + "\n\t" + second + H200_XML[end:]
    xml = xml.replace("<attached_gpus>1</attached_gpus>", "<attached_gpus>2</attached_gpus>")
    lines = H200_TOPO.split("\n")
    lines[0] = "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    lines[1] = "GPU0\t X \tNV18\t0-15\t0\t\tN/A"
    lines.insert(2, "GPU1\tNV18\t X \t0-15\t0\t\tN/A")
    return "\n".join(lines), xml


def write_host(folder: Path, gpus: int = 1, *, xml: str | None = None) -> None:
    """Write the host's outputs into ``folder`` (``topo.txt``, ``q.xml``, ``mig.txt``)."""
    folder.mkdir(parents=True, exist_ok=True)
    topo, default_xml = h200_host(gpus)
    (folder / "topo.txt").write_text(topo)
    (folder / "q.xml").write_text(xml if xml is not None else default_xml)
    (folder / "mig.txt").write_text(H200_MIG)


STAND_IN = '''#!{python}
"""Stand-in nvidia-smi: prints the files in $BC_TEST_GPU_HOST; exits 9 when its file fail exists."""
import os, sys
host = os.environ["BC_TEST_GPU_HOST"]
if os.path.exists(os.path.join(host, "fail")):
    sys.stderr.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\\n")
    sys.exit(9)
args = sys.argv[1:]
name = {{("topo", "-m"): "topo.txt", ("-q", "-x"): "q.xml", ("mig", "-lgip"): "mig.txt"}}.get(tuple(args))
if name is None:
    sys.stderr.write("stand-in nvidia-smi: unsupported arguments %r\\n" % (args,))
    sys.exit(2)
sys.stdout.write(open(os.path.join(host, name)).read())
'''


def write_stand_in(bin_dir: Path) -> Path:
    """Write the stand-in ``nvidia-smi`` into ``bin_dir`` and return its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(STAND_IN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def agent_env(bin_dir: Path, host: Path, key: str) -> dict[str, str]:
    """The environment of an agent process: the stand-in first on PATH, the host folder, the key."""
    env = dict(os.environ)
    env.update(
        {
            "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
            "BC_TEST_GPU_HOST": str(host),
            "BC_API_KEY": key,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env
