"""Job files: what `to_yaml` writes, a YAML reader takes back as it was; `job_file` writes every field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from hai_airflow.cli.jobkeys import field_key
from hai_airflow.cli.jobspec import spec_from_file
from hai_airflow.jobfile import job_file, read_yaml, to_yaml
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
JSON_SHAPED = st.recursive(SCALARS, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner))


@given(JSON_SHAPED)
@example({"A\n": None})  # a plain-looking key with a trailing newline
def test_yaml_reads_back_what_to_yaml_writes(payload: Any) -> None:
    # Keys such as NO or on, numbers such as 1e-05, text with U+2028 or U+0085 included.
    assert yaml.safe_load(to_yaml(payload)) == payload
    assert read_yaml(to_yaml(payload)).data == payload


@pytest.mark.parametrize("model", [CpuJobSpec, StandaloneJobSpec, DistributedJobSpec])
def test_a_job_file_holds_every_field_of_its_mode(model: type[Any]) -> None:
    spec = {"task_name": "t", "code_path": "/c", "cmd": "x", "resource_pkg": 1, "workers": 2}
    spec |= {"worker_resource_pkg": 1, "mode": model.model_fields["mode"].default}
    spec = {k: v for k, v in spec.items() if k in model.model_fields}
    written = job_file({**spec, "time_limit_seconds": 5400})
    document = yaml.safe_load(written)
    assert sorted(document) == sorted(field_key(f) for f in model.model_fields)
    assert next(iter(document)) == "mode" and document["time_limit"] == "1h30m"
    # Keys and values are `hai create`'s flags', which read it back as the same spec.
    read = spec_from_file(written, "job.yaml").spec
    assert read == model.model_validate({**spec, "time_limit_seconds": 5400})
