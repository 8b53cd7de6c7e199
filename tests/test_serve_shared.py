"""`pager serve` sharing its sessions: with another process of its home (the turns and state in that
process's journal are read as they are made) and with other hosts of its store (what they flushed and
bookmarked is read; a session another host holds is a 409, streamed or not; turns that waited for
another host's lease are recovered once it is free; a reply counts only the turns it appended; a state
key another process set can be unset)."""

import json
from dataclasses import replace

import pytest

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.replay import replay

from conftest import hash_config


def test_a_session_another_host_is_writing_is_a_conflict_over_http(tmp_path):
    """Two `pager serve` on one store: the second's answer for a session the first holds was 400
    invalid_request_error with code 'LeaseHeld' (a class name), though nothing in the request was
    wrong and the same request succeeds once the lease lapses. It is 409, OpenAI's conflict, which
    OpenAI's clients retry, with a code in OpenAI's style; the session is written once it is free."""
    from test_serve import Running

    store = str(tmp_path / "store")
    holder = Home(Config(home=tmp_path / "a", db=store, embedder="hash", budget=2048), embedder=HashEmbedder())
    holder.open("shared").append("ann", "written on host a")
    b = Running(tmp_path / "b", config=Config(home=tmp_path / "b", db=store, embedder="hash"))
    try:
        ask = {"model": "offline", "messages": [{"role": "user", "content": "written on host b"}]}
        with b.http() as http:
            for path, body in (("/v1/chat/completions", ask), ("/sessions/shared/turns", {"messages": ask["messages"]})):
                refused = http.post(path, json=body, headers={"X-Pager-Session": "shared"})
                assert refused.status_code == 409, refused.text
                error = refused.json()["error"]
                assert error["type"] == "conflict_error" and error["code"] == "lease_held"
                assert holder.leases.holder in error["message"]
            holder.close()   # flushes and gives the lease up
            assert http.post("/v1/chat/completions", json=ask, headers={"X-Pager-Session": "shared"}).status_code == 200
            assert http.get("/sessions/shared").json()["turns"] == 3
    finally:
        b.stop()


def test_a_streamed_request_for_a_session_another_host_holds_is_409_before_the_stream(tmp_path):
    """Streamed, a session another host was writing got HTTP 200, the role chunk, then an error event;
    unstreamed it was 409. Streamed it is the same 409 (`conflict_error`, `lease_held`), before any
    event; once the lease is free the same streamed request is answered."""
    from test_serve import Running

    store = str(tmp_path / "store")
    holder = Home(hash_config(tmp_path / "a", db=store), embedder=HashEmbedder())
    holder.open("shared").append("ann", "written on host a")
    b = Running(tmp_path / "b", config=Config(home=tmp_path / "b", db=store, embedder="hash"))
    ask = {"model": "offline", "stream": True, "messages": [{"role": "user", "content": "written on host b"}]}
    try:
        with b.http() as http:
            with http.stream("POST", "/v1/chat/completions", json=ask, headers={"X-Pager-Session": "shared"}) as r:
                body = r.read()
                assert r.status_code == 409, body
                assert r.headers["content-type"].startswith("application/json")
            error = json.loads(body)["error"]
            assert error["type"] == "conflict_error" and error["code"] == "lease_held"
            holder.close()
            with http.stream("POST", "/v1/chat/completions", json=ask, headers={"X-Pager-Session": "shared"}) as r:
                lines = [line for line in r.iter_lines() if line]
                assert r.status_code == 200
            assert '"role": "assistant"' in lines[0] and lines[-1] == "data: [DONE]"
            assert http.get("/sessions/shared").json()["turns"] == 3
    finally:
        b.stop()


def test_serve_readers_show_the_turns_another_live_process_of_the_home_holds(tmp_path):
    """A `pager chat` (or second server) on the same home as `pager serve`, same session: its turns are in
    its journal until a batch is flushed. `GET /sessions/s/turns` read only the store and listed 2 of 4
    turns while its `total_turns` said 4; once the server had the session open, `GET /sessions/s` and
    the state tier kept the counts and values of when it opened it. Readers now take in what the other
    process made durable first, as `pager inspect` does, and list the turns its journal holds."""
    from test_serve import Running

    running = Running(tmp_path, config=Config(home=tmp_path, embedder="hash"))
    other = Home(Config(home=tmp_path, embedder="hash"), embedder=HashEmbedder())
    try:
        with running.http() as http:
            assert http.post("/sessions/s/turns", json={"messages": [{"content": "from serve"}]}).status_code == 201
            assert http.get("/sessions/s").json()["turns"] == 1   # the server holds the session open now
            s = other.open("s")
            s.append("ann", "from the other process")
            s.append("ann", "and its second turn")
            s.set_state("city", "Lisbon")
            assert http.get("/sessions/s").json()["turns"] == 3
            listed = http.get("/sessions/s/turns").json()
            assert listed["total_turns"] == 3, listed
            assert [t["content"] for t in listed["turns"]] == ["from serve", "from the other process", "and its second turn"]
            assert [t["content"] for t in http.get("/sessions/s/turns?after=2").json()["turns"]] == ["and its second turn"]
            assert http.get("/sessions/s/state").json()["state"]["city"]["value"] == "Lisbon"
    finally:
        running.stop()
        other.close()


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
    sessions` on B's home said 3. docs/storage.md: "Readers on any host see what was flushed"."""
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


@pytest.mark.parametrize("other", ["process", "home"])
def test_a_state_key_another_process_or_host_set_is_unset_over_rest(tmp_path, other):
    """`DELETE /sessions/{name}/state/{key}` checked the key against the session as the server last read it:
    a key a `pager chat` beside the server (another process of its home), or another host sharing the store,
    had set since was "the state has no key" (404), and stayed set, while `GET …/state` listed it."""
    from starlette.testclient import TestClient

    from pager.engine import Engine
    from pager.keys import KeyRing
    from pager.serve import Limits, Server

    config = Config(home=tmp_path / "home", embedder="hash", db=str(tmp_path / "store"))
    server = Server(Engine(config), KeyRing(config.home), Limits())
    with TestClient(server.app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000)) as client:
        assert client.post("/sessions/s/turns", json={"messages": [{"role": "user", "content": "hello"}]}).status_code == 201
        assert client.get("/sessions/s/state").json()["state"] == {}
        if other == "home":   # another host: its own home, the same store; the server's idle round let the lease go
            server.engine.home.flush()
            server.engine.home.leases.release()
        setter = Home(replace(config, home=tmp_path / ("home" if other == "process" else "other")),
                      embedder=HashEmbedder())
        setter.open("s").set_state("gym", "Tuesdays at 7")
        setter.close()
        answer = client.delete("/sessions/s/state/gym")
        assert answer.status_code == 200, answer.text
        assert client.get("/sessions/s/state").json()["state"] == {}
    with Home(config, embedder=HashEmbedder(), read_only=True) as reader:
        assert [(c.key, c.unset) for c in reader.open("s").state.changes] == [("gym", False), ("gym", True)]
    for path in (tmp_path / "home" / "traces").glob("*serve*.jsonl"):
        run = replay(path, check=True)
        assert run.divergence is None, (path.name, run.divergence)
