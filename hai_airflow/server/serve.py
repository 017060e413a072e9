"""`hai serve`: read (or write) the config, open the store, start the controller and the HTTP server."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from types import FrameType

import uvicorn
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from hai_airflow.backends import BackendUnavailable, load_backend, options_model
from hai_airflow.backends.common.base import Backend
from hai_airflow.client import hai_home
from hai_airflow.scheduling import POLICIES
from hai_airflow.server.api.app import create_app
from hai_airflow.server.config import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ConfigError,
    ServerConfig,
    default_config_text,
    default_nodes,
    load_config,
)
from hai_airflow.server.control.controller import Controller
from hai_airflow.server.errors import ServerStopping
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.provision import (
    apply_config,
    claim_token_key,
    unset_token_env,
    write_private,
    write_token_file,
)
from hai_airflow.server.store.database import Store, database_url
from hai_airflow.server.store.lease import holder_identity
from hai_airflow.server.store.tokens import KEY_FILE_NAME, read_or_create_key
from hai_airflow.spec import NodeConfig

log = logging.getLogger("hai.server")


def detected_nodes(backend: Backend) -> list[NodeConfig] | None:
    """The backend's inventory (nvidia-smi, the Kubernetes API) as config nodes; None when it has none."""
    try:
        found = backend.inventory()
    except Exception:
        log.exception("GPU inventory failed; using virtual GPUs")
        return None
    if not found:
        return None
    return [
        NodeConfig(
            name=n.name, gpu_type=n.gpu_type, gpus=n.gpus, cpus=n.cpus, memory_gb=n.memory_gb, virtual=False
        )
        for n in found
    ]


def load_or_create_config(
    path: Path | None, home: Path, host: str | None = None, port: int | None = None
) -> ServerConfig:
    """The given file, else `$HAI_HOME/config.toml`, written with defaults on first start (with the
    host and port that start was given, so the next start without them listens there too)."""
    if path is None:
        path = home / "config.toml"
        if not path.exists():
            home.mkdir(parents=True, exist_ok=True)
            local = load_backend("local", {}, home)
            try:
                text = default_config_text(
                    detected_nodes(local), host=host or DEFAULT_HOST, port=port or DEFAULT_PORT
                )
            finally:
                local.close()
            write_private(path, text)
            log.info("wrote a default config to %s", path)
    elif not path.exists():
        raise ConfigError(path, None, "the file does not exist")
    return load_config(path, sorted(POLICIES))


HOME_MODE = 0o700
"""`$HAI_HOME` as created: the store, the token, the key and every job's files are the server's alone."""


def make_home_private(home: Path) -> None:
    """Create `$HAI_HOME` 0700; an older, wider one loses read and write for others (traversal stays)."""
    home.mkdir(mode=HOME_MODE, parents=True, exist_ok=True)
    mode = home.stat().st_mode & 0o777
    if mode & 0o066:
        try:
            home.chmod(mode & ~0o066)
        except OSError as e:
            log.warning("cannot make %s private (%s); others may list it", home, e.strerror)


def token_key_path(config: ServerConfig, home: Path) -> Path:
    """HAI_TOKEN_KEY_FILE, else `[server] token_key_file`, else `$HAI_HOME/token.key`."""
    named = os.environ.get("HAI_TOKEN_KEY_FILE") or config.server.token_key_file
    return Path(named).expanduser() if named else home / KEY_FILE_NAME


def open_store(
    config: ServerConfig, home: Path, nodes: list[NodeConfig], config_path: Path | None = None
) -> Store:
    """Connect, migrate to the newest schema, and apply the config's groups, users and nodes."""
    key_path = token_key_path(config, home)
    try:
        key = read_or_create_key(key_path)
    except (OSError, ValueError) as e:
        raise ConfigError(config_path, "server.token_key_file", f"cannot use the token key: {e}") from None
    store = Store(database_url(config.server.database_url, home), key)
    store.migrate()
    if not claim_token_key(store):
        store.dispose()
        raise ConfigError(
            config_path,
            "server.token_key_file",
            f"the store's tokens were hashed under another key than {key_path}; give every server on "
            "this database the same key file (copy it, or point token_key_file / HAI_TOKEN_KEY_FILE at it)",
        )
    generated = apply_config(store, config, nodes)
    write_token_file(store, config, home, generated)
    return store


def require_token_env(config: ServerConfig, config_path: Path | None) -> None:
    """Every user's `token_env` names a variable set in this environment."""
    unset = unset_token_env(config)
    if unset is not None:
        i, variable = unset
        raise ConfigError(
            config_path,
            f"users[{i}].token_env",
            f"{variable} is not set in hai serve's environment; set it to a long random secret "
            "(e.g. `openssl rand -hex 24`)",
        )


def backend_options_error(error: ValidationError, config_path: Path | None) -> ConfigError:
    """A backend's refusal of its `[backend]` table, naming the field as `backend.<key>`."""
    err = error.errors()[0]
    field = ".".join(["backend", *(str(p) for p in err["loc"])])
    return ConfigError(config_path, field, str(err["msg"]).removeprefix("Value error, "))


def check_config(path: Path) -> ServerConfig:
    """What `hai serve --config path` checks before it opens the store: the file, the token variables
    its users name, and the `[backend]` options of its backend (validated, not connected to)."""
    config = load_config(path, sorted(POLICIES))
    require_token_env(config, path)
    try:
        model = options_model(config.server.backend)
    except BackendUnavailable as e:
        raise ConfigError(path, "server.backend", str(e)) from None
    try:
        model.model_validate(config.backend)
    except ValidationError as e:
        raise backend_options_error(e, path) from None
    return config


def check_main(path: Path) -> None:
    """`hai serve --check-config FILE`: exit 0 when `hai serve` would accept FILE, else 2 and why.
    Starts nothing and writes nothing: no store, no backend, no `$HAI_HOME`."""
    try:
        check_config(path)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"config {path} is valid")


def build(
    config: ServerConfig, home: Path, config_path: Path | None = None
) -> tuple[ServerContext, Controller]:
    """The store, the backend and the controller for `config` (exits are the caller's business)."""
    require_token_env(config, config_path)
    try:
        backend = load_backend(config.server.backend, config.backend, home)
    except BackendUnavailable as e:
        raise ConfigError(config_path, "server.backend", str(e)) from None
    except ValidationError as e:
        raise backend_options_error(e, config_path) from None
    nodes = list(config.nodes) or default_nodes(detected_nodes(backend))
    store = open_store(config, home, nodes, config_path)
    ctx = ServerContext(store=store, config=config, home=home, holder_id=holder_identity())
    return ctx, Controller(ctx, backend)


def port_problem(host: str, port: int) -> str | None:
    """Why we could not listen on host:port (checked before anything starts), or None."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        return e.strerror or str(e)
    return None


def warn_at_start(config: ServerConfig, ctx: ServerContext) -> None:
    """What the server's log says at start about settings a shared cluster should have, and the store."""
    if config.paths.allowed is None and config.server.backend != "local":
        log.warning(
            "[paths] allowed is not set: jobs may mount any directory but system paths and $HAI_HOME; "
            'set e.g. allowed = ["/nas/{user}", "/nas/groups/{group}"] on a shared cluster'
        )
    if config.server.job_url is None and config.server.backend != "local":
        log.warning(
            "[server] job_url is not set: %s jobs get no HAI_SERVER, so `hai` inside a job cannot reach "
            "this server unless the job sets HAI_SERVER itself; set job_url to an address jobs reach, "
            'e.g. job_url = "http://hai.hai.svc:8765"',
            config.server.backend,
        )
    advice = ctx.store.upkeep_advice()
    if advice is not None:
        log.warning(advice)


def reachable_url(host: str, port: int) -> str:
    """The URL a process on this machine reaches a server listening on host:port at: the loopback
    address for a server listening on every interface."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Serving(uvicorn.Server):
    """uvicorn's server, telling the API the moment a stop is asked: uvicorn first waits for open
    connections to close, and a followed log or a long-poll would hold it up to its grace."""

    def __init__(self, settings: uvicorn.Config, ctx: ServerContext) -> None:
        super().__init__(settings)
        self.ctx = ctx

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.ctx.stop_serving()
        super().handle_exit(sig, frame)


def _no_stopping_traceback(record: logging.LogRecord) -> bool:
    """A followed log cut by the stop is expected: uvicorn's "Exception in ASGI application" is not logged."""
    return not (record.exc_info and isinstance(record.exc_info[1], ServerStopping))


def main(config_path: Path | None = None, host: str | None = None, port: int | None = None) -> None:
    """Run `hai serve` until interrupted; exits 2 on a bad config, 1 when the database is unusable."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The dashboard at /ui reads through the API with httpx, which logs every request at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    home = hai_home()
    try:
        make_home_private(home)
        config = load_or_create_config(config_path, home, host, port)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    bind_host = host or config.server.host
    bind_port = port or config.server.port
    problem = port_problem(bind_host, bind_port)
    if problem is not None:
        print(
            f"Error: cannot listen on {bind_host}:{bind_port} ({problem}). "
            "Stop the other server or pick another --port.",
            file=sys.stderr,
        )
        raise SystemExit(1)
    try:
        ctx, controller = build(config, home, config_path or home / "config.toml")
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except SQLAlchemyError as e:
        print(
            f"Error: cannot use the database ({type(e).__name__}: {str(e).splitlines()[0]}). "
            "Check HAI_DATABASE_URL or [server] database_url.",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    ctx.listen_url = reachable_url(bind_host, bind_port)
    app = create_app(ctx, controller)
    log.info(
        "hai serve on http://%s:%d (store: %s, backend: %s)",
        bind_host,
        bind_port,
        ctx.store.dialect,
        config.server.backend,
    )
    warn_at_start(config, ctx)
    # Long-polls and followed logs end as the stop is asked (`Serving`); the grace is for the rest.
    settings = uvicorn.Config(
        app,
        host=bind_host,
        port=bind_port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    logging.getLogger("uvicorn.error").addFilter(_no_stopping_traceback)
    Serving(settings, ctx).run()
    ctx.store.dispose()
