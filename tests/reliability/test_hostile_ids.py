"""Hostile ids and queries: nothing outside the caller's namespace is read, written or deleted,
and nothing is written outside the home."""

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

import pytest

from pager.config import Config, name_problem
from pager.errors import InputError
from pager.embed import HashEmbedder
from pager.home import Home
from pager.tools import AGENT

SECRET = "the launch code is swordfish-7731"

hostile = st.one_of(
    st.sampled_from([
        "s3' OR '1'='1", "'; DROP TABLE pages; --", "%", "_", "*", ".*", "..", "../..", "../../etc/passwd",
        "/", "\\\\", "a/b\\\\c", "\x00", "nul\x00inside", "\x1b[31mred", "\n\r\t", " ", "😀🔥", "会話の記憶",
        "x" * 5000, "user = 'alice'", "session\" OR 1=1 --", "${HOME}", "$(rm -rf /)", "`id`", "default",
    ]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=80),
)


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(session=hostile, user=hostile, query=hostile, keyword=hostile)
def test_hostile_strings_stay_in_their_namespace(tmp_path_factory, session, user, query, keyword):
    root = tmp_path_factory.mktemp("iso")
    home_path = root / "home"
    cfg = Config(home=home_path, embedder="hash", budget=2048)
    with Home(cfg, embedder=HashEmbedder()) as home:
        victim = home.open("alice-private", user="alice")
        victim.append("alice", SECRET)
        for i in range(40):
            victim.append("alice", f"private note {i}")
    before = _files(root) - _files(home_path)
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open(session, user=user)
        assert s.turn_count == 0 or (session, user) == ("alice-private", "alice")
        if name_problem(session):   # a name pager serve could not reach: refused before anything is written
            with pytest.raises(InputError, match="session name"):
                s.append("mallory", "hello")
            s = home.open(session := "mallory-session", user=user)
        message = f"{query} {keyword} launch code swordfish"
        if "\x00" in message:
            with pytest.raises(InputError, match="NUL"):
                s.append("mallory", message)
            message = message.replace("\x00", "")
        s.append("mallory", message)
        for text in (AGENT.call(s, "search", {"query": f"{query} launch code swordfish"}),
                     AGENT.call(s, "page_in", {"page": keyword}),
                     AGENT.call(s, "bookmark", {"page_ids": ["p1"], "keywords": [keyword or "k"]}),
                     AGENT.call(s, "context", {"query": query})):
            assert "7731" not in text or (session, user) == ("alice-private", "alice")
    after = _files(root) - _files(home_path)
    assert after == before, f"files written outside the home: {after - before}"
    with Home(cfg, embedder=HashEmbedder()) as home:
        victim = home.open("alice-private", user="alice")
        assert victim.turn_count == 41
        assert [t.text for t in home.store.turns("alice", "alice-private")][0] == SECRET
    for path in home_path.rglob("*"):
        assert os.path.realpath(path).startswith(os.path.realpath(home_path))
