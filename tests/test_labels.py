"""The label and selector grammar, pure: what it takes, how it matches, what it refuses."""

from __future__ import annotations

import pytest

from hai_airflow.labels import Requirement, encode, parse_pairs, parse_selector


def test_pairs_become_labels_and_the_store_keeps_them_sorted_between_commas() -> None:
    labels = parse_pairs(["team=vision", "stage=", "v1.2_rc-3=x"])
    assert labels == {"team": "vision", "stage": "", "v1.2_rc-3": "x"}
    assert encode(labels) == ",stage=,team=vision,v1.2_rc-3=x,"
    assert encode({}) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("team", "is not key=value"),
        ("-team=x", "label key '-team' is not"),
        ("team=a b", "label team: value 'a b' is not"),
        ("t" * 64 + "=x", "is not 1-63"),
        ("team=a,b", "value 'a,b' is not"),
    ],
)
def test_bad_pairs_are_refused_naming_them(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_pairs([text])


def test_a_selector_has_four_kinds_of_requirement() -> None:
    assert parse_selector("team=vision, stage!=eval,gpu,!draft,x==y") == (
        Requirement("team", "=", "vision"),
        Requirement("stage", "!=", "eval"),
        Requirement("gpu", "exists"),
        Requirement("draft", "absent"),
        Requirement("x", "=", "y"),
    )


@pytest.mark.parametrize("text", ["", " , ", "team=%", "a b", "!"])
def test_a_bad_selector_says_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="a selector is key=value, key!=value, key or !key"):
        parse_selector(text)
