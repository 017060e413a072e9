"""GPU inventory from nvidia-smi. No GPU here: the outputs below are captured samples and the
nvidia-smi executable in these tests is a fake script printing them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hai_airflow.backends.common.inventory import Gpu, gpu_type, parse_gpus

from .conftest import Cluster

V100_HOST = """\
0, Tesla V100-SXM2-32GB, 32510 MiB
1, Tesla V100-SXM2-32GB, 32510 MiB
2, Tesla V100-SXM2-32GB, 32510 MiB
3, Tesla V100-SXM2-32GB, 32510 MiB
4, Tesla V100-SXM2-32GB, 32510 MiB
5, Tesla V100-SXM2-32GB, 32510 MiB
6, Tesla V100-SXM2-32GB, 32510 MiB
7, Tesla V100-SXM2-32GB, 32510 MiB
"""


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("Tesla V100-SXM2-32GB", "V100", id="V100 SXM2"),
        pytest.param("Tesla V100-PCIE-16GB", "V100", id="V100 PCIe"),
        pytest.param("NVIDIA A100-SXM4-80GB", "A100", id="A100"),
        pytest.param("NVIDIA A100 80GB PCIe", "A100", id="A100 PCIe"),
        pytest.param("NVIDIA A10", "A10", id="A10 is not A100"),
        pytest.param("Tesla T4", "T4", id="T4"),
        pytest.param("Tesla P100-PCIE-16GB", "P100", id="P100"),
        pytest.param("NVIDIA H100 80GB HBM3", "H100", id="H100"),
        pytest.param("NVIDIA H200", "H200", id="H200"),
        pytest.param("NVIDIA GeForce RTX 4090", "RTX 4090", id="unknown model keeps its name"),
    ],
)
def test_gpu_type_from_nvidia_smi_name(name: str, expected: str) -> None:
    assert gpu_type(name) == expected


def test_parse_gpus_reads_index_name_and_memory() -> None:
    out = "1, NVIDIA H200, 143771 MiB\n0, NVIDIA H200, 143771 MiB\n\n"
    assert parse_gpus(out) == [Gpu(0, "NVIDIA H200", 143771), Gpu(1, "NVIDIA H200", 143771)]


def test_parse_gpus_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        parse_gpus("NVIDIA-SMI has failed\n")


def fake_nvidia_smi(tmp: Path, output: str, rc: int = 0) -> Path:
    """A stand-in for nvidia-smi (no GPU here) that records its arguments and prints `output`."""
    (tmp / "sample.txt").write_text(output)
    script = tmp / "nvidia-smi"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp}/args\ncat {tmp}/sample.txt\nexit {rc}\n')
    script.chmod(0o755)
    return script


def test_inventory_is_one_node_named_after_the_host(cluster: Cluster) -> None:
    backend = cluster.new_backend(nvidia_smi=str(fake_nvidia_smi(cluster.tmp, V100_HOST)))
    nodes = backend.inventory()
    assert nodes is not None and len(nodes) == 1
    node = nodes[0]
    assert (node.name, node.gpu_type, node.gpus) == (socket.gethostname(), "V100", 8)
    assert node.cpus >= 1 and node.memory_gb > 0
    args = (cluster.tmp / "args").read_text().split()
    assert args == ["--query-gpu=index,name,memory.total", "--format=csv,noheader"]


def test_inventory_without_nvidia_smi_is_none(cluster: Cluster) -> None:
    assert cluster.new_backend(nvidia_smi=str(cluster.tmp / "absent" / "nvidia-smi")).inventory() is None


def test_inventory_with_a_failing_nvidia_smi_is_none(cluster: Cluster) -> None:
    script = fake_nvidia_smi(cluster.tmp, "NVIDIA-SMI has failed because it couldn't communicate\n", rc=9)
    assert cluster.new_backend(nvidia_smi=str(script)).inventory() is None
