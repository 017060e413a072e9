"""Schemathesis against the API's own /openapi.json: no 5xx, responses as documented, and the
schema as strict as the validation (what it allows is accepted, what it forbids is refused)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from starlette.responses import Response

from hai_airflow.server.api.app import create_app
from hai_airflow.server.config import parse_config
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.provision import apply_config
from hai_airflow.server.store.database import Store
from hai_airflow.spec import REFUSED_ACROSS_FIELDS
from tests.support.live_server import TEST_CONFIG, TOKENS

schemathesis = pytest.importorskip(
    "schemathesis",
    reason="schemathesis is not installed: `pip install -e '.[dev]'` brings it",
)
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

SEED = 20261130
MAX_EXAMPLES = 12
"""Per operation and phase: enough to reach every field, small enough for two slow cores."""
SCHEMA_REFUSED = "x-test-refused-by"
"""Response header the test app adds: which layer refused a request (the request model, or a rule)."""

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def model_refused_what_the_schema_allows(ctx: Any, response: Any, case: Any) -> bool | None:
    """A request generated as valid for the schema must never fail the request model's validation:
    that would be a schema looser than the validation. Refusals by rules the schema cannot know
    (no such package, over quota, not yours) come from the routes and are allowed."""
    if case.meta is None or case.meta.generation.mode != schemathesis.GenerationMode.POSITIVE:
        return None
    if response.headers.get(SCHEMA_REFUSED, [""])[0] == "request model":
        raise AssertionError(
            f"{case.method} {case.path}: the schema allows this request but validation refused it: "
            f"{response.text[:500]}"
        )
    return True


def fuzz_app(tmp_path: Path) -> tuple[FastAPI, Store]:
    """The real app over a fresh SQLite store; no controller, so no fuzzed command ever runs."""
    home = tmp_path / "home"
    code = tmp_path / "code"
    code.mkdir()
    config = parse_config(TEST_CONFIG.replace("{home}", str(home)))
    store = Store(f"sqlite:///{tmp_path / 'hai.db'}")
    store.migrate()
    apply_config(store, config, list(config.nodes))
    app = create_app(ServerContext(store=store, config=config, home=home, holder_id="fuzz"))
    original = app.exception_handlers[RequestValidationError]

    async def marked(request: Request, exc: Exception) -> Response:
        response: Response = await original(request, exc)  # type: ignore[misc]
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        # Two fields compared is a rule the schema cannot state: like a route's, it may refuse.
        across = bool(errors) and all(e.get("type") == REFUSED_ACROSS_FIELDS for e in errors)
        response.headers[SCHEMA_REFUSED] = "a rule across fields" if across else "request model"
        return response

    app.exception_handlers[RequestValidationError] = marked
    seed_jobs(app, code)
    return app, store


def seed_jobs(app: FastAPI, code: Path) -> None:
    """A few jobs of two users, so generated ids and the stateful links reach real ones."""
    with TestClient(app) as client:
        for user, mode, extra in [
            ("alice", "standalone", {"resource_pkg": 454}),
            ("bob", "cpu", {}),
            ("admin", "distributed", {"workers": 2, "worker_resource_pkg": 457}),
        ]:
            spec = {"mode": mode, "task_name": f"seed {user}", "code_path": str(code), "cmd": "true", **extra}
            r = client.post(
                "/api/v1/jobs", json={"spec": spec}, headers={"Authorization": f"Bearer {TOKENS[user]}"}
            )
            assert r.status_code == 201, r.text


# The schema is read from the app when the module loads (parametrize needs the operations then), so
# the app and its store live in a directory of their own, removed when the module's tests end.
WORKDIR = Path(tempfile.mkdtemp(prefix="hai-fuzz-"))
APP, STORE = fuzz_app(WORKDIR)
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    APP,
    config=schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "headers": {"Authorization": f"Bearer {TOKENS['admin']}"},
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True},
        }
    ),
)


@schema.hook
def map_query(_context: Any, query: dict[str, Any] | None) -> dict[str, Any] | None:
    """A long-poll's valid `timeout` shortened: waiting for nothing is not what is tested here.
    Out-of-range values stay as generated, so they are still refused."""
    timeout = (query or {}).get("timeout")
    if query is not None and isinstance(timeout, int | float) and 0 <= timeout <= 600:
        query["timeout"] = min(timeout, 0.1)
    return query


@pytest.fixture(scope="module", autouse=True)
def _cleanup() -> Iterator[None]:
    yield
    STORE.dispose()
    shutil.rmtree(WORKDIR, ignore_errors=True)


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_documented(case: Any) -> None:
    case.call_and_validate(checks=CHECKS, additional_checks=[model_refused_what_the_schema_allows])


class _Workflow(schema.as_state_machine()):  # type: ignore[misc]
    """Chains of calls along the links schemathesis infers (submit -> show, cancel, promote ...)."""

    def validate_response(
        self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
    ) -> None:
        case.validate_response(
            response,
            checks=CHECKS,
            additional_checks=[model_refused_what_the_schema_allows],
            transport_kwargs=kwargs,
        )


TestStatefulWorkflow = _Workflow.TestCase
TestStatefulWorkflow.settings = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=6,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
