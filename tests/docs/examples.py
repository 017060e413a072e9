"""The examples in README.md and docs/: how a page marks them, how they are found, run and compared.

Which blocks run (a fenced block's language is the first word after its opening ``` or ~~~):

- ```toml — every one is a complete `hai serve` config file and must pass
  `hai serve --check-config FILE` (exit 0), unless the line before it is `<!-- not-a-hai-config -->`
  (a client.toml, an Airflow setting, a fragment that cannot stand alone). A variable that a
  `[[users]]` entry names in `token_env` is set for the check, as the operator would set it.
- ```console after `<!-- runnable -->` — run, and its output compared (rules below).
- ```python after `<!-- runnable -->` — run with the project's Python; it must exit 0 (its output
  is not compared; assert in the code what matters).
- Nothing else runs. `<!-- runnable as=NAME -->` runs a console or python block as user NAME.
- Any block after `<!-- file name=PATH -->` is saved, as shown, to PATH (relative) in the working
  directory of every runnable block, of every page: a page shows a file once (the toy `train.py`
  of Getting started) and any page's examples may run it by name. File blocks of the same name
  must hold the same text.

"The line before" is the nearest non-blank line above the opening fence. An HTML comment there that
is not one of these markers, a marker on a block it does not apply to, or an unknown option is an
error, so a typo cannot quietly turn an example off.

Where runnable blocks run: each block on its own, with a fresh `hai serve`
(tests/support/live_server.py's TEST_CONFIG: one node of 8 virtual V100s, packages 100 (CPU) and
454-457 (1/2/4/8 x V100), users admin, alice, bob, carol (group admin of vision), dave; each user's
token is `NAME-token`), so its first job is task 1 and instance 1, and a fresh working directory
(the cwd) holding the sample training code of include/ (`train.py`, a checkpointing trainer,
`classifier.py`, `preprocess.py`, `train_distributed.py`), then every file block, which may replace
one of those (Getting started's `train.py` does). The environment has HAI_SERVER, HAI_TOKEN
(admin's, or NAME's with `as=NAME`), HAI_HOME (the server's home: its `token` and `config.toml`),
and the project's virtual environment first on PATH (`hai`, `python3`).

Console blocks:

- A line starting with `$ ` is a command; a command line ending in `\\` continues on the next line.
  The other lines, up to the next command, are what that command prints (stdout and stderr
  together, in the order printed).
- The commands run in order in one bash (`set -o pipefail`), so `cd`, variables and `$?` carry from
  one command to the next. No background processes; the block must end within 120 s.
- Output is compared line by line after masking what varies, on both sides: ISO dates and times
  (`2026-11-30 16:15:45`, `2026-11-30T16:15:45Z`) and durations (`2s`, `1m30s`, `250ms`) become one
  token each, every other number (ids, counts, ports, `0.333`, `1,019`) another; spaces at either
  end of a line are dropped and runs of spaces become one (table alignment); trailing blank lines
  are dropped. An expected line `...` matches any number of lines, none included. A command with
  no expected lines must print nothing.
- Exit status: a command whose last expected line is `# exit N` must exit N (that line is not
  output); else one whose expected output has a line starting `Error: ` must exit non-zero; else
  one followed by the command `echo $?` may exit with any status (that command shows it); every
  other command must exit 0.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNABLE = "runnable"
NOT_A_HAI_CONFIG = "not-a-hai-config"
FILE = "file"
MARKERS: dict[str, tuple[frozenset[str] | None, frozenset[str], frozenset[str]]] = {
    RUNNABLE: (frozenset({"console", "python"}), frozenset({"as"}), frozenset()),
    NOT_A_HAI_CONFIG: (frozenset({"toml"}), frozenset(), frozenset()),
    FILE: (None, frozenset({"name"}), frozenset({"name"})),
}
"""Marker -> (languages it applies to, None = any; options it takes; options it needs)."""
BLOCK_TIMEOUT = 120.0
ELLIPSIS = "..."


class ExampleFailed(AssertionError):
    """An example does not do what its page says."""


# ---- finding blocks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One fenced block of a page, with the marker on the line before it."""

    source: str
    line: int
    """1-based line of the opening fence."""
    lang: str
    text: str
    marker: str | None = None
    """The comment's text (`runnable as=alice`) when an HTML comment is the line before the fence."""

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"

    @property
    def kind(self) -> str | None:
        return self.marker.split()[0] if self.marker else None

    @property
    def options(self) -> dict[str, str]:
        words = self.marker.split()[1:] if self.marker else []
        return dict(w.split("=", 1) if "=" in w else (w, "") for w in words)

    @property
    def runnable(self) -> bool:
        return self.kind == RUNNABLE

    @property
    def saves(self) -> str | None:
        """The path a file block is saved to in every working directory."""
        return self.options.get("name") if self.kind == FILE else None

    @property
    def hai_config(self) -> bool:
        """A toml block that must pass `hai serve --check-config`."""
        return self.lang == "toml" and self.kind != NOT_A_HAI_CONFIG


FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
COMMENT = re.compile(r"^\s*<!--\s*(?P<text>.*?)\s*-->\s*$")


def scan(text: str, source: str = "<text>") -> list[Block]:
    """Every fenced block of a markdown text, in order, with the comment on the line before it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        info = opening["info"].strip()
        lang = info.split()[0].lower() if info else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = re.match(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j])
            if closing is not None:
                break
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            j += 1
        marker = None
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and (comment := COMMENT.match(lines[k])) is not None:
            marker = comment["text"]
        blocks.append(Block(source, i + 1, lang, "\n".join(body) + "\n" if body else "", marker))
        i = j + 1
    return blocks


def marker_problems(block: Block) -> list[str]:
    """What is wrong with the marker of a block: unknown, on the wrong language, unknown option."""
    if block.kind is None:
        return []
    if block.kind not in MARKERS:
        known = ", ".join(f"<!-- {m} -->" for m in MARKERS)
        return [f"{block.id}: unknown marker <!-- {block.marker} --> before a fence (known: {known})"]
    langs, options, needed = MARKERS[block.kind]
    problems = []
    if langs is not None and block.lang not in langs:
        problems.append(
            f"{block.id}: <!-- {block.kind} --> applies to {', '.join(sorted(langs))} blocks, "
            f"not {block.lang or 'a block without a language'}"
        )
    problems += [
        f"{block.id}: <!-- {block.kind} --> takes no option {o!r}" for o in block.options if o not in options
    ]
    problems += [
        f"{block.id}: <!-- {block.kind} --> needs {o}=..." for o in needed if not block.options.get(o)
    ]
    name = block.options.get("name", "") if block.kind == FILE else ""
    if name.startswith("/") or ".." in Path(name).parts:
        problems.append(f"{block.id}: <!-- {FILE} name={name} -->: give a relative path without ..")
    return problems


def pages(repo: Path = REPO) -> list[tuple[str, str]]:
    """(name, text) of README.md and every hand-written page under docs/ (not docs/reference/)."""
    found = [repo / "README.md"]
    docs = repo / "docs"
    if docs.is_dir():
        found += sorted(p for p in docs.rglob("*.md") if "reference" not in p.relative_to(docs).parts[:1])
    return [(str(p.relative_to(repo)), p.read_text(encoding="utf-8")) for p in found if p.is_file()]


def all_blocks(repo: Path = REPO) -> list[Block]:
    return [b for name, text in pages(repo) for b in scan(text, name)]


# ---- toml: hai serve --check-config ------------------------------------------------------------------


def token_env_names(text: str) -> list[str]:
    """The variables the `[[users]]` of a config name in `token_env` (none when it is not TOML)."""
    try:
        users = tomllib.loads(text).get("users", [])
    except tomllib.TOMLDecodeError:
        return []
    return [u["token_env"] for u in users if isinstance(u, dict) and isinstance(u.get("token_env"), str)]


def check_config(text: str) -> tuple[int, str]:
    """(exit code, output) of `hai serve --check-config FILE` for a config text, run in-process."""
    from typer.testing import CliRunner

    from hai_airflow.cli.main import app

    with tempfile.TemporaryDirectory(prefix="hai-doc-config-") as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(text, encoding="utf-8")
        env = {name: f"doc-example-{name.lower()}-0123456789abcdef" for name in token_env_names(text)}
        env["HAI_HOME"] = str(Path(tmp) / "home")
        result = CliRunner().invoke(app, ["serve", "--check-config", str(path)], env=env)
        return result.exit_code, result.output


def assert_hai_config(block: Block) -> None:
    code, output = check_config(block.text)
    if code != 0:
        raise ExampleFailed(
            f"{block.id}: `hai serve --check-config` refused this toml block (exit {code}):\n{output}"
            f"Fix the example, or put <!-- {NOT_A_HAI_CONFIG} --> on the line before it if it is not "
            "a hai serve config file."
        )


# ---- console: commands and what they print -----------------------------------------------------------


@dataclass
class Command:
    line: int
    """1-based line in the page of the command's `$ `."""
    text: str
    expected: list[str] = field(default_factory=list)
    exit_code: int | None = 0
    """What it must exit with; None: anything but 0 (it shows an `Error:` line)."""
    status_shown: bool = False
    """The next command is `echo $?`: any exit status is fine, that command shows it."""

    def exit_problem(self, got: int) -> str | None:
        if self.status_shown and self.exit_code == 0:
            return None
        if self.exit_code is None:
            return None if got != 0 else "exited 0, but its output shows an `Error:` line"
        if got == self.exit_code:
            return None
        hint = "" if self.exit_code else f" (write `# exit {got}` as its last output line if meant)"
        return f"exited {got}, not {self.exit_code}{hint}"


def commands(block: Block) -> list[Command]:
    """The commands of a console block with their expected output and exit code."""
    out: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        number = block.line + 1 + i
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
            out.append(Command(number, text))
        elif not out:
            if line.strip():
                raise ExampleFailed(f"{block.source}:{number}: output before the first `$ ` command")
        else:
            out[-1].expected.append(line)
        i += 1
    if not out:
        raise ExampleFailed(f"{block.id}: a runnable console block without a `$ ` command")
    for n, command in enumerate(out):
        while command.expected and not command.expected[-1].strip():
            command.expected.pop()
        if command.expected and (m := re.fullmatch(r"\s*# exit (\d+)\s*", command.expected[-1])):
            command.exit_code = int(m[1])
            command.expected.pop()
        elif any(e.startswith("Error: ") for e in command.expected):
            command.exit_code = None
        if n + 1 < len(out) and out[n + 1].text.strip() == "echo $?":
            command.status_shown = True
    return out


TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2}|\s?UTC)?"
)
DURATION = re.compile(r"\b(?:\d+(?:\.\d+)?(?:ms|us|µs|s|m|h|d)){1,4}\b")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def mask(line: str) -> str:
    """A line with what varies between runs replaced: times, durations, numbers, spacing."""
    line = TIMESTAMP.sub("<time>", line)
    line = DURATION.sub("<duration>", line)
    line = NUMBER.sub("<n>", line)
    return " ".join(line.split())


def matches(expected: Sequence[str], actual: Sequence[str]) -> bool:
    """Masked expected lines match masked actual lines; an expected `...` matches any run of lines."""
    exp = [ELLIPSIS if e.strip() == ELLIPSIS else mask(e) for e in expected]
    act = [mask(a) for a in actual]
    # can[i][j]: exp[i:] matches act[j:]
    can = [[False] * (len(act) + 1) for _ in range(len(exp) + 1)]
    can[len(exp)][len(act)] = True
    for i in range(len(exp) - 1, -1, -1):
        for j in range(len(act), -1, -1):
            if exp[i] == ELLIPSIS:
                can[i][j] = can[i + 1][j] or (j < len(act) and can[i][j + 1])
            else:
                can[i][j] = j < len(act) and exp[i] == act[j] and can[i + 1][j + 1]
    return can[0][0]


@dataclass(frozen=True)
class Ran:
    """What one command printed and how it exited."""

    output: list[str]
    exit_code: int


def run_commands(cmds: Sequence[Command], cwd: Path, env: Mapping[str, str]) -> list[Ran]:
    """Run the commands in order in one bash; each one's output and exit status."""
    mark = f"@@hai-doc-{uuid.uuid4().hex}@@"
    script = [
        "set -o pipefail",
        f"__hai_doc_mark() {{ local rc=$?; printf '\\n{mark} %d\\n' \"$rc\"; return $rc; }}",
    ]
    for c in cmds:
        script += [c.text, "__hai_doc_mark"]
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False, encoding="utf-8") as f:
        f.write("\n".join(script) + "\n")
    try:
        proc = subprocess.Popen(
            ["bash", f.name],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            raw, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raw, _ = proc.communicate()
            raise ExampleFailed(
                f"the block did not end within {BLOCK_TIMEOUT:.0f} s; output so far:\n"
                + raw.decode("utf-8", "replace")[-3000:]
            ) from None
    finally:
        os.unlink(f.name)
    text = raw.decode("utf-8", "replace")
    ran = []
    parts = re.split(rf"\n{re.escape(mark)} (\d+)\n", text)
    for output, code in zip(parts[0:-1:2], parts[1::2], strict=True):
        lines = output.splitlines()
        while lines and not lines[-1].strip():
            lines.pop()
        ran.append(Ran(lines, int(code)))
    if len(ran) < len(cmds):
        ran.append(Ran(parts[-1].splitlines(), -1))
    return ran


def console_problems(cmds: Sequence[Command], ran: Sequence[Ran]) -> list[str]:
    """Each command whose output or exit status is not what the block says."""
    problems = []
    for i, c in enumerate(cmds):
        if i >= len(ran):
            problems.append(f"line {c.line}: `$ {c.text}` never ran (the shell ended before it)")
            continue
        got = ran[i]
        if not matches(c.expected, got.output):
            expected = "\n".join(f"    {e}" for e in c.expected) or "    (nothing)"
            actual = "\n".join(f"    {a}" for a in got.output) or "    (nothing)"
            problems.append(f"line {c.line}: `$ {c.text}` printed\n{actual}\n  but the page says\n{expected}")
        if (problem := c.exit_problem(got.exit_code)) is not None:
            problems.append(f"line {c.line}: `$ {c.text}` {problem}")
    return problems


def assert_console(block: Block, cwd: Path, env: Mapping[str, str]) -> None:
    cmds = commands(block)
    problems = console_problems(cmds, run_commands(cmds, cwd, env))
    if problems:
        raise ExampleFailed(
            f"{block.id}: the console block does not do what it shows "
            "(numbers, times and spacing are masked; see tests/docs/examples.py):\n" + "\n".join(problems)
        )


# ---- python ------------------------------------------------------------------------------------------


def assert_python(block: Block, cwd: Path, env: Mapping[str, str]) -> None:
    """Run a python block with this interpreter; it must exit 0."""
    script = cwd / f"example_{Path(block.source).stem}_{block.line}.py".replace("-", "_")
    script.write_text(block.text, encoding="utf-8")
    try:
        done = subprocess.run(
            [sys.executable, script.name],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise ExampleFailed(
            f"{block.id}: the python block did not end within {BLOCK_TIMEOUT:.0f} s"
        ) from None
    if done.returncode != 0:
        raise ExampleFailed(
            f"{block.id}: the python block exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
        )


# ---- where runnable blocks run ------------------------------------------------------------------------


def saved_files(blocks: Sequence[Block]) -> dict[str, str]:
    """Path -> text of the file blocks; two of the same name must agree, and their markers hold."""
    files: dict[str, Block] = {}
    for block in blocks:
        if block.saves is None:
            continue
        if problems := marker_problems(block):
            raise ExampleFailed("\n".join(problems))
        other = files.setdefault(block.saves, block)
        if other.text != block.text:
            raise ExampleFailed(
                f"{block.id}: the file block {block.saves} differs from the one at {other.id}; "
                "show a file once, or twice the same"
            )
    return {name: block.text for name, block in files.items()}


def prepare_workdir(path: Path, files: Mapping[str, str] | None = None) -> Path:
    """A directory holding the sample training code of include/ (train.py and what it imports),
    then `files` (path -> text: the pages' file blocks)."""
    path.mkdir(parents=True, exist_ok=True)
    for script in sorted((REPO / "include").glob("*.py")):
        shutil.copy(script, path / script.name)
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text, encoding="utf-8")
    return path


def example_env(server_url: str, token: str, home: Path) -> dict[str, str]:
    """The environment of a runnable block: the server, a user's token, the venv first on PATH."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "TERM")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    venv_bin = str(Path(sys.executable).parent)
    env.update(
        {
            "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "/usr/bin:/bin")]),
            "HAI_SERVER": server_url,
            "HAI_TOKEN": token,
            "HAI_HOME": str(home),
            "PYTHONUNBUFFERED": "1",
            "PYTHONIOENCODING": "utf-8",
            "NO_COLOR": "1",
        }
    )
    return env


def run_block(block: Block, cwd: Path, env: Mapping[str, str]) -> None:
    """Run a runnable block (console or python); raise `ExampleFailed` when it does not hold."""
    if block.lang == "console":
        assert_console(block, cwd, env)
    elif block.lang == "python":
        assert_python(block, cwd, env)
    else:
        raise ExampleFailed(f"{block.id}: <!-- {RUNNABLE} --> on a {block.lang or 'plain'} block")
