"""Hints added to a failed job's reason when its log shows a known, fixable cause."""

from __future__ import annotations

import re

NO_KERNEL_IMAGE = "no kernel image is available"

# Ampere (sm_80/86) and newer: Ada (sm_89), Hopper (sm_90), Blackwell. Older builds of CUDA 10.x
# frameworks carry no kernels for them.
_AMPERE_OR_NEWER = re.compile(
    r"^(A100|A800|A10G?|A16|A2|A30|A40|A4000|A4500|A5000|A5500|A6000|RTX\s*A\d+|"
    r"H100|H800|H200|H20|GH200|B100|B200|GB200|L4|L20|L40S?|"
    r"(GEFORCE\s*)?RTX\s*(30|40|50)\d\d(\s*TI)?)\b",
    re.IGNORECASE,
)


def is_ampere_or_newer(gpu_type: str | None) -> bool:
    if not gpu_type:
        return False
    return _AMPERE_OR_NEWER.match(gpu_type.strip()) is not None


def failure_hint(gpu_type: str | None, log_text: str) -> str | None:
    """What to tell the user about a failure, if the log shows a cause we know."""
    if NO_KERNEL_IMAGE in log_text.lower() and is_ampere_or_newer(gpu_type):
        return (
            f"CUDA reported 'no kernel image is available': {gpu_type} GPUs are Ampere or newer and "
            "need a CUDA 11+ build of the framework (e.g. a PyTorch cu11x/cu12x image); rebuild the image "
            "or pick one built for CUDA >= 11"
        )
    return None
