"""`python -m hai_airflow.server [--config FILE] [--host H] [--port P]` starts the control plane."""

from __future__ import annotations

import argparse
from pathlib import Path

from hai_airflow.server.serve import main


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hai_airflow.server", description=__doc__)
    parser.add_argument(
        "--config", type=Path, default=None, help="TOML config (default $HAI_HOME/config.toml)"
    )
    parser.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default 8765)")
    return parser.parse_args()


if __name__ == "__main__":
    args = _parse()
    main(args.config, args.host, args.port)
