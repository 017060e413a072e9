"""The sample jobs' model and data: a small MLP classifier, its batches and a digest of its weights."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from preprocess import generate
from torch import nn


def load_data(path: Path | None, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The .npz written by preprocess.py, or the same kind of data generated here when there is none."""
    if path is None:
        x, y = generate(samples=1024, features=16, classes=4, seed=seed)
    else:
        with np.load(path) as arrays:
            x, y = arrays["x"], arrays["y"]
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y.astype(np.int64))


def make_model(features: int, classes: int, hidden: int, dropout: float) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, classes),
    )


def batch_indices(step: int, samples: int, batch_size: int, seed: int) -> torch.Tensor:
    """The samples of global step ``step``: derived from the step alone, so a resumed run sees the
    same batches as one that was never interrupted, with nothing about data order to checkpoint."""
    order = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randperm(samples, generator=order)[:batch_size]


def weights_digest(model: nn.Module) -> str:
    """sha256 of every parameter and buffer, by name: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@torch.no_grad()
def full_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Cross-entropy over the whole data set in eval mode (no dropout), a deterministic final metric."""
    was_training = model.training
    model.eval()
    loss = float(nn.functional.cross_entropy(model(x), y))
    model.train(was_training)
    return loss


def write_atomically(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temp file beside ``path`` and rename it over ``path`` when complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temp, "wb") as sink:
        write(sink)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(temp, path)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    write_atomically(
        path, lambda sink: sink.write(json.dumps(payload, indent=2, sort_keys=True).encode() + b"\n")
    )


def model_dir(given: Path | None) -> Path:
    """``--model-dir``, else the platform's ``$HAI_MODEL_DIR``, else ./model when run by hand."""
    if given is not None:
        return given
    return Path(os.environ.get("HAI_MODEL_DIR") or "model")
