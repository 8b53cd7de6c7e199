"""What an outside engineer found integrating pager into their own agent in a first afternoon, the 21st
pass: the Python API (`pager.Toolkit`, `pager.Home`), function-calling dispatch, `pager mcp`, `pager
serve`'s REST, and `--db s3://…` settings. Each test fails on the code before its fix."""

import json

import pytest
from typer.testing import CliRunner

import pager
from pager.cli.app import app
from pager.config import Config
from pager.errors import ConfigError, InputError, PagerError, StoreError, ToolError

ENV = {"PAGER_EMBEDDER": "hash"}
runner = CliRunner()


def _turns(home, session: str) -> list[str]:
    result = runner.invoke(app, ["--home", str(home), "export", "-s", session], env=ENV)
    assert result.exit_code == 0, result.output
    return [json.loads(line)["text"] for line in result.stdout.splitlines()]


@pytest.mark.parametrize("trace", [True, False])
def test_a_closed_toolkit_refuses_every_call_naming_the_fix(tmp_path, trace):
    """`memory.remember(...)` after `memory.close()` (or after the `with` block) raised `ValueError: I/O
    operation on closed file` from the trace writer; without a trace it reopened the closed home's journal
    behind its back and stored the turn. Now every call, typed or `call`, raises a PagerError saying the
    Toolkit is closed and to make a new one, and nothing is stored."""
    home = tmp_path / "home"
    with pager.Toolkit(config=Config(home=home, session="agent", embedder="hash"), trace=trace) as memory:
        memory.remember("The deploy key lives in the vault.")
    for late in (lambda: memory.remember("said after close"), lambda: memory.search("vault"),
                 lambda: memory.call("remember", '{"text": "said after close"}')):
        with pytest.raises(PagerError, match="closed.*new pager.Toolkit") as refused:
            late()
        assert not isinstance(refused.value, ToolError)
    memory.close()   # closing twice stays harmless
    assert _turns(home, "agent") == ["The deploy key lives in the vault."]


def test_a_message_whose_text_is_not_a_string_says_so(tmp_path):
    """`session.append("Maya", 5)` was refused as "an empty message has nothing to remember"; the text was
    there, it was a number. The refusal names the type and how to send it."""
    with pager.Home(Config(home=tmp_path / "home", embedder="hash")) as home:
        session = home.open("work")
        with pytest.raises(InputError) as refused:
            session.append("Maya", 5)  # type: ignore[arg-type]
        assert "must be a string, not int 5" in str(refused.value) and "empty" not in str(refused.value)
        with pytest.raises(InputError, match="empty"):
            session.append("Maya", "   ")


@pytest.mark.parametrize("field", ["speaker", "ref", "key"])
def test_a_message_field_that_is_not_text_is_refused_not_stored_as_its_str(tmp_path, field):
    """A speaker, ref or key that is not a string (a number, a list) was stored as its `str()`: a
    speaker `['Maya']` showed as "['Maya']" in every page. Refused like a role or a date, naming it;
    nothing of the group is accepted."""
    with pager.Home(Config(home=tmp_path / "home", embedder="hash")) as home:
        session = home.open("work")
        with pytest.raises(InputError) as refused:
            session.append_many([{"speaker": "Maya", "text": "fine"},
                                 {"speaker": "Maya", "text": "the bad one", field: ["Maya"]}])
        assert f"{field!r} must be text, not list" in str(refused.value)
        assert session.turn_count == 0


def test_rest_state_of_a_session_without_turns_is_404_not_set_then_unreadable(tmp_path):
    """`PUT /sessions/new/state/k` on a session with no turns answered 200 "state 'k' set", and then `GET
    /sessions/new/state` (and `GET /sessions/new`, `GET /sessions`) said "no session 'new'". A session
    begins with a turn, as every reader counts it: the PUT (and DELETE) is a 404 naming how to start one,
    and once it has a turn the state is set and read back."""
    from test_serve import Running

    running = Running(tmp_path)
    try:
        with running.http() as http:
            for refused in (http.put("/sessions/fresh/state/gym", json={"value": "Tuesdays"}),
                            http.delete("/sessions/fresh/state/gym")):
                assert refused.status_code == 404, refused.text
                error = refused.json()["error"]
                assert error["code"] == "session_not_found" and "POST /sessions/fresh/turns" in error["message"]
            assert http.get("/sessions/fresh/state").status_code == 404
            assert http.post("/sessions/fresh/turns", json={"messages": [{"content": "hello"}]}).status_code == 201
            assert http.put("/sessions/fresh/state/gym", json={"value": "Tuesdays"}).status_code == 200
            assert http.get("/sessions/fresh/state").json()["state"]["gym"]["value"] == "Tuesdays"
    finally:
        running.stop()


@pytest.mark.parametrize("env, named", [
    ({"PAGER_S3_ENDPOINT": "127.0.0.1:9000"}, "PAGER_S3_ENDPOINT=http://127.0.0.1:9000"),
    ({"AWS_ENDPOINT_URL": "minio:9000"}, "AWS_ENDPOINT_URL=http://minio:9000"),
    ({"PAGER_S3_ALLOW_HTTP": "maybe"}, "PAGER_S3_ALLOW_HTTP='maybe' is not true or false"),
    ({"PAGER_S3_ENDPOINT": "http://127.0.0.1:9000", "PAGER_S3_ALLOW_HTTP": "false"}, "PAGER_S3_ALLOW_HTTP=true"),
])
def test_object_store_settings_lancedb_cannot_read_are_refused_naming_the_setting(tmp_path, env, named):
    """An endpoint without its scheme made LanceDB's Rust side panic (a backtrace on stderr, then "rust future
    panicked: unknown error"); `PAGER_S3_ALLOW_HTTP=maybe` came back as a parse error naming a Rust source
    file; `=false` beside an http:// endpoint as a retry dump. Each is refused before the store is touched
    (exit 2), naming the setting and the fix; none of it matters for a store on local disk."""
    result = runner.invoke(app, ["--home", str(tmp_path / "home"), "--db", "s3://bucket1/team", "search", "x"],
                           env={**ENV, **env})
    assert result.exit_code == 2, result.output
    assert named in result.output and "Traceback" not in result.output and "panicked" not in result.output
    local = runner.invoke(app, ["--home", str(tmp_path / "home"), "sessions"], env={**ENV, **env})
    assert local.exit_code == 0, local.output


def test_an_object_store_uri_without_a_bucket_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"names no bucket; give s3://BUCKET/PREFIX"):
        Config.load(env={"PAGER_DB": "s3://"}, home=tmp_path)
    assert Config.load(env={"PAGER_DB": "s3://bucket1/x"}, home=tmp_path).db == "s3://bucket1/x"


def test_a_store_of_another_vector_size_names_the_python_setting_too(tmp_path):
    """`pager.Config(home=…)` reads no environment, so with PAGER_EMBEDDER=hash exported the README's Python
    example opened a hash store with wordllama, and the refusal said to set PAGER_EMBEDDER, which was set.
    It now names `Config(embedder=...)` and `Config.load(...)` as well."""
    from pager.store import LanceStore

    LanceStore(str(tmp_path / "db"), dim=256).close()
    with pytest.raises(StoreError, match=r"Config\(embedder=\.\.\.\), or Config\.load"):
        LanceStore(str(tmp_path / "db"), dim=64)


def test_a_wrong_list_argument_reads_as_english(tmp_path):
    """`bookmark` with keywords as an object answered "keywords must be a list of a strings"."""
    with pager.Toolkit(config=Config(home=tmp_path / "home", session="agent", embedder="hash"), trace=False) as memory:
        memory.remember("The deploy key lives in the vault.")
        text = memory.call("bookmark", '{"page_ids": ["p1"], "keywords": {"vault": 1}}')
        assert "keywords must be a list of strings, got {'vault': 1}" in text, text
        text = memory.call("bookmark", '{"page_ids": [["p1"]], "keywords": ["vault"]}')
        assert "page_ids must be a string, got ['p1']" in text, text


def test_a_closed_home_refuses_writes_naming_the_fix(tmp_path):
    """Left by the pass and fixed after it: a `pager.Home` written after `close()` opened a new journal
    segment behind the close and accepted the turn (durable, found by the next process, but written
    through a home its program had let go of). Turns, state and bookmarks are refused now, and nothing
    is written."""
    from pager.embed import HashEmbedder
    from pager.home import Home

    config = Config(home=tmp_path / "h", budget=2048, page_tokens=128, embedder="hash")
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("notes")
        s.append("ann", "the boat leaves at nine")
    for write in (lambda: s.append("ann", "written after close"), lambda: s.set_state("k", "v"),
                  lambda: s.bookmark([1], ["boat"])):
        with pytest.raises(StoreError, match="was closed.*new pager.Home"):
            write()
    assert not list((home.local / "journal").glob("*.wal"))
    assert _turns(tmp_path / "h", "notes") == ["the boat leaves at nine"]


@pytest.mark.parametrize("given", [{"session": 123}, {"user": ["bob"]}, {"home": 5}])
def test_settings_of_the_wrong_type_name_the_setting(tmp_path, given):
    """Left by the pass and fixed after it: `pager.Toolkit(session=123)` was an AttributeError from deep in
    the engine, `home=5` a TypeError. Config refuses them, naming the setting."""
    name = next(iter(given))
    with pytest.raises(ConfigError, match=f"{name} must be"):
        Config(**({"home": tmp_path / "h"} | given))
    with pytest.raises(ConfigError, match=f"{name} must be"):
        pager.Toolkit(**({"home": tmp_path / "h"} | given))


@pytest.mark.parametrize("uri, named", [("gs://bucket/pager", "GOOGLE_APPLICATION_CREDENTIALS"),
                                        ("az://container/pager", "AZURE_STORAGE_ACCOUNT_KEY"),
                                        ("s3://bucket/pager", "AWS_*")])
def test_a_store_that_cannot_be_opened_names_its_own_clouds_settings(uri, named):
    """A `gs://` store that could not be opened was told to check `AWS_*`; each names its own settings."""
    from pager.store import _settings_hint

    said = _settings_hint(uri)
    assert named in said and (uri.startswith("s3") or "AWS" not in said), said
