"""The example harness itself: it finds the blocks a page marks, and a wrong example fails."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.docs.examples import (
    Block,
    ExampleFailed,
    all_blocks,
    assert_hai_config,
    check_config,
    commands,
    example_env,
    marker_problems,
    mask,
    matches,
    prepare_workdir,
    run_block,
    saved_files,
    scan,
)

PAGE = """# A page

Some text.

```toml
[server]
port = 8766
```

<!-- not-a-hai-config -->
```toml
server = "https://hai.example.com"
```

<!-- runnable as=alice -->

```console
$ echo hello
hello
```

1. A list item:

   <!-- runnable -->
   ```python
   print("indented")
   ```

~~~bash
echo not run
~~~
"""


def console(text: str) -> Block:
    return scan(f"<!-- runnable -->\n```console\n{text}```\n", "synthetic.md")[0]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return prepare_workdir(tmp_path / "work")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No server: these blocks only run shell commands and Python."""
    return example_env("http://127.0.0.1:9", "no-token", tmp_path / "home")


# ---- finding blocks -----------------------------------------------------------------------------------


def test_scan_finds_every_block_with_its_line_language_and_marker() -> None:
    blocks = scan(PAGE, "page.md")
    assert [(b.id, b.lang, b.kind, b.options) for b in blocks] == [
        ("page.md:5", "toml", None, {}),
        ("page.md:11", "toml", "not-a-hai-config", {}),
        ("page.md:17", "console", "runnable", {"as": "alice"}),
        ("page.md:25", "python", "runnable", {}),
        ("page.md:29", "bash", None, {}),
    ]
    assert [b.hai_config for b in blocks] == [True, False, False, False, False]
    assert [b.runnable for b in blocks] == [False, False, True, True, False]
    assert blocks[3].text == 'print("indented")\n'
    assert not [p for b in blocks for p in marker_problems(b)]


@pytest.mark.parametrize(
    ("page", "problem"),
    [
        pytest.param(
            "<!-- runable -->\n```console\n$ true\n```\n", "unknown marker", id="a misspelled marker"
        ),
        pytest.param(
            "<!-- runnable -->\n```bash\ntrue\n```\n", "applies to console, python", id="runnable bash"
        ),
        pytest.param(
            "<!-- not-a-hai-config -->\n```json\n{}\n```\n", "applies to toml", id="not-a-config json"
        ),
        pytest.param(
            "<!-- runnable user=bob -->\n```console\n$ true\n```\n", "no option 'user'", id="bad option"
        ),
        pytest.param("<!-- file -->\n```python\npass\n```\n", "needs name=", id="file without a name"),
        pytest.param(
            "<!-- file name=../x.py -->\n```python\npass\n```\n", "relative path", id="file outside"
        ),
    ],
)
def test_a_wrong_marker_is_an_error(page: str, problem: str) -> None:
    (block,) = scan(page, "synthetic.md")
    problems = marker_problems(block)
    assert len(problems) == 1
    assert problem in problems[0]


def test_the_real_pages_are_found() -> None:
    blocks = all_blocks()
    assert any(b.source == "README.md" for b in blocks)
    assert not [b for b in blocks if b.source.startswith("docs/reference/")]


# ---- toml ------------------------------------------------------------------------------------------------


def test_a_config_block_passes_and_a_misspelled_key_fails() -> None:
    (good,) = scan('```toml\n[server]\nbackend = "local"\nport = 8766\n```\n', "synthetic.md")
    assert_hai_config(good)
    (bad,) = scan('```toml\n[server]\nbackend = "local"\nprot = 8766\n```\n', "synthetic.md")
    with pytest.raises(
        ExampleFailed, match=r"(?s)synthetic\.md:1: .*at server\.prot: Extra inputs are not permitted"
    ):
        assert_hai_config(bad)


def test_a_real_config_example_with_a_misspelled_key_fails() -> None:
    """A copy of the first config example of the pages, its first key misspelled, is caught."""
    examples = [b for b in all_blocks() if b.hai_config and check_config(b.text)[0] == 0]
    if not examples:
        pytest.skip("no valid toml example in README.md or docs/ yet")
    block = examples[0]
    lines = block.text.splitlines()
    i = next(i for i, line in enumerate(lines) if "=" in line and not line.lstrip().startswith("#"))
    lines[i] = "x" + lines[i].lstrip()
    code, output = check_config("\n".join(lines) + "\n")
    assert code == 2, f"{block.id} with a misspelled key passed the check"
    # the misspelled key is unknown, or the key it was meant to be is now missing
    assert "Extra inputs are not permitted" in output or "Field required" in output, output


def test_token_variables_a_config_names_are_set_for_its_check() -> None:
    text = '[[groups]]\nname = "default"\n[[users]]\nname = "ci"\ntoken_env = "HAI_DOC_CI_TOKEN"\n'
    assert "HAI_DOC_CI_TOKEN" not in os.environ
    assert check_config(text)[0] == 0


# ---- console ---------------------------------------------------------------------------------------------


def test_masking_hides_numbers_times_durations_and_alignment() -> None:
    assert mask(" 1  first-job   RUNNING  2026-11-30 16:15:45  12s ") == mask(
        "12 first-job RUNNING 2027-01-02T03:04:05Z 1m30s"
    )
    assert mask("loss 0.333 after 1,019 steps") == mask("loss 12.5 after 7 steps")
    assert mask("task 1 SUCCEEDED") != mask("task 1 FAILED")


def test_an_ellipsis_line_matches_any_number_of_lines() -> None:
    assert matches(["first", "...", "last"], ["first", "last"])
    assert matches(["first", "...", "last"], ["first", "a", "b", "last"])
    assert matches(["..."], [])
    assert not matches(["first", "...", "last"], ["first", "a"])
    assert not matches([], ["something"])


def test_a_console_block_that_shows_what_it_prints_passes(workdir: Path, env: dict[str, str]) -> None:
    block = console(
        "$ echo 'task 42 started at 2026-11-30T16:15:45Z after 3s'\n"
        "task 7 started at 2025-01-01T00:00:00Z after 12s\n"
        "$ printf 'ID  NAME\\n 1  a\\n12  b\\n' | head -3\n"
        "ID NAME\n"
        "1 a\n"
        "...\n"
        "$ cd sub 2>/dev/null || mkdir sub && cd sub && X=5\n"
        '$ echo "$X in $(basename $PWD)" \\\n'
        "    && ls ../train.py\n"
        "5 in sub\n"
        "../train.py\n"
        "$ false\n"
        "$ echo $?\n"
        "1\n"
        "$ exit_with() { return $1; }; exit_with 3\n"
        "# exit 3\n"
        "$ echo done >&2\n"
        "done\n"
        "$ sh -c 'echo \"Error: job 99 not found.\" >&2; exit 1'\n"
        "Error: job 99 not found.\n"
    )
    assert [c.exit_code for c in commands(block)] == [0, 0, 0, 0, 0, 0, 3, 0, None]
    run_block(block, workdir, env)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("$ echo task 1 SUCCEEDED\ntask 1 FAILED\n", "but the page says", id="wrong output"),
        pytest.param(
            "$ echo hello\n", "printed\n    hello\n  but the page says\n    (nothing)", id="unshown output"
        ),
        pytest.param("$ true\nhello\n", "printed\n    (nothing)", id="missing output"),
        pytest.param("$ false\n", "exited 1, not 0 (write `# exit 1`", id="a failure not shown"),
        pytest.param("$ true\n# exit 2\n", "exited 0, not 2", id="a wrong exit status"),
        pytest.param("$ echo a; echo b\na\n", "but the page says", id="an extra line"),
        pytest.param(
            "$ echo 'Error: no'\nError: no\n", "exited 0, but its output shows an `Error:`", id="error 0"
        ),
    ],
)
def test_a_wrong_console_block_fails(workdir: Path, env: dict[str, str], text: str, problem: str) -> None:
    with pytest.raises(ExampleFailed) as failed:
        run_block(console(text), workdir, env)
    assert "synthetic.md:2: the console block does not do what it shows" in str(failed.value)
    assert problem in str(failed.value)


def test_output_before_the_first_command_is_an_error(workdir: Path, env: dict[str, str]) -> None:
    with pytest.raises(ExampleFailed, match="output before the first"):
        run_block(console("hello\n$ echo hello\n"), workdir, env)


def test_a_console_block_sees_the_server_and_the_project_python(workdir: Path, env: dict[str, str]) -> None:
    block = console(
        "$ echo $HAI_SERVER $HAI_TOKEN\n"
        "http://127.0.0.1:9 no-token\n"
        "$ command -v hai python3 | xargs -n1 dirname | uniq\n"
        f"{Path(sys.executable).parent}\n"
    )
    run_block(block, workdir, env)


# ---- python and files -----------------------------------------------------------------------------------


def test_a_python_block_must_exit_0(workdir: Path, env: dict[str, str]) -> None:
    (good,) = scan('<!-- runnable -->\n```python\nimport os\nassert os.environ["HAI_TOKEN"]\n```\n', "s.md")
    run_block(good, workdir, env)
    (bad,) = scan('<!-- runnable -->\n```python\nraise SystemExit("the example is wrong")\n```\n', "s.md")
    with pytest.raises(ExampleFailed, match=r"s\.md:2: the python block exited 1:\nthe example is wrong"):
        run_block(bad, workdir, env)


def test_file_blocks_are_in_every_working_directory(tmp_path: Path, env: dict[str, str]) -> None:
    shown = scan("<!-- file name=train.py -->\n```python\nprint('the page trains')\n```\n", "a.md")
    (ran,) = scan("<!-- runnable -->\n```console\n$ python3 train.py\nthe page trains\n```\n", "b.md")
    assert not ran.saves and shown[0].saves == "train.py" and not marker_problems(shown[0])
    files = saved_files([*shown, ran, *shown])
    assert files == {"train.py": "print('the page trains')\n"}
    run_block(ran, prepare_workdir(tmp_path / "work", files), env)


def test_two_different_file_blocks_of_one_name_are_an_error() -> None:
    one = scan("<!-- file name=train.py -->\n```python\npass\n```\n", "a.md")
    two = scan("<!-- file name=train.py -->\n```python\nraise SystemExit\n```\n", "b.md")
    with pytest.raises(
        ExampleFailed, match=r"b\.md:2: the file block train\.py differs from the one at a\.md:2"
    ):
        saved_files([*one, *two])
