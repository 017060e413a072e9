"""Sample standalone job: trains a small MLP, checkpointing as it goes and resuming where it was stopped."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from classifier import (
    batch_indices,
    full_loss,
    load_data,
    make_model,
    model_dir,
    weights_digest,
    write_atomically,
    write_json,
)
from torch import nn

from hai_airflow.training import Checkpointer, TrainingLoop, device


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, help=".npz from preprocess.py; generated here when omitted")
    parser.add_argument("--steps", type=int, default=200, help="total training steps")
    parser.add_argument("--ckpt-every", type=int, default=20, help="checkpoint after every K steps")
    parser.add_argument("--keep", type=int, default=3, help="how many checkpoints to keep")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", type=Path, help="default: $HAI_MODEL_DIR, else ./model")
    parser.add_argument("--metrics", type=Path, help="final metrics JSON; default: <model dir>/metrics.json")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to pause after each step")
    parser.add_argument("--log-every", type=int, default=10)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = model_dir(args.model_dir)
    here = device()
    x, y = load_data(args.data, args.seed)
    x, y = x.to(here), y.to(here)
    torch.manual_seed(args.seed)
    model = make_model(x.shape[1], int(y.max()) + 1, args.hidden, dropout=0.1).to(here)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    # Beside final.pt unless the platform gave a separate $HAI_CHECKPOINT_DIR.
    checkpointer = Checkpointer(args.model_dir, keep=args.keep)
    start, resumed_from = 0, None
    if (last := checkpointer.load_latest()) is not None:
        model.load_state_dict(last.state["model"])
        optimizer.load_state_dict(last.state["optimizer"])
        # Dropout draws from the global generators: restoring them keeps a resumed run bit-identical.
        torch.set_rng_state(last.state["rng"])
        if here.type == "cuda" and last.state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(last.state["cuda_rng"], here)
        start = resumed_from = last.step
        print(f"resumed from step {start} ({last.path.name})", flush=True)

    def state() -> dict[str, object]:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(here) if here.type == "cuda" else None,
        }

    with TrainingLoop(checkpointer, state, every=args.ckpt_every) as loop:
        for step in loop.steps(args.steps, start):
            batch = batch_indices(step, len(x), args.batch_size, args.seed).to(here)
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if (step + 1) % args.log_every == 0:
                print(f"step {step + 1}/{args.steps} loss {loss.item():.4f}", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)

    metrics = {
        "loss": full_loss(model, x, y),
        "steps": args.steps,
        "resumed_from": resumed_from,
        "weights_sha256": weights_digest(model),
    }
    write_atomically(out / "final.pt", lambda sink: torch.save(model.state_dict(), sink))
    write_json(args.metrics or out / "metrics.json", metrics)
    print(f"done: loss {metrics['loss']:.4f} after {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
