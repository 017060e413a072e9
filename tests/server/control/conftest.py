"""The controller's tests: a server whose controller a test steps by hand, with the sample training code."""

from __future__ import annotations

import pytest

from tests.server.conftest import Api
from tests.server.scripts import ELASTIC, TRAIN


@pytest.fixture
def run(api: Api) -> Api:
    (api.code / "train.py").write_text(TRAIN)
    (api.code / "elastic.py").write_text(ELASTIC)
    api.with_controller()
    return api
