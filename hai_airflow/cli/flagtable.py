"""The flags of the commands a job runs (`hai submit`, `create`, `task`, `instance`, `log`, `wait`,
`cancel`, `res`), declared once as plain data: the full `hai` builds its typer options from this table,
the downloadable `hai` (`GET /cli/hai`) its argparse parser. Standard library only, Python 3.8+."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, get_args

from hai_airflow.vocabulary import MAX_SCHEDULE_CHOICES, PROCESSES_HELP, JobState, Processes

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

TEXT, INT, FLOAT, BOOL, TEXTS, INTS = "text", "int", "float", "bool", "texts", "ints"
DURATION, INDICES, CHOICE = "duration", "indices", "choice"
"""A flag's kind: how its value is read. TEXTS and INTS repeat; DURATION reads `4h` as seconds,
INDICES an array's `0-9%2`."""


@dataclass(frozen=True)
class Flag:
    """One flag: its names (the first is listed), how its value is read, its default and help.

    `dest` is the parameter that receives it (the typer command's, the argparse namespace's).
    `upper` gives a CHOICE's value in upper case; `minimum` refuses smaller numbers.
    """

    dest: str
    names: tuple[str, ...]
    help: str
    kind: str = TEXT
    metavar: str | None = None
    default: Any = None
    choices: tuple[str, ...] = ()
    upper: bool = False
    minimum: float | None = None
    show_default: bool = True


@dataclass(frozen=True)
class Argument:
    """A positional argument: task ids (INTS), one task id (INT), or the start command (TEXTS)."""

    dest: str
    metavar: str
    help: str
    kind: str
    required: bool = False


def choose(value: str, choices: Sequence[str], upper: bool = False) -> str:
    """One of `choices`, in any case; ValueError listing them as the user types them."""
    canonical = {c.casefold(): c for c in choices}
    found = canonical.get(str(value).casefold())
    if found is None:
        raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
    return found.upper() if upper else found


def _number(text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a {'number' if kind is float else 'whole number'}") from None


def read_value(flag: Flag | Argument, text: str) -> Any:
    """A flag's value from its text, as both CLIs read it; ValueError saying what is wrong."""
    if flag.kind in (INT, INTS, FLOAT):
        value: Any = _number(text, float if flag.kind == FLOAT else int)
    elif flag.kind == DURATION:
        from hai_airflow import durations

        return durations.parse(text)
    elif flag.kind == INDICES:
        from hai_airflow import arrays

        arrays.parse(text)
        return text
    elif flag.kind == CHOICE and isinstance(flag, Flag):
        return choose(text, flag.choices, flag.upper)
    else:
        return text
    minimum = getattr(flag, "minimum", None)
    if minimum is not None and value < minimum:
        raise ValueError(f"{text} is less than the minimum of {minimum:g}")
    return value


def output_format(output: str | None, as_json: bool) -> str:
    """The one format -o and --json ask for (`table` by default); ValueError when they ask for two."""
    if as_json and output not in (None, "json"):
        raise ValueError(f"--json and -o {output} ask for different formats. Give only one of them")
    return "json" if as_json else output or "table"


MAX_SCHEDULE_METAVAR = "[" + "|".join(str(c) for c in MAX_SCHEDULE_CHOICES) + "]"
PROCESSES_CHOICES: tuple[str, ...] = get_args(Processes)
JOB_STATES: tuple[str, ...] = tuple(str(s.value) for s in JobState)
OUTPUT_CHOICES = ("json", "yaml", "wide", "name", "csv")

# ---- the job: what `hai create` and every `hai submit` command set in the spec --------------------
# The help texts pair an English explanation with the platform document's own words.

TASK_NAME = Flag(
    "task_name",
    ("--task-name",),
    "Task name; Chinese and English both work. 任务名称，支持中英文",
    metavar="TEXT",
)
CODE_PATH = Flag(
    "code_path",
    ("--code-path",),
    "Code directory (the job starts cd'd there) or git repository. 代码路径",
    metavar="TEXT",
)
IMAGE = Flag(
    "image",
    ("--image",),
    "Docker image of the job. Default: local (run without a container). docker镜像地址",
    metavar="TEXT",
)
WORKER_IMAGE = Flag(
    "worker_image",
    ("--worker-image",),
    "Distributed: the image of each worker (it must have Horovod); default: --image. Standalone: "
    "another name for --image. worker镜像",
    metavar="TEXT",
)
MODEL_ID = Flag(
    "model_id",
    ("--model-id",),
    "Model id, shown under <模型训练> on the web page. 模型ID，请从页面上的<模型训练>下查看ID",
    INT,
    "INTEGER",
)
PROJECT_ID = Flag(
    "project_id",
    ("--project-id",),
    "Project id, shown under <我的项目> on the web page. 项目ID，请从页面上的<我的项目>下查看",
    INT,
    "INTEGER",
)
CODE_SRC = Flag(
    "code_src",
    ("--code-src",),
    "Where the code is: nas (a directory on shared storage) or git (a repository). 代码位置",
    metavar="[nas|git]",
    default="nas",
)
GIT_BRANCH = Flag(
    "git_branch",
    ("--git-branch",),
    "[optional] Git branch to check out, with --code-src git. [可选] 代码git分支 (如果代码位置为git)",
    metavar="TEXT",
)
MODEL_DIR = Flag(
    "model_dir",
    ("--model-dir",),
    "[optional] Where the job saves its model and checkpoints (the job sees it as HAI_MODEL_DIR). "
    "[可选] 模型保存路径",
    metavar="TEXT",
)
PROJECT_STORAGE = Flag(
    "project_storage",
    ("--project-storage",),
    "[optional] Project storage to mount: project ids, comma-separated. "
    "[可选] 待挂载项目存储，填写项目ID，多个请用逗号分割. eg: 10111,10222",
    metavar="TEXT",
)
MAX_SCHEDULE = Flag(
    "max_schedule",
    ("--max-schedule",),
    "Expected queueing time in hours: 0 = low priority (may be suspended), more than 0 = high "
    "priority (within your quota). 期望等待时长. 等于0为低优任务，大于0为高优任务，单位为h",
    INT,
    MAX_SCHEDULE_METAVAR,
    default=0,
)
SHM = Flag("shm", ("--shm",), "[optional] Shared memory in MB. [可选] 共享内存, 单位为MB", INT, "INTEGER")
ENV = Flag("env", ("--env",), "Extra environment variable for the job; repeatable.", TEXTS, "KEY=VALUE")
TIME_LIMIT = Flag(
    "time_limit",
    ("--time-limit",),
    "[optional] Run time allowed over all runs (4h, 90m, 2d, 1:30:00); suspended time does "
    "not count. At the limit the task gets the save notice and its grace, then ends TIMEOUT.",
    DURATION,
    "DURATION",
)
AFTER = Flag(
    "after",
    ("--after",),
    "[optional] Start only after these tasks succeeded (comma-separated ids, like Slurm's "
    "--dependency=afterok); cancelled if one of them ends otherwise.",
    metavar="IDS",
)
AFTER_ANY = Flag(
    "after_any",
    ("--after-any",),
    "[optional] Start only after these tasks ended, however they ended (afterany).",
    metavar="IDS",
)
LABEL = Flag(
    "label",
    ("--label",),
    "A label to find the task by (`hai task -l team=vision`); repeatable.",
    TEXTS,
    "KEY=VALUE",
)
JOB_FLAGS = (
    MODEL_ID, PROJECT_ID, CODE_SRC, GIT_BRANCH, MODEL_DIR, PROJECT_STORAGE, MAX_SCHEDULE, SHM, ENV,
    TIME_LIMIT, AFTER, AFTER_ANY, LABEL,
)  # fmt: skip
"""The job flags `hai create` and every `hai submit` command share (`jobspec.JobFlags`)."""

PROCESSES = Flag(
    "processes",
    ("--processes",),
    f"{PROCESSES_HELP} Default: per-gpu for distributed jobs, per-worker for standalone ones.",
    CHOICE,
    "[" + "|".join(PROCESSES_CHOICES) + "]",
    choices=PROCESSES_CHOICES,
    show_default=False,
)
ELASTIC = Flag(
    "elastic",
    ("--elastic",),
    "Elastic job (EFDL style): on suspension it is told to save (HAI_PREEMPT_NOTICE) and exit, "
    "instead of being killed.",
    BOOL,
    default=False,
)
GRACE = Flag(
    "grace",
    ("--grace",),
    "Seconds between the save notice and the kill on suspension. Default: 60 with --elastic, else 0.",
    INT,
    "SECONDS",
)
GPU_JOB_FLAGS = (PROCESSES, ELASTIC, GRACE)
"""The flags only GPU jobs take (`jobspec.GpuJobFlags`)."""

CLIENT_KEY = Flag(
    "client_key",
    ("--client-key",),
    "Idempotency key: submitting again with the same key returns the first job instead of a "
    "second one (useful when the submitting stage itself may be retried).",
    metavar="TEXT",
)
WAIT = Flag(
    "wait",
    ("--wait",),
    "After submitting, wait for the task to end; the exit code is its outcome, as with "
    "`hai wait` (0 succeeded, 1 failed, cancelled or TIMEOUT, 124 --wait-timeout passed).",
    BOOL,
    default=False,
)
WAIT_TIMEOUT = Flag(
    "wait_timeout",
    ("--wait-timeout",),
    "With --wait: give up waiting after this many seconds (the task keeps running).",
    FLOAT,
    "SECONDS",
    minimum=0,
    show_default=False,
)
ARRAY = Flag(
    "array",
    ("--array",),
    "One task per index, like Slurm's --array: 0-9, 0-15:4 or 1,3,5; %K runs at most K at "
    "once (0-9%2). Each task sees HAI_ARRAY_INDEX; `hai cancel` of the array's id (its first "
    "task's) cancels them all.",
    INDICES,
    "INDICES",
)
SUBMIT_FLAGS = (CLIENT_KEY, WAIT, WAIT_TIMEOUT, ARRAY)
"""What every submitting command does after validating the job (`jobspec.SubmitFlags`)."""

MIN_WORKERS = Flag(
    "min_workers",
    ("--min-workers",),
    "[optional] Distributed only: makes the task resizable. Rather than suspend it, a "
    "high-priority task may shrink it by whole workers down to this many; it grows back to --workers "
    "when GPUs free. Each resize is a save on the notice and a restart at the new size from that "
    "checkpoint (implies --elastic).",
    INT,
    "INTEGER",
    show_default=False,
)
GPU_TYPE = Flag(
    "gpu_type",
    ("--gpu-type",),
    "GPU type (V100, A100, P100, T4...). Default: the resource package's. GPU类型",
    metavar="TEXT",
)

# ---- `hai submit standalone|cpu`: the short form ------------------------------------------------

COMMAND = Argument(
    "command",
    "CMD",
    'Start command, quoted: "python3 train.py --lr 0.1" (or unquoted after --).',
    TEXTS,
    True,
)
STANDALONE_GPUS = Flag("gpus", ("--gpus",), "GPUs on one machine.", INT, "INTEGER", default=1)
SUBMIT_GPU_TYPE = Flag(
    "gpu_type",
    ("--gpu-type",),
    "GPU type, any case (v100, A100, p100, T4...). Default: any type.",
    metavar="TEXT",
)
EXACT = Flag(
    "exact",
    ("--exact",),
    "Refuse (exit 2) when no package has exactly --gpus GPUs, instead of taking the smallest "
    "that holds more.",
    BOOL,
    default=False,
)
CPUS = Flag("cpus", ("--cpus",), "CPU task only: CPU cores. Default: 1.", FLOAT, "FLOAT", show_default=False)
MEMORY = Flag(
    "memory", ("--memory",), "CPU task only: memory in GB. Default: 1.", FLOAT, "GB", show_default=False
)

# ---- `hai create` -----------------------------------------------------------------------------

MODE = Flag(
    "mode",
    ("--mode",),
    "Training mode: standalone (one machine, one or more GPUs), distributed (Horovod: "
    "--workers machines of --worker-resource-pkg each) or cpu (no GPU: --cpus and --memory, as "
    "`hai submit cpu`). 训练模式: 单机等",
    CHOICE,
    "[standalone|distributed|cpu]",
    default="standalone",
    choices=("standalone", "distributed", "cpu"),
)
RESOURCE_PKG = Flag(
    "resource_pkg",
    ("--resource-pkg",),
    "Resource package id; list them with `hai res`. For --mode distributed it is the "
    "package of one worker unless --worker-resource-pkg is given. 资源套餐ID，请用hai res获取",
    INT,
    "INTEGER",
)
CMD = Flag("cmd", ("--cmd",), 'Start command, e.g. "python3 training.py". 启动命令', metavar="TEXT")
WORKERS = Flag(
    "workers",
    ("--workers",),
    "Distributed only: number of workers; total GPUs = workers x GPUs of the worker package. worker数目",
    INT,
    "INTEGER",
)
WORKER_RESOURCE_PKG = Flag(
    "worker_resource_pkg",
    ("--worker-resource-pkg",),
    "Distributed only: resource package of one worker, usually a whole 8-GPU machine. worker资源组",
    INT,
    "INTEGER",
)

# ---- reading tasks: `hai task`, `instance`, `log`, `wait`, `cancel`, `res` -----------------------

TASK_IDS = Argument("ids", "TASK_ID", "Task ids, from `hai task` (or use --task-id).", INTS)
TASK_ID_ARGUMENT = Argument("id_", "TASK_ID", "Task id, from `hai task` (or use --task-id).", INT)
TASK_ID_FLAGS = Flag(
    "task_id",
    ("--task-id", "--task_id"),
    "Task id, as the platform document writes it; repeatable.",
    INTS,
    "INTEGER",
    show_default=False,
)
ALL = Flag(
    "all_",
    ("--all",),
    "Every task you may see: yours, every task of the groups you administer, and for a "
    "platform admin every task (others' waiting tasks are in `hai queue`).",
    BOOL,
    default=False,
)
STATE = Flag(
    "state_filter",
    ("--state",),
    "Only tasks in this state, e.g. RUNNING or SUSPENDED (any case).",
    CHOICE,
    "STATE",
    choices=JOB_STATES,
    upper=True,
    show_default=False,
)
USER = Flag("user", ("--user",), "Only this user's tasks (admins).", metavar="TEXT")
LIMIT = Flag("limit", ("--limit",), "At most this many tasks, newest first.", INT, "INTEGER")
SELECTOR = Flag(
    "selector",
    ("--selector", "-l"),
    "Only tasks whose labels match: team=vision, stage!=eval, gpu (has it), !draft; "
    "comma-separated, all must hold.",
    metavar="SELECTOR",
)
ARRAY_FILTER = Flag("array", ("--array",), "Only the tasks of this array (its first task's id).", INT, "ID")
INSTANCE_ID = Flag(
    "instance_id",
    ("--instance-id", "--instance_id"),
    "Instead of a task id: this instance, from `hai instance`. 运行实例ID，从hai instance获取",
    INT,
    "INTEGER",
    show_default=False,
)
LOG_TASK_ID = Flag(
    "task_id",
    ("--task-id", "--task_id"),
    "Task id, as the positional TASK_ID: the log of its latest instance.",
    INT,
    "INTEGER",
    show_default=False,
)
TAIL = Flag(
    "tail",
    ("--tail",),
    "Only the last K lines; 0 = the whole log. 仅获取尾部多少行，为0时表示获取全部",
    INT,
    "INTEGER",
    default=0,
)
FOLLOW = Flag(
    "follow",
    ("--follow", "-f"),
    "Keep printing new output until the instance ends; reconnects if the server goes away meanwhile.",
    BOOL,
    default=False,
)
FOR_STATE = Flag(
    "for_state",
    ("--for",),
    "Wait until the task is in this state (e.g. RUNNING). Default: until it ends.",
    CHOICE,
    "STATE",
    choices=JOB_STATES,
    upper=True,
    show_default=False,
)
TIMED_OUT = 124
"""`hai wait`'s exit code when --timeout passes first: the one GNU `timeout` uses."""
TIMEOUT = Flag(
    "timeout",
    ("--timeout",),
    f"Give up after this many seconds and exit {TIMED_OUT}. Default: wait as long as it takes.",
    FLOAT,
    "SECONDS",
    minimum=0,
    show_default=False,
)
YES = Flag("yes", ("--yes", "-y"), "Cancel several tasks at a terminal without asking.", BOOL, default=False)

OUTPUT = Flag(
    "output",
    ("--output", "-o"),
    "json/yaml: the API's records (for programs); wide: a table with more columns; "
    "name: only the ids, one per line; csv: the wide table's columns as CSV (for a "
    "spreadsheet). Default: a table.",
    CHOICE,
    "|".join(OUTPUT_CHOICES),
    choices=OUTPUT_CHOICES,
    show_default=False,
)
AS_JSON = Flag("as_json", ("--json",), "Same as -o json.", BOOL, default=False)
NO_HEADERS = Flag(
    "no_headers", ("--no-headers",), "Print tables without their header line and titles.", BOOL, default=False
)
OUTPUT_FLAGS = (OUTPUT, AS_JSON, NO_HEADERS)
"""How a command prints what it shows (`output.OutputFlags`)."""

# ---- the commands -------------------------------------------------------------------------------

FLAG_SPELLINGS = {"name": "task-name", "code-dir": "code-path"}
"""The platform document spells these flags twice: `hai create --task-name --code-path --image` and
`hai submit standalone --name --code-dir --worker-image`. The first spelling, the spec's field names,
is the one every job command lists; the second (left) is accepted by every job command unlisted."""
ONE_WORKER_SPELLINGS = {**FLAG_SPELLINGS, "worker-image": "image"}
"""`hai submit standalone` and `hai submit cpu`: a task of one worker, whose image is --image."""


@dataclass(frozen=True)
class Command:
    """A command's arguments and flags, in the order its help lists them, and the other spellings
    of its flags it accepts unlisted (`--name` for `--task-name`)."""

    arguments: tuple[Argument, ...]
    flags: tuple[Flag, ...]
    spellings: Mapping[str, str] = field(default_factory=dict)


CREATE_ORDER = (
    "task_name", "model_id", "project_id", "mode", "code_src", "code_path", "git_branch", "model_dir",
    "project_storage", "max_schedule", "image", "resource_pkg", "shm", "cmd",
)  # fmt: skip
"""`hai create --help` lists the platform document's flags in the document's order, the rest after."""


def _in_order(flags: Sequence[Flag], order: Sequence[str]) -> tuple[Flag, ...]:
    rank = {name: i for i, name in enumerate(order)}
    return tuple(sorted(flags, key=lambda f: rank.get(f.dest, len(rank))))


TASK_IDS_AND_FLAG = (TASK_IDS,)
GPU_SUBMIT = (*GPU_JOB_FLAGS, *SUBMIT_FLAGS, *OUTPUT_FLAGS)
CREATE = (WORKER_RESOURCE_PKG, GPU_TYPE, *JOB_FLAGS, *GPU_SUBMIT)
COMMANDS: dict[str, Command] = {
    "submit standalone": Command(
        (COMMAND,),
        (TASK_NAME, CODE_PATH, STANDALONE_GPUS, SUBMIT_GPU_TYPE, EXACT, IMAGE, *JOB_FLAGS, *GPU_SUBMIT),
        ONE_WORKER_SPELLINGS,
    ),
    "submit cpu": Command(
        (COMMAND,),
        (TASK_NAME, CODE_PATH, CPUS, MEMORY, IMAGE, *JOB_FLAGS, *SUBMIT_FLAGS, *OUTPUT_FLAGS),
        ONE_WORKER_SPELLINGS,
    ),
    "create": Command(
        (),
        _in_order(
            (
                TASK_NAME,
                MODE,
                CODE_PATH,
                IMAGE,
                RESOURCE_PKG,
                CMD,
                WORKERS,
                MIN_WORKERS,
                WORKER_IMAGE,
                CPUS,
                MEMORY,
                *CREATE,
            ),
            CREATE_ORDER,
        ),
        FLAG_SPELLINGS,
    ),
    "task": Command(
        TASK_IDS_AND_FLAG,
        (TASK_ID_FLAGS, ALL, STATE, USER, LIMIT, SELECTOR, ARRAY_FILTER, *OUTPUT_FLAGS),
    ),
    "instance": Command(TASK_IDS_AND_FLAG, (TASK_ID_FLAGS, *OUTPUT_FLAGS)),
    "log": Command((TASK_ID_ARGUMENT,), (INSTANCE_ID, LOG_TASK_ID, TAIL, FOLLOW)),
    "wait": Command(TASK_IDS_AND_FLAG, (TASK_ID_FLAGS, FOR_STATE, TIMEOUT, *OUTPUT_FLAGS)),
    "cancel": Command(TASK_IDS_AND_FLAG, (TASK_ID_FLAGS, YES, *OUTPUT_FLAGS)),
    "res": Command((), OUTPUT_FLAGS),
}
"""Every command the downloadable `hai` has, with the flags both CLIs give it (the full one adds
only the connection flags, `--watch` and `-f FILE`; `tests/cli/test_portable.py` holds it to that)."""
