"""A task acting for the person behind its run: the one way operators and sensors pick their hai user."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from hai_airflow.client import HaiError
from hai_airflow.hooks.hai import HaiHook
from hai_airflow.hooks.identity import HAI_USER_PARAM, Acting, NobodyToActFor, person_behind
from hai_airflow.hooks.retry import is_transient

if TYPE_CHECKING:
    from airflow.sdk import Context


def act_for_run(
    hook: HaiHook, context: Context, *, hai_user: str | None, owner: str | None, log: logging.Logger | Any
) -> Acting:
    """Make `hook` act for the run's person (hooks.identity.person_behind), as the server confirms.

    :raises AirflowFailException: nobody to act for, a malformed ``user_map``, or the server refused.
    :raises AirflowException: the server could not be asked (a retry may succeed).
    """
    dag_run = context.get("dag_run")
    params = context.get("params") or {}
    try:
        person = person_behind(
            triggering_user=getattr(dag_run, "triggering_user_name", None),
            hai_user=hai_user or params.get(HAI_USER_PARAM),
            owner=owner,
            default_owner=conf.get("operators", "default_owner", fallback="airflow"),
        )
    except NobodyToActFor as e:
        raise AirflowFailException(str(e)) from None
    try:
        acting = hook.act_for(person.airflow_user)
    except ValueError as e:
        raise AirflowFailException(f"connection {hook.hai_conn_id!r}: {e}") from None
    except HaiError as e:
        text = (
            f"hai will not let connection {hook.hai_conn_id!r} act for {person.airflow_user} "
            f"(the run's {person.source}): {e.message}"
        )
        if is_transient(e):
            raise AirflowException(text) from None
        raise AirflowFailException(text) from None
    via = f" via {acting.token_user}" if acting.on_behalf_of else ""
    log.info(
        "acting for hai user %s (group %s)%s: the run's %s %s",
        acting.user,
        acting.group,
        via,
        person.source,
        person.airflow_user,
    )
    return acting
