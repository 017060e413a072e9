"""The downloadable `hai` (`GET /cli/hai`): the commands a job runs, for a plain `python3` (3.8+) with
nothing installed. Its flags come from `flagtable`, its requests from `api_routes`, its spec fields
from `jobfields` and what it prints from `columns` and `listing`, as the full `hai`'s do.

The server is $HAI_SERVER; the token $HAI_TOKEN, else the file $HAI_TOKEN_FILE names (a job's
credential). Tables are always the plain, space-aligned text the full `hai` prints when piped."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import datetime
from typing import TYPE_CHECKING

from hai_airflow import api_routes, arrays
from hai_airflow.cli import columns, flagtable, jobfields, listing
from hai_airflow.vocabulary import TERMINAL_STATES, JobState

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn

DESCRIPTION = (
    "hai inside a job: the commands a job runs, as the full hai has them. Server: $HAI_SERVER; token: "
    "$HAI_TOKEN, else the file $HAI_TOKEN_FILE names. Exit codes: 0 ok, 1 refused or failed, 2 bad "
    "usage; `hai wait` and --wait: 1 also when the task did not succeed, 124 timed out."
)
DEFAULT_SERVER = "http://127.0.0.1:8765"
DEFAULT_REGION = "default"
POLL_SECONDS = 30.0
"""The longest single long-poll of `hai wait`; the server answers sooner when the state changes."""
BAD_INPUT = (400, 422)
"""Refusals that mean the caller's input was wrong (exit 2); every other refusal is exit 1."""


class Refused(Exception):
    """The server refused, or could not be reached: the `Error:` line's text and the exit code."""

    def __init__(self, message: str, code: int, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field

    @property
    def whole(self) -> str:
        """The message naming the field the server named, where the message does not already."""
        return self.message + (
            f" (field {self.field})" if self.field and self.field not in self.message else ""
        )


class Record(dict):
    """An API record read from JSON, its fields as attributes too (`job.state`), as the columns read them."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _record(data: Any) -> Any:
    return Record(data) if isinstance(data, dict) else data


def read_json(text: str) -> Any:
    return json.loads(text, object_hook=_record)


def token() -> str | None:
    """$HAI_TOKEN, else the first line of the file $HAI_TOKEN_FILE names."""
    given = os.environ.get("HAI_TOKEN")
    if given:
        return given
    path = os.environ.get("HAI_TOKEN_FILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip() or None
    except OSError as error:
        raise Refused(f"cannot read HAI_TOKEN_FILE {path} ({error.strerror}). Check the path", 2) from None


def server_url() -> str:
    """$HAI_SERVER, else the server of the region ($HAI_REGION, else `default_region`) in
    $HAI_HOME/client.toml, else its `server`: as the full `hai` finds it."""
    given = os.environ.get("HAI_SERVER")
    if given:
        return given.rstrip("/")
    home = os.environ.get("HAI_HOME") or os.path.join(os.path.expanduser("~"), ".hai")
    path = os.path.join(home, "client.toml")
    config = client_config(path)
    region = os.environ.get("HAI_REGION") or config.get("default_region") or DEFAULT_REGION
    regions = config.get("regions", {})
    if region in regions:
        return str(regions[region]).rstrip("/")
    if region != DEFAULT_REGION and os.environ.get("HAI_REGION"):
        known = ", ".join(sorted(regions)) or "none configured"
        raise Refused(
            f"unknown region {region!r} in HAI_REGION (known: {known}). "
            f"Unset HAI_REGION, or add it under [regions] in {path}.",
            2,
            "HAI_REGION",
        )
    return str(config.get("server") or DEFAULT_SERVER).rstrip("/")


def client_config(path: str) -> dict[str, Any]:
    """$HAI_HOME/client.toml, where there is one; reading it needs Python 3.11's tomllib."""
    if not os.path.exists(path):
        return {}
    try:
        import tomllib
    except ImportError:
        raise Refused(f"reading {path} needs Python 3.11 or later. Set HAI_SERVER instead", 2) from None
    with open(path, "rb") as file:
        config: dict[str, Any] = tomllib.load(file)
    return config


def _query(params: dict[str, Any] | None) -> str:
    if not params:
        return ""
    words = {k: ("true" if v else "false") if isinstance(v, bool) else v for k, v in params.items()}
    return "?" + urllib.parse.urlencode(words)


def _refusal(status: int, text: str, server: str) -> Refused:
    """hai's refusal (`{"error", "field", "fix"}`) as the full CLI words it; any other answer says
    the server is not a hai server."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not (isinstance(body, dict) and isinstance(body.get("error"), str)):
        return Refused(f"{server} is not a hai server (HTTP {status}, not an answer hai gives)", 1)
    message = body["error"].rstrip(".") + "."
    if body.get("fix"):
        message += " " + str(body["fix"]).rstrip(".") + "."
    return Refused(message, 2 if status in BAD_INPUT else 1, str(body.get("field") or ""))


def open_request(request: api_routes.Request) -> Any:
    """Send one request; the open response, or `Refused`."""
    server = server_url()
    data = None if request.body is None else json.dumps(request.body).encode()
    headers = {"Accept": request.expect, "User-Agent": "hai-portable"}
    credential = token()
    if credential:
        headers["Authorization"] = f"Bearer {credential}"
    if data is not None:
        headers["Content-Type"] = api_routes.JSON
    url = server + request.path + _query(request.params)
    sent = urllib.request.Request(url, data=data, headers=headers, method=request.method)
    try:
        return urllib.request.urlopen(sent, timeout=request.timeout or 60)
    except urllib.error.HTTPError as error:
        raise _refusal(error.code, error.read().decode("utf-8", "replace"), server) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise Refused(
            f"cannot reach the hai server at {server} ({reason}). Point HAI_SERVER at a running one", 1
        ) from None


def call(request: api_routes.Request) -> Any:
    """Send one request; its JSON as records (or its text for a log)."""
    with open_request(request) as answer:
        text = answer.read().decode("utf-8")
    return text if request.expect == api_routes.TEXT else read_json(text)


# ---- printing -------------------------------------------------------------------------------


def out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def note(message: str) -> None:
    print(message, file=sys.stderr)


def output_format(args: argparse.Namespace) -> str:
    try:
        fmt = flagtable.output_format(args.output, args.as_json)
    except ValueError as error:
        raise Refused(str(error), 2) from None
    if fmt == "yaml":
        raise Refused("-o yaml needs the full hai (pip install hai-airflow). Use -o json here", 2)
    return fmt


def show(
    data: Any,
    cols: Sequence[listing.Column],
    args: argparse.Namespace,
    one: bool,
    title: str | None = None,
    sections: Sequence[listing.Section] = (),
    empty: str = "nothing to show",
) -> None:
    """Print a record or a listing as the full `hai` prints it when piped."""
    fmt = output_format(args)
    rows = [data] if one else data
    if fmt == "json":
        print(json.dumps(data, ensure_ascii=False, indent=2))
    elif fmt == "name":
        out("".join(f"{row.id}\n" for row in rows))
    elif fmt == "csv":
        out(listing.csv_text(rows, cols, not args.no_headers))
    else:
        if not one and not data:
            note(empty)
        grids = listing.listing_grids(data, one, cols, fmt == "wide", not args.no_headers, title, sections)
        out(listing.plain_tables(grids))


# ---- commands -------------------------------------------------------------------------------


def each(ids: Sequence[int], act: Callable[[int], Any]) -> tuple[list[Any], int]:
    """Act on every id; a refusal prints its `Error:` line and the rest still run; the worst code."""
    results, code = [], 0
    for job_id in ids:
        try:
            results.append(act(job_id))
        except Refused as refused:
            note(listing.error_line(refused.message))
            code = max(code, refused.code)
    return results, code


def task_ids(args: argparse.Namespace, command: str) -> list[int]:
    ids = list(dict.fromkeys([*(args.ids or ()), *(args.task_id or ())]))
    if not ids:
        raise Refused(
            f"give a task id, as in `hai {command} 42` or --task-id 42. See `hai {command} --help`", 2
        )
    return ids


def _rule(rule: Callable[..., Any], *given: Any) -> Any:
    try:
        return rule(*given)
    except ValueError as error:
        raise Refused(str(error), 2) from None


def submit_job(mode: str, fields: dict[str, Any], args: argparse.Namespace) -> int:
    """Send the spec as the full `hai` does; print `created task ID`, or the job; --wait waits. The
    server checks the spec as for the full `hai`; its refusal names the flags."""
    output_format(args)
    try:
        job = call(api_routes.submit(submit_body(mode, fields, args)))
    except Refused as refused:
        short = args.run != "create"
        names = jobfields.SUBMIT_FLAG_NAMES if short else jobfields.CREATE_FLAG_NAMES
        bad_input = refused.code == 2
        message = jobfields.submit_refusal(refused.message, refused.field, bad_input, names, args.run)
        raise Refused(message, refused.code) from None
    return report_submitted(job, args)


def submit_body(mode: str, fields: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """{spec, client_key, array}: what the full `hai` sends for the same flags."""
    spec = {k: v for k, v in jobfields.absolute_code_path(fields).items() if v is not None}
    body: dict[str, Any] = {"spec": {**spec, "mode": mode}}
    body["client_key"] = args.client_key or f"hai-cli-{uuid.uuid4().hex}"
    if args.array is not None:
        body["array"] = args.array
    return body


def report_submitted(job: Any, args: argparse.Namespace) -> int:
    fmt = output_format(args)
    ids = [job.id]
    if args.array is not None:
        found = call(api_routes.jobs(array=job.id, limit=arrays.MAX_ELEMENTS))
        ids = sorted(j.id for j in found)
        note(f"array {job.id}: {arrays.describe(arrays.parse(args.array))}, tasks {columns.id_runs(ids)}")
    if fmt in ("table", "wide"):
        print(f"created task {job.id}")
    elif not args.wait:
        show(job, (), args, one=True)
    return wait_and_report(ids, None, args.wait_timeout, args) if args.wait else 0


def submit_short(mode: str, args: argparse.Namespace) -> int:
    """`hai submit standalone|cpu`: the spec from the flags; a GPU task on the smallest package that fits."""
    fields = _rule(jobfields.short_form_fields, mode, vars(args))
    if mode == "standalone":
        packages = call(api_routes.resource_packages())
        ask = jobfields.GpuAsk(args.gpus, args.gpu_type, args.exact)
        package, chosen = _rule(jobfields.package_for, packages, ask)
        if chosen is not None:
            note(chosen)
        fields.update(resource_pkg=package.id, gpu_type=package.gpu_type)
    return submit_job(mode, fields, args)


def create(args: argparse.Namespace) -> int:
    return submit_job(args.mode, _rule(jobfields.create_fields, vars(args)), args)


def task(args: argparse.Namespace) -> int:
    chosen = list(dict.fromkeys([*(args.ids or ()), *(args.task_id or ())]))
    if not chosen:
        listed = call(
            api_routes.jobs(
                args.user, args.state_filter, None, args.all_, args.limit, None, args.selector, args.array
            )
        )
        cols = columns.job_columns(datetime.now(listing.utc()), with_user=args.all_ or args.user is not None)
        show(listed, cols, args, one=False, empty="no tasks; submit one with `hai create` or `hai submit`")
        return 0
    found, code = each(chosen, lambda i: call(api_routes.job(i)))
    detail = columns.job_detail_columns(lambda mode: None)
    if output_format(args) in ("json", "name"):
        if found:
            show(found if len(chosen) > 1 else found[0], detail, args, one=len(chosen) == 1)
        return code
    for job in found:
        events = listing.Section("Events", job.events, columns.EVENT_COLUMNS)
        show(job, detail, args, one=True, title=f"Task {job.id}", sections=(events,))
    return code


def instance(args: argparse.Namespace) -> int:
    chosen = task_ids(args, "instance")
    runs, code = each(chosen, lambda i: call(api_routes.instances(i)))
    listed = [run for found in runs for run in found]
    # Runs of several tasks name their task in every view, not only in -o wide.
    cols = [
        listing.Column(c.header, c.cell, c.justify, c.wide and len(chosen) == 1)
        for c in columns.INSTANCE_COLUMNS
    ]
    named = " ".join(map(str, chosen))
    if runs:
        show(listed, cols, args, one=False, empty=f"not started yet; `hai task {named}` says why it waits")
    return code


def log(args: argparse.Namespace) -> int:
    if args.id_ is not None and args.task_id is not None and args.id_ != args.task_id:
        raise Refused(f"two different task ids ({args.id_} and --task-id {args.task_id}). Give one", 2)
    job_id = args.id_ if args.id_ is not None else args.task_id
    if (job_id is None) == (args.instance_id is None):
        raise Refused(
            "give either a task id (`hai log 42`, or --task-id 42) or --instance-id N. "
            "Find a task's instance ids with `hai instance TASK_ID`",
            2,
        )
    if args.tail < 0:
        raise Refused("--tail must be 0 (the whole log) or a positive number of lines", 2)
    chosen = args.instance_id if job_id is None else latest_instance(job_id)
    if not args.follow:
        out(call(api_routes.log(chosen, args.tail)))
        return 0
    with open_request(api_routes.follow_log(chosen, args.tail)) as answer:
        for line in iter(answer.readline, b""):
            out(line.decode("utf-8", "replace"))
    return 0


def latest_instance(job_id: int) -> int:
    runs = call(api_routes.instances(job_id))
    if runs:
        return max(run.id for run in runs)
    job = call(api_routes.job(job_id))
    started = "never started" if job.state in TERMINAL_STATES else "has not started yet"
    raise Refused(
        f"no log: {columns.standing(job)}. The task {started}; `hai task {job_id}` shows its events", 1
    )


def await_task(job_id: int, target: str | None, deadline: float) -> columns.Outcome:
    """Long-poll one task until it is in `target` (None: until it ends), can no longer get there, or
    `deadline` (time.monotonic) passes."""
    job = call(api_routes.job(job_id))
    while True:
        if target is not None and job.state == target:
            return columns.Outcome(job, reached=True)
        if job.state in TERMINAL_STATES:
            passed = any(e.to_state == target for e in job.get("events", ()))
            reached = job.state == JobState.SUCCEEDED if target is None else passed
            return columns.Outcome(job, reached=reached)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return columns.Outcome(job, reached=False, timed_out=True)
        call(api_routes.wait(job_id, job.state, min(remaining, POLL_SECONDS)))
        job = call(api_routes.job(job_id))


def wait_and_report(
    ids: Sequence[int], target: str | None, timeout: float | None, args: argparse.Namespace
) -> int:
    deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
    outcomes, code = each(ids, lambda i: await_task(i, target, deadline))
    if output_format(args) in ("table", "wide"):
        for outcome in outcomes:
            print(columns.describe(outcome, target))
    elif outcomes:
        jobs = [o.job for o in outcomes]
        show(jobs[0] if len(ids) == 1 else jobs, (), args, one=len(ids) == 1)
    return max(code, columns.outcome_code(outcomes))


def wait(args: argparse.Namespace) -> int:
    chosen = task_ids(args, "wait")
    if output_format(args) == "name":
        raise Refused(
            "-o name has nothing to add to `hai wait`. Use -o json, -o yaml or the default lines", 2
        )
    return wait_and_report(chosen, args.for_state, args.timeout, args)


def cancel(args: argparse.Namespace) -> int:
    chosen = task_ids(args, "cancel")
    lines = output_format(args) in ("table", "wide")

    def act(job_id: int) -> Any:
        job = call(api_routes.cancel(job_id))
        if lines:
            print(columns.cancel_line(job))
        return job

    jobs, code = each(chosen, act)
    if not lines and jobs:
        show(jobs[0] if len(chosen) == 1 else jobs, (), args, one=len(chosen) == 1)
    return code


def res(args: argparse.Namespace) -> int:
    packages = call(api_routes.resource_packages())
    show(packages, columns.PACKAGE_COLUMNS, args, one=False, empty="the server offers no resource packages")
    return 0


RUN: dict[str, Callable[[argparse.Namespace], int]] = {
    "submit standalone": lambda args: submit_short("standalone", args),
    "submit cpu": lambda args: submit_short("cpu", args),
    "create": create,
    "task": task,
    "instance": instance,
    "log": log,
    "wait": wait,
    "cancel": cancel,
    "res": res,
}

# ---- the parser, from the table -------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse that refuses as the full `hai` does: one `Error:` line naming the command's help, exit 2."""

    def error(self, message: str) -> NoReturn:
        # A bad value in the full `hai`'s (click's) words: "Invalid value for '--gpus': ...".
        message = re.sub(r"^argument ([^:]+): ", r"Invalid value for '\1': ", message)
        note(listing.error_line(f"{message}. See `{self.prog} --help`"))
        sys.exit(2)


def _reader(flag: flagtable.Flag | flagtable.Argument) -> Callable[[str], Any]:
    def read(text: str) -> Any:
        try:
            return flagtable.read_value(flag, text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return read


def _add_flag(parser: argparse.ArgumentParser, flag: flagtable.Flag, spellings: dict[str, str]) -> None:
    help_text = flag.help.replace("%", "%%")
    if flag.kind == flagtable.BOOL:
        parser.add_argument(*flag.names, dest=flag.dest, action="store_true", help=help_text)
    else:
        repeats = flag.kind in (flagtable.TEXTS, flagtable.INTS)
        parser.add_argument(
            *flag.names,
            dest=flag.dest,
            type=_reader(flag),
            action="append" if repeats else "store",
            default=flag.default,
            metavar=flag.metavar,
            help=help_text,
        )
    for other, listed in spellings.items():
        if "--" + listed == flag.names[0]:
            parser.add_argument("--" + other, dest=flag.dest, type=_reader(flag), help=argparse.SUPPRESS)


def _add_argument(parser: argparse.ArgumentParser, arg: flagtable.Argument) -> None:
    if arg.kind == flagtable.TEXTS:
        nargs = "+" if arg.required else "*"
        parser.add_argument(arg.dest, nargs=nargs, metavar=arg.metavar, help=arg.help)
    else:
        nargs = "*" if arg.kind == flagtable.INTS else "?"
        parser.add_argument(arg.dest, nargs=nargs, type=_reader(arg), metavar=arg.metavar, help=arg.help)


def build_parser() -> argparse.ArgumentParser:
    """`hai` with the commands of `flagtable.COMMANDS`, `hai submit` holding its two."""
    root = Parser(prog="hai", description=DESCRIPTION, allow_abbrev=False)
    commands = root.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    submit = commands.add_parser("submit", help="Submit a job in the short form.", allow_abbrev=False)
    kinds = submit.add_subparsers(dest="kind", metavar="KIND", parser_class=Parser)
    for name, command in flagtable.COMMANDS.items():
        group, _, kind = name.partition(" ")
        place = kinds if kind else commands
        parser = place.add_parser(kind or group, help=f"`hai {name}`, as the full hai.", allow_abbrev=False)
        for arg in command.arguments:
            _add_argument(parser, arg)
        for flag in command.flags:
            _add_flag(parser, flag, dict(command.spellings))
        parser.set_defaults(run=name)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit code (0 ok, 1 refused or failed, 2 bad usage, 124 a wait timed out)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return RUN[args.run](args)
    except Refused as refused:
        note(listing.error_line(refused.whole))
        return refused.code
    except KeyboardInterrupt:
        return 130
