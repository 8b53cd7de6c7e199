"""What a platform engineer found deploying pager for a small team, the 22nd pass: `pager serve` on two
homes sharing one store on the local S3 server, `pager migrate`, `pager keys`, kills and restarts. Each
test fails on the code before its fix."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.config import Config

runner = CliRunner()


def test_migrate_of_an_object_store_made_with_the_default_embedder_says_it_is_up_to_date(tmp_path, s3):
    """The README's `pager --db s3://memory/team migrate`, run on a store `pager ingest` had just made,
    failed: "holds 128-dim vectors, the embedder makes 256; set PAGER_EMBEDDER…", with PAGER_EMBEDDER
    unset. The check for a store being there opened it as a store of 256-dim vectors; it now only lists
    its tables."""
    env, uri = s3
    data = tmp_path / "notes.jsonl"
    data.write_text(json.dumps({"speaker": "Maya", "text": "We chose Yjs over OT for the sync engine."}) + "\n")
    made = runner.invoke(app, ["--home", str(tmp_path / "a"), "--db", uri, "ingest", str(data), "-s", "planning"], env=env)
    assert made.exit_code == 0, made.output
    result = runner.invoke(app, ["--home", str(tmp_path / "b"), "--db", uri, "migrate"], env=env)
    assert result.exit_code == 0, result.output
    assert f"the store at {uri} is up to date" in result.output
    typo = runner.invoke(app, ["--home", str(tmp_path / "b"), "--db", uri + "-typo", "migrate"], env=env)
    assert typo.exit_code == 2 and "no pager store at" in typo.output, typo.output


def test_a_store_whose_region_cannot_be_found_names_the_region_settings():
    """With no region and no endpoint set, LanceDB asks AWS for the bucket's region; where it cannot, the
    one line quoted LanceDB's "Failed to resolve region for bucket 'memory', /root/.cargo/registry/src/…"
    (a path on the machine that built LanceDB). It names the settings that fix it. (Told here from
    LanceDB's text: reaching AWS is not something a test may do.)"""
    from pager.store import _open_failure

    lance = OSError("lance error: LanceError(IO): Generic S3 error: Failed to resolve region for bucket 'memory', "
                    "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/lance-io-13.0.0/src/object_store/pro")
    said = _open_failure(lance)
    assert "PAGER_S3_REGION or AWS_REGION" in said and ".cargo" not in said


def test_a_revoked_last_key_is_refused_not_served_as_the_local_user(tmp_path):
    """`pager keys revoke` of the server's only key left it with no keys, and a client still sending the
    revoked key was then served as the local user: its `POST /sessions/secret/turns` answered 201 and stored
    the turn in the local user's namespace (a session acme never sees), where a revoked key must be a 401.
    A pager key sent to a server that has none is refused now, and nothing is stored."""
    from test_serve import Running

    from pager.keys import KeyRing

    key_id, key = KeyRing(tmp_path).create("acme")
    running = Running(tmp_path)
    try:
        with running.http(key) as http:
            said = {"messages": [{"role": "user", "content": "acme's secret"}]}
            assert http.post("/sessions/secret/turns", json=said).status_code == 201
            KeyRing(tmp_path).revoke(key_id.id)
            refused = http.post("/sessions/secret/turns", json={"messages": [{"content": "sent after the revoke"}]})
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"]["code"] == "invalid_api_key" and "revoked" in refused.json()["error"]["message"]
        with running.http() as http:   # no key: the local user's sessions, which hold nothing
            assert http.get("/sessions").json()["data"] == []
    finally:
        running.stop()


def test_without_keys_a_peer_beyond_loopback_is_refused_whatever_its_host_header_says(tmp_path):
    """A server bound to 0.0.0.0 (allowed while it had keys) whose last key was revoked answered anyone on
    the network who sent `Host: 127.0.0.1`: the header is the client's to write. The peer's address is
    checked too now."""
    from starlette.requests import Request

    from pager.keys import KeyRing
    from pager.serve import RequestError, tenant_of

    def request(peer: str) -> Request:
        return Request({"type": "http", "method": "GET", "path": "/sessions", "headers": [(b"host", b"127.0.0.1:8765")],
                        "client": (peer, 40000)})

    keys = KeyRing(tmp_path)   # no keys file: no keys
    assert tenant_of(request("127.0.0.1"), keys, "") == ""
    assert tenant_of(request("::ffff:127.0.0.1"), keys, "") == ""
    for peer in ("192.0.2.7", "::ffff:192.0.2.7"):
        with pytest.raises(RequestError) as refused:
            tenant_of(request(peer), keys, "")
        assert refused.value.status == 403 and refused.value.code == "not_local"


@pytest.fixture(params=["disk", "s3"])
def one_store(request, tmp_path):
    """A Config maker for homes (hosts) sharing one store: a folder, or a bucket on the local S3 server."""
    env, uri = ({}, str(tmp_path / "store")) if request.param == "disk" else request.getfixturevalue("s3")

    def config(name: str) -> Config:
        return Config.load(env={**env, "PAGER_EMBEDDER": "hash"}, home=tmp_path / name, db=uri, budget=2048)

    return config


def test_a_server_reads_what_another_host_flushed_to_the_shared_store(one_store):
    """Two hosts, one store: after host A wrote a session and closed (flushed, lease given up), host B's
    `pager serve` listed no such session and answered 404 for it (its LanceDB tables stayed at the version
    it had first read), and once B had the session open, A's later turns and state changes never showed:
    `GET /sessions/shared` said 2 turns where the store held 3, `…/state` was empty, while `pager
    sessions` on B's home said 3. The README: "Readers on any host see what was flushed"."""
    from test_serve import Running

    from pager.embed import HashEmbedder
    from pager.home import Home

    running = Running(one_store("b").home, config=one_store("b"))
    try:
        with running.http() as http:
            assert http.get("/sessions").json()["data"] == []   # B has looked at the store before A writes
            with Home(one_store("a"), embedder=HashEmbedder()) as a:
                a.open("shared").append("user", "My locker code is 3141.")
                a.open("shared").append("assistant", "Noted.")
            assert http.get("/sessions").json()["data"] == [{"session": "shared", "turns": 2, "pages": 1}]
            assert http.get("/sessions/shared").json()["turns"] == 2
            with Home(one_store("a"), embedder=HashEmbedder()) as a:
                a.open("shared").append("user", "The gym is on Tuesdays.")
                a.open("shared").set_state("gym", "Tuesdays at 7")
            assert http.get("/sessions/shared").json()["turns"] == 3
            assert http.get("/sessions").json()["data"][0]["turns"] == 3
            assert http.get("/sessions/shared/turns").json()["total_turns"] == 3
            assert http.get("/sessions/shared/state").json()["state"]["gym"]["value"] == "Tuesdays at 7"
            found = http.get("/sessions/shared/search", params={"q": "gym Tuesdays"}).json()["results"]
            assert found and "Tuesdays" in json.dumps(found)
    finally:
        running.stop()


def test_a_restarted_server_recovers_turns_that_waited_for_another_hosts_lease_once_it_is_free(tmp_path):
    """`kill -9` of host A's `pager serve` after it acknowledged turns; host B wrote the session once A's
    lease lapsed; A's serve restarted while B held the lease, so A's journal waited ("recovered when this
    home next writes it"). B went idle and let the lease go, but no client wrote that session through A
    again: minutes later A still answered 404 for it and no host saw A's acknowledged turns. A serving
    home now recovers them as soon as the lease is free (its periodic idle round), stores them after B's,
    and gives the lease straight back."""
    from test_leases import CHILD, _killed_while_holding, texts

    from pager.embed import HashEmbedder
    from pager.engine import Engine
    from pager.home import Home

    store = str(tmp_path / "store")

    def config(name: str, **kw) -> Config:
        return Config.load(env={"PAGER_EMBEDDER": "hash"}, home=tmp_path / name, db=store, budget=2048, **kw)

    _killed_while_holding(CHILD, tmp_path / "a", "2", 5, {"PAGER_EMBEDDER": "hash", "PAGER_DB": store})
    [dead_segment] = (tmp_path / "a").rglob("*.wal")
    b = Home(config("b", lease_wait_s=120), embedder=HashEmbedder())
    b.open("s").append("bob", "host b, after the lease lapsed")   # waits for the lapse (2 s), the event
    a = Engine(config("a"), home=Home(config("a"), embedder=HashEmbedder()))   # A's serve restarts: waits
    assert a.home.waiting(("", "s"))
    b.close()                                  # B lets the lease go (idle, or closed)
    a.trim()                                   # A's periodic round
    dead = [f"acknowledged {i} on host a" for i in range(5)]
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "s") == ["host b, after the lease lapsed", *dead]
    assert not a.home.waiting(("", "s")) and not dead_segment.exists()
    with Home(config("b"), embedder=HashEmbedder()) as again:   # the lease was given back: B writes at once
        assert again.open("s").append("bob", "host b again").turn == 7
    a.close()


def test_a_chat_reply_counts_only_the_turns_it_appended_not_those_another_host_wrote(one_store):
    """A chat on host B's `pager serve` reported `"appended": 4` for a call that stored its question and
    reply (2): B counted the turns it took in from host A (whose lease it took over) as its own."""
    from test_serve import Running

    from pager.embed import HashEmbedder
    from pager.home import Home

    def ask(http, text: str) -> dict:
        r = http.post("/v1/chat/completions", json={"model": "offline", "user": "shared",
                                                     "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
        return r.json()["pager"]

    b = replace(one_store("b"), lease_idle_s=1.0)
    running = Running(b.home, config=b)
    try:
        with running.http() as http:
            assert ask(http, "My locker code is 3141.")["appended"] == 2
            with Home(replace(one_store("a"), lease_wait_s=300.0), embedder=HashEmbedder()) as a:   # waits for B to let go
                a.open("shared").append("user", "The gym is on Tuesdays.")
                a.open("shared").append("assistant", "Noted.")
            said = ask(http, "When is the gym?")
            assert said["turns"] == 6 and said["appended"] == 2, said
    finally:
        running.stop()


def test_python_dash_m_pager_runs_the_command_line(tmp_path):
    """`python -m pager --help` said "'pager' is a package and cannot be directly executed"; the way to
    run pager from a virtual environment's Python without its `pager` script on PATH."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pager", "--help"], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PAGER_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout and "demo" in done.stdout


def test_check_of_a_one_page_session_says_one_page(tmp_path):
    """`pager check` said "1 turns, 1 pages (the last the open tail, 1 turn(s))"."""
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"speaker": "Maya", "text": "hello there"}) + "\n")
    home = ["--home", str(tmp_path / "h")]
    assert runner.invoke(app, [*home, "ingest", str(data), "-s", "x"]).exit_code == 0
    result = runner.invoke(app, [*home, "check", "-s", "x"])
    assert result.exit_code == 0, result.output
    assert "session 'x': 1 turn, 1 page (the last the open tail, 1 turn): ok" in result.output


def test_a_server_finds_a_bookmark_another_host_made(one_store):
    """Host A bookmarked a page of a session host B's `pager serve` had open; B's search never found the
    bookmark's keyword (a reader took in the other host's turns and state, not its bookmarks)."""
    from test_serve import Running

    from pager.embed import HashEmbedder
    from pager.home import Home

    running = Running(one_store("b").home, config=one_store("b"))
    try:
        with running.http() as http:
            with Home(one_store("a"), embedder=HashEmbedder()) as a:
                s = a.open("shared")
                for i in range(40):   # a few sealed pages
                    s.append("user", f"Note {i}: the locker code changes every week, this week it is {3000 + i}.")
                turns = s.turn_count
            assert http.get("/sessions/shared").json()["turns"] == turns    # B has the session open now
            with Home(one_store("a"), embedder=HashEmbedder()) as a:
                a.open("shared").bookmark([2], ["bluebird"], note="the gym locker")
            found = http.get("/sessions/shared/search", params={"q": "bluebird"}).json()["results"]
            marked = [r for r in found if "bluebird" in r.get("bookmarks", [])]
            assert [r["page"] for r in marked] == ["p2"] and "bookmark" in marked[0]["signals"], found
    finally:
        running.stop()
