"""This machine's GPUs as a scheduling Node, detected with nvidia-smi."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections import Counter
from dataclasses import dataclass

from hai_airflow.scheduling.model import Node

NVIDIA_SMI_QUERY = ("--query-gpu=index,name,memory.total", "--format=csv,noheader")

# Longest names first where one is a prefix of another; \b keeps "A10" from matching "A100".
_GPU_TYPES = re.compile(
    r"\b(H200|H100|H800|H20|GH200|B200|B100|A100|A800|A40|A30|A10G|A10|A16|A2|L40S|L40|L4|"
    r"V100S|V100|T4|P100|P40|P4|K80|M60)\b"
)
_VENDOR_WORDS = re.compile(r"\b(NVIDIA|Tesla|GeForce|Quadro)\b\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int


def gpu_type(name: str) -> str:
    """The platform's GPU type for an nvidia-smi name ("Tesla V100-SXM2-32GB" -> "V100")."""
    match = _GPU_TYPES.search(name.upper())
    if match:
        return match.group(1)
    return _VENDOR_WORDS.sub("", name).strip() or name


def parse_gpus(output: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader` output."""
    gpus = []
    for line in output.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, memory = parts[0], parts[-1]
        name = ",".join(parts[1:-1]).strip()
        gpus.append(Gpu(index=int(index), name=name, memory_mib=int(memory.split()[0])))
    return sorted(gpus, key=lambda g: g.index)


def node_of(gpus: list[Gpu], hostname: str, cpus: float, memory_gb: float) -> Node:
    """One Node for the machine; with mixed GPU models the most common one names the type."""
    types = Counter(gpu_type(g.name) for g in gpus)
    most_common = sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return Node(name=hostname, gpu_type=most_common, gpus=len(gpus), cpus=cpus, memory_gb=memory_gb)


def detect(nvidia_smi: str = "nvidia-smi", timeout: float = 20) -> list[Node] | None:
    """The machine as a Node if nvidia-smi runs and lists GPUs; None otherwise (use virtual nodes)."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=timeout, check=True
        ).stdout
        gpus = parse_gpus(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        # A broken driver is "no GPUs detected", not a crash of the server.
        return None
    if not gpus:
        return None
    return [node_of(gpus, socket.gethostname(), float(os.cpu_count() or 1), host_memory_gb())]


def host_memory_gb() -> float:
    """Total memory of this machine in GB (from /proc/meminfo)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 1.0
