"""Every example of README.md and docs/ holds: configs pass `--check-config`, runnable blocks run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.examples import (
    Block,
    all_blocks,
    assert_hai_config,
    example_env,
    marker_problems,
    prepare_workdir,
    run_block,
    saved_files,
)
from tests.support.live_server import TEST_CONFIG, TOKENS, start_server

BLOCKS = all_blocks()
CONFIGS = [b for b in BLOCKS if b.hai_config]
RUNNABLE = [b for b in BLOCKS if b.runnable]


def test_markers_are_known() -> None:
    problems = [p for b in BLOCKS for p in marker_problems(b)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", CONFIGS, ids=[b.id for b in CONFIGS])
def test_config_example_is_valid(block: Block) -> None:
    assert_hai_config(block)


def test_file_blocks_agree() -> None:
    saved_files(BLOCKS)  # raises, naming both blocks, where two of the same name differ


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_runnable_example(block: Block, tmp_path: Path) -> None:
    user = block.options.get("as", "admin")
    assert user in TOKENS, f"{block.id}: as={user}: no such user in the test config ({', '.join(TOKENS)})"
    workdir = prepare_workdir(tmp_path / "work", saved_files(BLOCKS))
    with start_server(tmp_path / "hai", TEST_CONFIG) as server:
        run_block(block, workdir, example_env(server.url, TOKENS[user], server.home))
