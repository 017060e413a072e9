"""The backend as the API's own routes use it (live logs, `hai exec`, the jobs' account for `hai cp`)."""

from __future__ import annotations

import logging
import threading

from fastapi import Request

from hai_airflow.backends import load_backend
from hai_airflow.backends.common.base import Backend
from hai_airflow.server.process.context import ServerContext

logger = logging.getLogger(__name__)
_LOADING = threading.Lock()


def served_backend(request: Request, ctx: ServerContext) -> Backend | None:
    """The configured backend, made once per app on first use; None when it cannot be made now.

    It acts by the saved handles only, so any server answers, also a standby that does not run the
    controller, and it never starts or stops an instance.
    """
    name = ctx.config.server.backend
    with _LOADING:
        backend: Backend | None = getattr(request.app.state, "served_backend", None)
        if backend is None:
            try:
                backend = load_backend(name, ctx.config.backend, ctx.home)
            except Exception as e:
                logger.warning("the %s backend is unusable for the API's own requests: %s", name, e)
                return None
            request.app.state.served_backend = backend
    return backend
