"""Who a hai job submitted from Airflow belongs to: the person behind the run, as a hai user name."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

AIRFLOW_DEFAULT_OWNER = "airflow"
"""The owner Airflow gives a task nobody declared one for: it names no person."""
HAI_USER_PARAM = "hai_user"
"""The DAG param (and operator argument) that names who a run nobody triggered acts for."""
USER_MAP_EXTRA = "user_map"
"""The connection extra that maps Airflow user names to hai user names."""

Source = Literal["triggering user", "hai_user", "owner"]


class NobodyToActFor(ValueError):
    """A run with no person behind it: hai will not fall back to the connection's own identity."""


class Person(BaseModel):
    """The Airflow user a run is attributed to, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    airflow_user: str = Field(description="The Airflow user name.")
    source: Source = Field(description="Where it came from: who triggered the run, hai_user, or the owner.")


class Acting(BaseModel):
    """Whom a hook acts for, as the server confirmed it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str = Field(description="The hai user the jobs belong to.")
    group: str = Field(description="Their resource group.")
    on_behalf_of: str | None = Field(
        description="The X-Hai-On-Behalf-Of sent; None when the token's own user."
    )
    token_user: str = Field(
        description="The user of the connection's token (a service identity, or the same)."
    )


def person_behind(
    *,
    triggering_user: str | None,
    hai_user: str | None,
    owner: str | None,
    default_owner: str = AIRFLOW_DEFAULT_OWNER,
) -> Person:
    """The person a run acts for, in order:

    1. who triggered it (a manual or REST trigger), so a trigger never borrows someone else's quota;
    2. `hai_user` (the operator's argument, else the DAG param), for runs nobody triggered;
    3. the task's declared owner, unless it is Airflow's default owner or lists several people.

    :raises NobodyToActFor: none of them names one person.
    """
    if triggering_user and triggering_user.strip():
        return Person(airflow_user=triggering_user.strip(), source="triggering user")
    if hai_user and hai_user.strip():
        return Person(airflow_user=hai_user.strip(), source="hai_user")
    owners = [o.strip() for o in (owner or "").split(",") if o.strip()]
    people = [o for o in owners if o not in (default_owner, AIRFLOW_DEFAULT_OWNER)]
    if len(people) == 1:
        return Person(airflow_user=people[0], source="owner")
    why = (
        f"its owner {owner!r} lists several people"
        if len(people) > 1
        else "it was not triggered by a user and declares no owner"
    )
    raise NobodyToActFor(
        f"no person to submit the hai job for: {why}. Set `hai_user` on the operator (or a "
        f"`{HAI_USER_PARAM}` DAG param), or one `owner` in the DAG's default_args; hai does not fall "
        "back to the connection's own identity"
    )


def user_map(extra: Mapping[str, Any]) -> dict[str, str]:
    """The connection's ``user_map`` extra (Airflow user -> hai user), checked.

    :raises ValueError: it is not an object of names.
    """
    raw = extra.get(USER_MAP_EXTRA) or {}
    if isinstance(raw, str):  # a form may save the object as its JSON text
        with contextlib.suppress(ValueError):
            raw = json.loads(raw)
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) and v for v in raw.values()):
        raise ValueError(
            f"the connection extra `{USER_MAP_EXTRA}` must be an object of names, "
            'e.g. {"alice@corp": "alice"}'
        )
    return {str(k): v for k, v in raw.items()}


def hai_user_name(airflow_user: str, mapping: Mapping[str, str]) -> str:
    """The hai user of an Airflow user: the connection's ``user_map`` entry, else the same name."""
    return mapping.get(airflow_user, airflow_user)
