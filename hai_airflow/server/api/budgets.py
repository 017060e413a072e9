"""Budgets per user: how much long-lived work of one kind (cp streams, execs) each user holds at once."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from fastapi import Request

from hai_airflow.server.errors import ApiError

_MAKING = threading.Lock()


class Budget:
    """What each user holds of one kind of work; a claim past the limit is refused with 429 naming
    `[limits] <setting>`, and the other users are untouched."""

    def __init__(self, setting: str, what: str) -> None:
        self.setting = setting
        self.what = what
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    def claim(self, user: str, limit: int, fix: str) -> Claim:
        """One more for `user`, or ApiError 429 when they already hold `limit`."""
        with self._lock:
            held = self._held[user]
            if held >= limit:
                raise ApiError(
                    429,
                    f"{user} already has {held} {self.what}, as many as "
                    f"[limits] {self.setting} = {limit} allows",
                    fix=f"{fix}, or ask the platform admin to raise [limits] {self.setting}",
                )
            self._held[user] = held + 1
        return Claim(self, user)

    def held(self, user: str) -> int:
        with self._lock:
            return self._held[user]

    def _give_back(self, claim: Claim) -> None:
        with self._lock:
            if claim.released:
                return
            claim.released = True
            self._held[claim.user] -= 1
            if self._held[claim.user] <= 0:
                del self._held[claim.user]


@dataclass
class Claim:
    """One unit of a user's budget, held until `release`, which may be called more than once and
    from any thread (the first call gives it back)."""

    budget: Budget
    user: str
    released: bool = False

    def release(self) -> None:
        self.budget._give_back(self)


def budget_of(request: Request, setting: str, what: str) -> Budget:
    """The app's budget for `[limits] <setting>`, made on first use (one per app, shared by its requests)."""
    with _MAKING:
        budgets: dict[str, Budget] = getattr(request.app.state, "budgets", None) or {}
        request.app.state.budgets = budgets
        return budgets.setdefault(setting, Budget(setting, what))
