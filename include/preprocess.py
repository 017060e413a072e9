"""CPU stage of the sample pipeline: make (seeded) or read a small labelled data set, save it as .npz."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np


def generate(samples: int, features: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian points labelled by a random linear teacher, so a small MLP can learn them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    teacher = rng.standard_normal((features, classes)).astype(np.float32)
    noise = 0.1 * rng.standard_normal((samples, classes)).astype(np.float32)
    y = np.argmax(x @ teacher + noise, axis=1).astype(np.int64)
    return x, y


def read_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Rows of numbers, the last column an integer class label; lines starting with # are skipped."""
    table = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
    return table[:, :-1].astype(np.float32), table[:, -1].astype(np.int64)


def write_npz(out: Path, x: np.ndarray, y: np.ndarray) -> None:
    """Write ``x`` and ``y``; through a temp file, so the GPU stage never reads half a data set."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    with open(temp, "wb") as sink:
        np.savez(sink, x=x, y=y)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(temp, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="the .npz file to write (arrays x: float32, y: int64)")
    parser.add_argument("--input", type=Path, help="read this CSV instead of generating data")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.input is not None:
        x, y = read_csv(args.input)
    else:
        x, y = generate(args.samples, args.features, args.classes, args.seed)
    write_npz(args.out, x, y)
    print(f"wrote {len(x)} samples with {x.shape[1]} features and {len(np.unique(y))} classes to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
