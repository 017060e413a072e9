"""Sample distributed job: data-parallel training of the sample MLP on 2+ workers, resuming where it stopped.

Submitted as `python3 train_distributed.py`: the platform starts one process per GPU of every worker
with Horovod's variables (then Horovod is used when it is installed) and torch.distributed's (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: gloo on CPU, NCCL on GPUs). horovodrun or mpirun in
the command work too, with the job's `processes` set to per-worker.

It may be restarted at another size from its checkpoint (a resizable job): each process keeps its
batch size, the learning rate is scaled by the new size and the run trains on the same samples in
all, epoch after epoch of one shuffled stream sharded by rank (see hai_airflow.training.resizable).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from classifier import (
    full_loss,
    load_data,
    make_model,
    model_dir,
    weights_digest,
    write_atomically,
    write_json,
)
from torch import nn

from hai_airflow.training import (
    Checkpoint,
    Checkpointer,
    LinearScaling,
    Progress,
    SampleStream,
    TrainingLoop,
    device,
    local_rank,
    rank,
    resumed_progress,
    size,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help=".npz from preprocess.py; generated here when omitted")
    parser.add_argument(
        "--steps",
        type=int,
        default=200,
        help="training steps at the first start's size; the run's length in samples is fixed then",
    )
    parser.add_argument(
        "--samples", type=int, help="the run's length in samples instead (default: steps x batch x size())"
    )
    parser.add_argument("--ckpt-every", type=int, default=20, help="checkpoint after every K steps")
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="per process at every size; the global batch is size() times it",
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

    def all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the ranks (a new CPU tensor)."""
        if self.horovod:
            return self.hvd.allreduce(values, op=self.hvd.Sum)
        import torch.distributed as dist

        summed = values.clone().to(device()) if dist.get_backend() == "nccl" else values.clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        return summed.cpu()

    def close(self) -> None:
        if self.horovod:
            self.hvd.shutdown()
            return
        import torch.distributed as dist

        dist.destroy_process_group()


def scaling_rule(args: argparse.Namespace, last: Checkpoint | None, world: int) -> LinearScaling:
    """The run's rule: recorded at the first start and kept by every restart, whatever its size.

    ``--steps`` counts steps at the first start's size, so the run's length in samples is fixed
    then; a restart at another size takes more or fewer steps to train on the same samples.
    """
    saved = last.state.get("rule") if last is not None and isinstance(last.state, dict) else None
    if saved is not None:
        rule = LinearScaling(**saved)
        differs = (
            args.samples not in (None, rule.total_samples)
            or args.batch_size != rule.batch_per_rank
            or args.lr != rule.base_lr
        )
        if differs:
            print(f"the checkpoint's rule wins over the command line's: {rule}", flush=True)
        return rule
    total = args.samples or args.steps * args.batch_size * world
    return LinearScaling(total_samples=total, batch_per_rank=args.batch_size, base_lr=args.lr)


def describe_start(collective: Collective, world: int, rule: LinearScaling, last: Progress | None) -> str:
    """One line for the job's log: the world size, what it makes of the rule, and where it starts."""
    name = "hvd.size()" if collective.horovod else "WORLD_SIZE"
    line = (
        f"{name}={world}: {rule.batch_per_rank} samples per rank, global batch {rule.global_batch(world)}, "
        f"lr {rule.lr(world):g} ({rule.base_lr:g} x {world})"
    )
    if last is None:
        return f"{line}; starting at sample 0 of {rule.total_samples}"
    return (
        f"{line}; resuming at sample {last.samples} of {rule.total_samples}, step {last.step} "
        f"(saved at size {last.size}), {rule.steps_left(last.samples, world)} steps to go"
    )


def resume(
    last: Checkpoint | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rule: LinearScaling,
    world: int,
    seen: torch.Tensor,
) -> tuple[Progress | None, torch.Tensor]:
    """Load ``last`` (if any) into the model and optimizer and set the learning rate for ``world``.

    Returns the checkpoint's progress (None on a first start) and how often each sample was seen.
    """
    resumed = None
    if last is not None:
        model.load_state_dict(last.state["model"])
        optimizer.load_state_dict(last.state["optimizer"])
        resumed = resumed_progress(last.state, last.step, rule, world)
        seen = last.state.get("seen", seen)
    # After loading: the optimizer's state holds the learning rate of the size that saved it.
    for group in optimizer.param_groups:
        group["lr"] = rule.lr(world)
    return resumed, seen


def train(args: argparse.Namespace, collective: Collective) -> int:
    here = device()
    x, y = load_data(args.data, args.seed)
    x, y = x.to(here), y.to(here)
    torch.manual_seed(args.seed)
    model = make_model(x.shape[1], int(y.max()) + 1, args.hidden, dropout=0.1).to(here)
    optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    me, world = rank(), size()

    # Every rank reads the shared model directory; only rank 0 ever writes it.
    trained, optimizer = collective.wrap(model, optimizer)
    checkpointer = Checkpointer(args.model_dir, keep=args.keep)
    last = checkpointer.load_latest()
    rule = scaling_rule(args, last, world)
    resumed, seen = resume(last, model, optimizer, rule, world, torch.zeros(len(x), dtype=torch.int64))
    progress = resumed or Progress(size=world)
    starts = collective.all_values(progress.step)
    if len(set(starts)) != 1:
        raise SystemExit(
            f"Error: ranks found different checkpoints (steps {starts}). "
            "Give every worker the same shared --model-dir / $HAI_MODEL_DIR."
        )
    collective.start_together(model, optimizer)

    used = "Horovod" if collective.horovod else "torch.distributed"
    print(f"rank {me} of {world} (local rank {local_rank()}) on {used}", flush=True)
    if me == 0:
        print(describe_start(collective, world, rule, resumed), flush=True)
    stream = SampleStream(len(x), args.seed)
    seen_here = torch.zeros(len(x), dtype=torch.int64)

    def state() -> dict[str, object]:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "progress": progress.as_state(),
            "rule": asdict(rule),
            # How often each sample was trained on, over all ranks and sizes (a collective).
            "seen": seen + collective.all_sum(seen_here),
        }

    try:
        with TrainingLoop(checkpointer, state, every=args.ckpt_every) as loop:
            for _ in loop.steps(rule.total_steps(progress, world), progress.step):
                batch = torch.tensor(
                    stream.indices(rule.shard(progress.samples, world, me)), dtype=torch.int64
                )
                # Dropout noise is derived from the stream position instead of checkpointed: rank 0's
                # generator state alone could not restore the other ranks' generators.
                torch.manual_seed(args.seed * 1_000_003 + progress.samples + me)
                on = batch.to(here)
                train_step(
                    trained, optimizer, x[on], y[on], world / rule.step_samples(progress.samples, world)
                )
                seen_here[batch] += 1
                progress = rule.after_step(progress, world)
                if args.step_sleep:
                    time.sleep(args.step_sleep)
    except SystemExit as stop:  # saved on a preemption notice
        return int(stop.code or 0)
    report(args, collective, model, (x, y), progress, rule, resumed)
    return 0


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, scale: float
) -> None:
    """One optimizer step on this rank's share of the global batch.

    The loss is the share's sum x size / global batch: averaged over the ranks, the gradient is the
    mean over the global batch even when a short last step splits it unevenly (or leaves a rank none).
    """
    loss = nn.functional.cross_entropy(model(x), y, reduction="sum") * scale
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def report(
    args: argparse.Namespace,
    collective: Collective,
    model: nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    progress: Progress,
    rule: LinearScaling,
    resumed: Progress | None,
) -> None:
    """Every rank's final-rank<N>.json; rank 0 also writes final.pt and the metrics file."""
    me, world = rank(), size()
    metrics = {
        "loss": full_loss(model, *data),
        "steps": progress.step,
        "samples": progress.samples,
        "total_samples": rule.total_samples,
        "resumed_from": resumed.step if resumed is not None else None,
        "resumed_at_sample": resumed.samples if resumed is not None else None,
        "lr": rule.lr(world),
        "weights_sha256": weights_digest(model),
        "rank": me,
        "local_rank": local_rank(),
        "size": world,
        "collective": "horovod" if collective.horovod else "torch.distributed",
    }
    out = model_dir(args.model_dir)
    write_json(out / f"final-rank{me}.json", metrics)
    if me == 0:
        write_atomically(out / "final.pt", lambda sink: torch.save(model.state_dict(), sink))
        write_json(args.metrics or out / "metrics.json", metrics)
        print(
            f"done: loss {metrics['loss']:.4f} after {progress.step} steps, {progress.samples} samples, "
            f"on {world} processes",
            flush=True,
        )


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
