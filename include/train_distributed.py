"""Sample distributed job: data-parallel training of the sample MLP on 2+ workers, resuming where it stopped.

Submitted as `python3 train_distributed.py`: the platform starts one process per GPU of every worker
with Horovod's variables (then Horovod is used when it is installed) and torch.distributed's (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: gloo on CPU, NCCL on GPUs). horovodrun or mpirun in
the command work too, with the job's `processes` set to per-worker.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path
from typing import Any

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

from hai_airflow.training import Checkpointer, TrainingLoop, device, local_rank, rank, scaled_lr, size


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help=".npz from preprocess.py; generated here when omitted")
    parser.add_argument("--steps", type=int, default=200, help="total training steps")
    parser.add_argument("--ckpt-every", type=int, default=20, help="checkpoint after every K steps")
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument(
        "--batch-size", type=int, default=16, help="per process; the global batch is size() times it"
    )
    parser.add_argument("--lr", type=float, default=0.005, help="per process; scaled by size()")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", type=Path, help="default: $HAI_MODEL_DIR, else ./model")
    parser.add_argument("--metrics", type=Path, help="final metrics JSON; default: <model dir>/metrics.json")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to pause after each step")
    parser.add_argument(
        "--backend",
        choices=("auto", "torch", "horovod"),
        default="auto",
        help="auto: Horovod when it is installed and the platform, horovodrun or mpirun started this "
        "process with a rendezvous, else torch.distributed",
    )
    return parser.parse_args(argv)


def use_horovod(choice: str) -> bool:
    if choice != "auto":
        return choice == "horovod"
    launched = "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ or "OMPI_COMM_WORLD_SIZE" in os.environ
    if not launched:
        return False
    try:
        import horovod.torch  # noqa: F401
    except ImportError:
        return False
    return True


class Collective:
    """The few collective operations this job needs, over Horovod or torch.distributed."""

    def __init__(self, horovod: bool) -> None:
        self.horovod = horovod
        if horovod:
            import horovod.torch as hvd

            hvd.init()
            self.hvd: Any = hvd
        else:
            import torch.distributed as dist

            # NCCL needs each process bound to its GPU before the group forms.
            if torch.cuda.is_available():
                torch.cuda.set_device(device())
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", init_method="env://")

    def wrap(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Make gradients averaged across ranks: the model to train and the optimizer to step.

        Load a checkpoint into what this returns, not before: Horovod's DistributedOptimizer is a new
        optimizer over the same parameters, and the state of the one it wraps is left behind.
        """
        if self.horovod:
            hvd = self.hvd
            return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        from torch.nn.parallel import DistributedDataParallel

        ids = [device()] if torch.cuda.is_available() else None
        return DistributedDataParallel(model, device_ids=ids), optimizer

    def start_together(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Start every rank from rank 0's weights and optimizer state (DDP did so when it wrapped)."""
        if self.horovod:
            self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def all_values(self, value: int) -> list[int]:
        """``value`` from every rank."""
        mine = torch.tensor([value], dtype=torch.int64)
        if self.horovod:
            return [int(v) for v in self.hvd.allgather(mine)]
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            mine = mine.to(device())
        gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        return [int(v.item()) for v in gathered]

    def close(self) -> None:
        if self.horovod:
            self.hvd.shutdown()
            return
        import torch.distributed as dist

        dist.destroy_process_group()


def train(args: argparse.Namespace, collective: Collective) -> int:
    out = model_dir(args.model_dir)
    here = device()
    x, y = load_data(args.data, args.seed)
    x, y = x.to(here), y.to(here)
    torch.manual_seed(args.seed)
    model = make_model(x.shape[1], int(y.max()) + 1, args.hidden, dropout=0.1).to(here)
    optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=scaled_lr(args.lr))

    # Every rank reads the shared model directory; only rank 0 ever writes it.
    trained, optimizer = collective.wrap(model, optimizer)
    checkpointer = Checkpointer(args.model_dir, keep=args.keep)
    start, resumed_from = 0, None
    if (last := checkpointer.load_latest()) is not None:
        model.load_state_dict(last.state["model"])
        optimizer.load_state_dict(last.state["optimizer"])
        start = resumed_from = last.step
    starts = collective.all_values(start)
    if len(set(starts)) != 1:
        raise SystemExit(
            f"Error: ranks found different checkpoints (steps {starts}). "
            "Give every worker the same shared --model-dir / $HAI_MODEL_DIR."
        )
    collective.start_together(model, optimizer)

    def state() -> dict[str, object]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    me, world = rank(), size()
    used = "Horovod" if collective.horovod else "torch.distributed"
    print(f"rank {me} of {world} (local rank {local_rank()}) on {used}", flush=True)
    try:
        with TrainingLoop(checkpointer, state, every=args.ckpt_every) as loop:
            for step in loop.steps(args.steps, start):
                # Dropout noise is derived from (step, rank) instead of checkpointed: rank 0's
                # generator state alone could not restore the other ranks' generators.
                torch.manual_seed(args.seed * 1_000_003 + step * world + me)
                batch = batch_indices(step, len(x), args.batch_size * world, args.seed)[me::world].to(here)
                loss = nn.functional.cross_entropy(trained(x[batch]), y[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if args.step_sleep:
                    time.sleep(args.step_sleep)
    except SystemExit as stop:  # saved on a preemption notice
        return int(stop.code or 0)

    digest = weights_digest(model)
    metrics = {
        "loss": full_loss(model, x, y),
        "steps": args.steps,
        "resumed_from": resumed_from,
        "weights_sha256": digest,
        "rank": me,
        "local_rank": local_rank(),
        "size": world,
        "collective": "horovod" if collective.horovod else "torch.distributed",
    }
    write_json(out / f"final-rank{me}.json", metrics)
    if me == 0:
        write_atomically(out / "final.pt", lambda sink: torch.save(model.state_dict(), sink))
        write_json(args.metrics or out / "metrics.json", metrics)
        print(f"done: loss {metrics['loss']:.4f} after {args.steps} steps on {world} processes", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    collective = Collective(use_horovod(args.backend))
    try:
        return train(args, collective)
    finally:
        # torch+gloo on CPU can abort at exit unless the model, optimizer and DDP reducer are gone
        # before the process group; train() has returned, so only cycles are left to collect.
        gc.collect()
        collective.close()


if __name__ == "__main__":
    raise SystemExit(main())
