"""Reading a simulation trace: NODES.csv, JOBS.csv and an optional quotas.toml."""

from __future__ import annotations

import csv
import io
import random
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from hai_airflow.scheduling.model import Node, Quota
from hai_airflow.spec import MAX_SCHEDULE_CHOICES, GroupConfig, NodeConfig, UserConfig

NODE_COLUMNS = ("name", "gpu_type", "gpus", "cpus", "memory_gb")
JOB_COLUMNS = (
    "job_id",
    "submit_time",
    "duration",
    "workers",
    "gpus_per_worker",
    "gpu_type",
    "max_schedule",
    "group",
    "user",
    "cpus",
    "memory_gb",
)
OPTIONAL_JOB_COLUMNS = ("elastic",)
RESIZE_COLUMNS = ("min_workers",)
"""Optional column of a resizable job: the fewest workers it may be shrunk to (empty = never resizes)."""
ESTIMATE_COLUMNS = ("time_limit", "task_name")
"""Optional columns a runtime estimate reads (`hai sim --forecast`): the job's time limit in seconds and
its task name (history is kept per user and task name); empty = none."""
DEFAULT_GROUP = "default"
"""Group (and user) of a job whose trace row leaves them empty: no quota limit unless configured."""

T = TypeVar("T")


class TraceError(ValueError):
    """A trace file is malformed; the message names the file, the line and the column."""

    def __init__(self, path: Path, line: int | None, column: str | None, problem: str, fix: str = ""):
        self.path = path
        self.line = line
        self.column = column
        where = path.name + (f" line {line}" if line is not None else "")
        where += f", column {column!r}" if column else ""
        super().__init__(f"{where}: {problem}" + (f". {fix}" if fix else ""))


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of the trace as submitted; times and durations in seconds."""

    id: int
    submit_time: float
    duration: float
    workers: int
    gpus_per_worker: int
    gpu_type: str | None
    max_schedule: int
    group: str
    user: str
    cpus: float = 0
    memory_gb: float = 0
    elastic: bool = False
    time_limit: float | None = None
    """Seconds the job may run at most (`--time-limit`); never below `duration`."""
    task_name: str = ""
    min_workers: int | None = None
    """A resizable job's least workers (1..workers); None for one that never resizes."""

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    @property
    def resizable(self) -> bool:
        """It may run at fewer workers than it asks for, as `DistributedJobSpec.resizable`."""
        return self.min_workers is not None and self.min_workers < self.workers


@dataclass(frozen=True, slots=True)
class Trace:
    """Everything a simulation replays: the cluster, the jobs in submit order, the quotas."""

    nodes: tuple[Node, ...]
    jobs: tuple[TraceJob, ...]
    quota: Quota


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(path, None, None, f"cannot read the file ({e.strerror})") from None
    try:
        # utf-8-sig: spreadsheets often start a CSV with a byte-order mark.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TraceError(path, line, None, "not UTF-8 text", "Save the file as UTF-8") from None


def _rows(path: Path, columns: tuple[str, ...], optional: tuple[str, ...] = ()) -> Iterator[
    tuple[int, dict[str, str]]
]:
    """Yield (line number, row) after checking the header names every required column once."""
    reader = csv.reader(io.StringIO(_text(path), newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
        _check_header(path, header, columns, optional)
        for values in reader:
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                problem = f"{len(values)} fields where the header has {len(header)}"
                raise TraceError(path, reader.line_num, None, problem)
            yield reader.line_num, {k: v.strip() for k, v in zip(header, values, strict=True)}
    except csv.Error as e:
        raise TraceError(path, reader.line_num, None, f"not readable as CSV ({e})") from None


def _check_header(path: Path, header: list[str], columns: tuple[str, ...], optional: tuple[str, ...]) -> None:
    if not header:
        raise TraceError(path, 1, None, "no header", f"Start the file with: {','.join(columns)}")
    known = columns + optional
    for name in columns:
        if name not in header:
            raise TraceError(path, 1, name, "missing column", f"The header must name {','.join(columns)}")
    for i, name in enumerate(header):
        if name not in known:
            raise TraceError(path, 1, name, "unknown column", f"Known columns: {','.join(known)}")
        if name in header[:i]:
            raise TraceError(path, 1, name, "named twice", "Keep one column of each name")


def _field(path: Path, line: int, column: str, raw: str, parse: Callable[[str], T], expect: str) -> T:
    try:
        return parse(raw)
    except ValueError:
        raise TraceError(path, line, column, f"{raw!r} is not {expect}") from None


def _seconds(raw: str) -> float:
    value = float(raw)
    if not 0 <= value < float("inf"):
        raise ValueError(raw)
    return value


def _amount(raw: str) -> float:
    """A per-worker CPU or memory figure; empty means none."""
    return _seconds(raw) if raw else 0.0


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if value < low:
            raise ValueError(raw)
        return value

    return parse


def _max_schedule(raw: str) -> int:
    value = int(raw) if raw else 0
    if value not in MAX_SCHEDULE_CHOICES:
        raise ValueError(raw)
    return value


def _limit(raw: str) -> float | None:
    """A time limit in seconds; empty means none."""
    if not raw:
        return None
    value = _seconds(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


def _flag(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("", "0", "false", "no"):
        return False
    if lowered in ("1", "true", "yes"):
        return True
    raise ValueError(raw)


def load_nodes(path: Path) -> tuple[Node, ...]:
    """Parse NODES.csv through the platform's own node model, so limits match `hai serve`."""
    nodes: list[Node] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        try:
            cfg = NodeConfig(
                name=row["name"],
                gpu_type=row["gpu_type"],
                gpus=row["gpus"],  # pydantic parses the text
                cpus=row["cpus"],
                memory_gb=row["memory_gb"],
            )
        except ValidationError as e:
            err = e.errors()[0]
            column = str(err["loc"][0]) if err["loc"] else None
            raise TraceError(path, line, column, err["msg"]) from None
        if not cfg.gpu_type:
            raise TraceError(path, line, "gpu_type", "empty", "Name the GPU type of the node, e.g. V100")
        if cfg.name in seen:
            raise TraceError(path, line, "name", f"node {cfg.name!r} appears twice")
        seen.add(cfg.name)
        nodes.append(Node(cfg.name, cfg.gpu_type, cfg.gpus, cfg.cpus, cfg.memory_gb))
    if not nodes:
        raise TraceError(path, 1, None, "no nodes", "Add one row per machine")
    return tuple(nodes)


def _job(path: Path, line: int, row: dict[str, str]) -> TraceJob:
    def get(column: str, parse: Callable[[str], T], expect: str) -> T:
        return _field(path, line, column, row[column], parse, expect)

    job = TraceJob(
        id=get("job_id", _int_at_least(0), "a non-negative integer"),
        submit_time=get("submit_time", _seconds, "a non-negative number of seconds"),
        duration=get("duration", _seconds, "a non-negative number of seconds"),
        workers=get("workers", _int_at_least(1), "an integer >= 1"),
        gpus_per_worker=get("gpus_per_worker", _int_at_least(0), "a non-negative integer"),
        gpu_type=row["gpu_type"] or None,
        max_schedule=get(
            "max_schedule", _max_schedule, "one of " + "|".join(str(c) for c in MAX_SCHEDULE_CHOICES)
        ),
        group=row["group"] or DEFAULT_GROUP,
        user=row["user"] or DEFAULT_GROUP,
        cpus=get("cpus", _amount, "a non-negative number (or empty)"),
        memory_gb=get("memory_gb", _amount, "a non-negative number (or empty)"),
        elastic=get("elastic", _flag, "true or false") if "elastic" in row else False,
        time_limit=get("time_limit", _limit, "a positive number of seconds (or empty)") if "time_limit" in row
        else None,
        task_name=row.get("task_name", ""),
    )
    if job.time_limit is not None and job.time_limit < job.duration:
        problem = f"{job.time_limit:g} s is below the duration {job.duration:g} s"
        raise TraceError(path, line, "time_limit", problem,
                         "A job runs its whole duration here: give a limit at least as long")
    if row.get("min_workers"):
        least = get("min_workers", _int_at_least(1), "an integer >= 1 (or empty)")
        return _resizable(path, line, job, least, explicit_elastic=bool(row.get("elastic")))
    return job


def _resizable(path: Path, line: int, job: TraceJob, least: int, explicit_elastic: bool) -> TraceJob:
    """The job with its `min_workers`, checked as the platform checks a spec's; it implies elastic."""
    if job.workers < 2 or job.gpus_per_worker < 1:
        raise TraceError(path, line, "min_workers", "only a job of several GPU workers resizes",
                         "Leave min_workers empty for a single-worker or CPU job")
    if least > job.workers:
        raise TraceError(path, line, "min_workers", f"{least} is more than workers ({job.workers})",
                         "Give min_workers between 1 and workers")
    if explicit_elastic and not job.elastic:
        raise TraceError(path, line, "elastic", "false, but a resizable job (min_workers) saves on notice",
                         "Leave elastic empty or true (min_workers implies it), or min_workers empty")
    return replace(job, min_workers=least, elastic=True)


def load_jobs(path: Path) -> tuple[TraceJob, ...]:
    """Parse JOBS.csv; the result is in submit order (ties by job id)."""
    jobs: list[TraceJob] = []
    seen: set[int] = set()
    for line, row in _rows(path, JOB_COLUMNS, OPTIONAL_JOB_COLUMNS + RESIZE_COLUMNS + ESTIMATE_COLUMNS):
        job = _job(path, line, row)
        if job.id in seen:
            raise TraceError(path, line, "job_id", f"job {job.id} appears twice")
        seen.add(job.id)
        jobs.append(job)
    return tuple(sorted(jobs, key=lambda j: (j.submit_time, j.id)))


def load_quota(path: Path | None) -> Quota:
    """Parse quotas.toml (`[[groups]] name, quota_gpus`, `[[users]] name, group, quota_gpus`)."""
    if path is None:
        return Quota()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TraceError(path, None, None, f"cannot read the file ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise TraceError(path, getattr(e, "lineno", None), None, str(e)) from None
    unknown = set(data) - {"groups", "users"}
    if unknown:
        table = sorted(unknown)[0]
        raise TraceError(path, None, None, f"unknown table {table!r}", "Use [[groups]] and [[users]]")
    groups: dict[str, int | None] = {}
    users: dict[str, int | None] = {}
    for table, model, into in (("groups", GroupConfig, groups), ("users", UserConfig, users)):
        for index, entry in enumerate(data.get(table, [])):
            try:
                cfg = model.model_validate(entry)
            except ValidationError as e:
                err = e.errors()[0]
                column = ".".join(str(p) for p in err["loc"]) or None
                raise TraceError(path, None, f"{table}[{index}].{column}", err["msg"]) from None
            into[cfg.name] = cfg.quota_gpus
    return Quota(groups=groups, users=users)


def load_trace(nodes: Path, jobs: Path, quotas: Path | None = None) -> Trace:
    return Trace(load_nodes(nodes), load_jobs(jobs), load_quota(quotas))


def half_size(workers: int) -> int:
    """The least workers `--resizable-share` gives a job: half of them, at least one."""
    return max(1, workers // 2)


def with_resizable_share(trace: Trace, share: float, seed: int = 1) -> Trace:
    """The trace with `share` (0..1) of its multi-worker GPU jobs made resizable down to half their
    workers (and elastic); the others keep what the file says.

    The jobs are the first round(share x n) of those jobs shuffled by `seed`, so the same seed always
    picks the same jobs and a larger share adds jobs to a smaller one's. Share 0 returns `trace` itself.
    """
    if not 0 <= share <= 1:
        raise ValueError(f"share must be between 0 and 1, not {share!r}")
    candidates = sorted(j.id for j in trace.jobs if j.workers > 1 and j.gpus_per_worker > 0)
    random.Random(seed).shuffle(candidates)
    chosen = set(candidates[: round(share * len(candidates))])
    if not chosen:
        return trace
    jobs = tuple(
        replace(j, min_workers=half_size(j.workers), elastic=True) if j.id in chosen else j
        for j in trace.jobs
    )
    return replace(trace, jobs=jobs)
