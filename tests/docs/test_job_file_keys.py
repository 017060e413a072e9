"""The CLI guide's table of job-file keys is the one `hai create`'s flags make: a flag added, renamed or
re-described changes what the test expects, so the page cannot drift from the reader."""

from __future__ import annotations

import re
from pathlib import Path

from hai_airflow.cli import jobkeys

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
TABLE = re.compile(r"<!-- job-file keys:[^\n]*-->\n(.*?)<!-- end of job-file keys -->\n", re.S)


def test_the_guides_table_of_job_file_keys_is_made_from_the_flags() -> None:
    found = TABLE.search(GUIDE.read_text(encoding="utf-8"))
    assert found, f"{GUIDE} has no job-file keys table between its markers"
    assert found[1] == jobkeys.keys_table(), (
        "docs/cli.md's job-file keys table differs from `hai create`'s flags: replace it with what "
        "hai_airflow.cli.jobkeys.keys_table() returns"
    )


def test_every_key_of_the_table_is_read_by_a_job_file() -> None:
    keys = re.findall(r"^\| `([a-z_]+)` \|", jobkeys.keys_table(), re.M)
    assert keys == list(jobkeys.KEYS)
    values = jobkeys.file_values({key.replace("_", "-"): None for key in keys})
    assert values.problems == [] and set(values.written) == set(keys)
