"""Alembic migrations of the hai store, applied automatically when `hai serve` starts."""
