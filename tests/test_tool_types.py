"""One type walk for a tool's schema and its argument checks: what the schema allows is accepted, and
what it refuses is said in plain English."""

from __future__ import annotations

import json
from typing import Literal, Optional

import pytest
from jsonschema import Draft202012Validator

from pager.tools import Dispatcher
import pager
from pager.config import Config

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


def tune(session, mode: Literal["fast", "slow"], ratio: float, label: str | None = None,
         limit: Optional[int] = None, verbose: bool = False, weights: list[float] = [],  # noqa: B006 - a schema default
         level: Literal[1, 2, 3] | None = None) -> str:
    """A tool with the parameter types the built-in tools do not use.

    Args:
        mode: how to run
        ratio: a share between 0 and 1
        label: an optional name
        limit: an optional cap
        verbose: say more
        weights: one number per item
        level: an optional level
    """
    return json.dumps({"mode": mode, "ratio": ratio, "label": label, "limit": limit, "verbose": verbose,
                       "weights": weights, "level": level})


KIT = Dispatcher((tune,))
PARAMS = KIT.schemas()[0]["function"]["parameters"]
BASE = {"mode": "fast", "ratio": 0.5}
POOL = [None, "", "x", "fast", "slow", "medium", "5", "2.5", "true", 0, 1, 2, 5, 2.5, -0.25, True, False,
        [], ["a"], [1.5, 2], [True], {"a": 1}]


def test_schema_is_valid_json_schema_with_the_declared_types():
    Draft202012Validator.check_schema(PARAMS)
    props = PARAMS["properties"]
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"], "description": "how to run"}
    assert props["ratio"]["type"] == "number"
    assert props["label"]["type"] == ["string", "null"] and props["limit"]["type"] == ["integer", "null"]
    assert props["level"]["enum"] == [1, 2, 3, None]
    assert props["weights"]["items"] == {"type": "number"}
    assert PARAMS["required"] == ["mode", "ratio"]


@pytest.mark.parametrize("name", ["mode", "ratio", "label", "limit", "verbose", "weights", "level"])
def test_every_value_the_schema_allows_is_accepted_and_every_refusal_the_schema_also_refuses(name):
    validator = Draft202012Validator(PARAMS)
    accepted = 0
    for value in POOL:
        args = {**BASE, name: value}
        allowed = validator.is_valid(args)
        text, ok = KIT.run(None, "tune", args)
        if allowed:
            assert ok, (name, value, text)
            got = json.loads(text)[name]
            widened = type(value) is int and type(got) is float   # a float parameter given 2 gets 2.0
            assert got == value and (type(got) is type(value) or widened), (name, value, got)
            accepted += 1
        if not ok:
            assert not allowed, (name, value, text)
            assert text.startswith(f"tune: {name} must be "), text
    assert accepted >= 2, f"the pool gave {name} too few valid values to mean anything"


@pytest.mark.parametrize("args, fix", [
    ({"mode": "medium", "ratio": 0.5}, "mode must be one of 'fast', 'slow', got 'medium'"),
    ({"mode": "fast", "ratio": "half"}, "ratio must be a number like 0.5, got 'half'"),
    ({"mode": "fast", "ratio": 0.5, "label": 7.5j}, "label must be a string or null"),
    ({"mode": "fast", "ratio": 0.5, "level": 4}, "level must be one of 1, 2, 3 or null, got 4"),
    ({"mode": "fast", "ratio": 0.5, "weights": ["heavy"]}, "weights must be a number like 0.5, got 'heavy'"),
    ({"mode": "fast", "ratio": 0.5, "verbose": "maybe"}, "verbose must be true or false"),
    ('{"mode": "fast", "ratio": NaN}', "ratio must be a finite number"),
])
def test_a_refusal_names_the_parameter_and_what_to_send(args, fix):
    text, ok = KIT.run(None, "tune", args)
    assert not ok and fix in text, text


def test_what_a_model_plausibly_meant_is_coerced():
    got = json.loads(KIT.call(None, "tune", {"mode": "slow", "ratio": "0.25", "limit": "3", "level": "2",
                                             "weights": 1, "verbose": "true"}))
    assert got == {"mode": "slow", "ratio": 0.25, "label": None, "limit": 3, "verbose": True, "weights": [1.0],
                   "level": 2}


def test_a_type_no_schema_describes_fails_when_the_tool_is_registered():
    def odd(session, when: complex) -> str:
        """Odd."""
        return ""

    with pytest.raises(TypeError, match="tool odd, parameter when: no JSON schema"):
        Dispatcher((odd,))


def test_a_wrong_list_argument_reads_as_english(tmp_path):
    """`bookmark` with keywords as an object answered "keywords must be a list of a strings"."""
    with pager.Toolkit(config=Config(home=tmp_path / "home", session="agent", embedder="hash"), trace=False) as memory:
        memory.remember("The deploy key lives in the vault.")
        text = memory.call("bookmark", '{"page_ids": ["p1"], "keywords": {"vault": 1}}')
        assert "keywords must be a list of strings, got {'vault': 1}" in text, text
        text = memory.call("bookmark", '{"page_ids": [["p1"]], "keywords": ["vault"]}')
        assert "page_ids must be a string, got ['p1']" in text, text
