"""The tool bundle: schemas, the toolkit, the MCP server in process and over stdio (its version, Ctrl-C
while it waits, a file or /dev/null on stdin), two processes on one home."""

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from jsonschema import Draft202012Validator

from conftest import ROOT, ENV
from pager.config import Config
from pager.replay import replay
from pager.tools import AGENT, MODEL, Toolkit

SNAPSHOT = ROOT / "tests" / "snapshots" / "tools.openai.json"


def test_schemas_are_valid_json_schema_and_stable():
    schemas = AGENT.schemas()
    for schema in schemas:
        Draft202012Validator.check_schema(schema["function"]["parameters"])
        assert schema["function"]["description"]
    assert schemas == json.loads(SNAPSHOT.read_text()), "tool schemas changed: review, then regenerate the snapshot with `pager tools`"
    assert {s["function"]["name"] for s in MODEL.schemas()} == {"page_in", "page_out", "bookmark", "search", "pin", "unpin",
                                                                "state_set", "state_unset"}


def test_schema_arguments_validate_what_the_dispatcher_accepts(mem_home):
    s = mem_home.open("a")
    schema = {x["function"]["name"]: x["function"]["parameters"] for x in AGENT.schemas()}
    good = {"query": "anything", "k": 3}
    Draft202012Validator(schema["search"]).validate(good)
    assert AGENT.run(s, "search", good)[1]


@pytest.fixture
def toolkit(tmp_path):
    kit = Toolkit(config=Config(home=tmp_path / "h", session="agent", embedder="hash", budget=2048))
    yield kit
    kit.close()


def test_toolkit_round_trip_and_errors_as_text(toolkit):
    for i in range(150):
        toolkit.call("remember", {"text": f"routine note {i} about the weather and lunch"})
    toolkit.call("remember", json.dumps({"text": "The vault code for the Oslo office is 7731.", "speaker": "maya"}))
    for i in range(150):
        toolkit.call("remember", {"text": f"more routine {i}", "role": "assistant"})
    found = toolkit.call("search", '{"query": "Oslo vault code"}')
    page = found.split("\n")[1].split()[1]
    assert "7731" in found.split("\n")[1]
    entry = toolkit.session.table[int(page[1:])]
    assert toolkit.call("page_out", {"page_id": page}).startswith(f"{page} paged out") and not entry.resident
    assert toolkit.call("page_in", {"page": page}).startswith(f"{page} paged in") and entry.resident
    assert toolkit.call("page_in", {"page": page}).startswith(f"{page} was already resident")
    block = toolkit.call("context", {"query": "Oslo vault code", "budget": 1024})
    assert "7731" in block and toolkit.session.tokenizer.count(block) <= 1024
    assert "bookmarked" in toolkit.call("bookmark", {"page_ids": [page], "keywords": ["vault"], "note": "codes"})
    for name, args, expect in [
        ("search", {}, "missing required argument 'query'"),
        ("search", {"query": "x", "k": [1]}, "whole number"),
        ("page_in", {"page": "p99999"}, "does not exist"),
        ("page_out", '{"page_id": "p1"', "not valid JSON"),
        ("remember", {"text": "x" * 200_001}, "too long"),
        ("remember", {"text": "   "}, "empty message"),
        ("remember", {"text": "hi", "role": "system"}, "role must be"),
        ("drop_table", {}, "unknown tool"),
    ]:
        text, ok = toolkit.run(name, args)
        assert not ok and expect in text, (name, text)
    assert toolkit.call("search", {"query": "Oslo"}).startswith(("1 page", "2 page", "3 page", "4 page", "5 page"))


def test_toolkit_session_replays_exactly(toolkit):
    for i in range(40):
        toolkit.call("remember", {"text": f"note {i}: the Zeta{i % 4} build needs flag {i * 3}"})
    toolkit.call("search", {"query": "Zeta2 flag"})
    toolkit.call("page_in", {"page": "p2"})
    toolkit.call("pin", {"page_id": "p3"})
    toolkit.call("context", {"query": "Zeta1", "budget": 900})
    path = toolkit._writer.path
    toolkit.close()
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence.describe()


def _mcp_calls():
    return [
        ("remember", {"text": "The spare key is under the blue flowerpot."}),
        *[("remember", {"text": f"small talk {i} about the weather"}) for i in range(40)],
        ("search", {"query": "spare key"}),
        ("page_in", {"page": "p1"}),
        ("page_out", {"page_id": "p1"}),
        ("bookmark", {"page_ids": ["p1"], "keywords": ["key"]}),
        ("pin", {"page_id": "p1"}),
        ("unpin", {"page_id": "p1"}),
        ("context", {"query": "spare key", "budget": 800}),
    ]


def test_in_process_mcp_client_lists_and_calls_every_tool(toolkit):
    from mcp import Client

    from pager.tools.mcp_server import MEMORY_MAP, build

    async def main():
        async with Client(build(toolkit)) as client:
            listed = await client.list_tools()
            assert {t.name for t in listed.tools} == set(AGENT.names)
            by_name = {t.name: t for t in listed.tools}
            assert by_name["search"].input_schema == AGENT.schemas()[0]["function"]["parameters"]
            results = {}
            for name, args in _mcp_calls():
                result = await client.call_tool(name, args)
                results[name] = (result.is_error, result.content[0].text)
            bad = await client.call_tool("search", {"query": "x", "k": "many"})
            after = await client.call_tool("search", {"query": "flowerpot"})
            resource = await client.read_resource(MEMORY_MAP)
            return results, bad, after, resource

    results, bad, after, resource = asyncio.run(main())
    assert all(not error for error, _ in results.values()), results
    assert "blue flowerpot" in results["search"][1] and "blue flowerpot" in results["context"][1]
    assert bad.is_error and "whole number" in bad.content[0].text
    assert not after.is_error and "flowerpot" in after.content[0].text
    assert "Memory map" in resource.contents[0].text


def test_stdio_round_trip_with_the_mcp_sdk(tmp_path):
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "PAGER_HOME": str(tmp_path / "h"), "PAGER_EMBEDDER": "hash"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "pager.cli", "mcp", "--session", "desk"], env=env)

    async def main():
        async with Client(params) as client:
            for i in range(200):
                await client.call_tool("remember", {"text": f"filler {i} about coffee and standups"})
            await client.call_tool("remember", {"text": "The Halvorsen contract needs Okta SSO."})
            for i in range(100):
                await client.call_tool("remember", {"text": f"more filler {i}"})
            found = await client.call_tool("search", {"query": "Halvorsen SSO"})
            page = found.content[0].text.split("\n")[1].split()[1]
            paged = await client.call_tool("page_in", {"page": page})
            block = await client.call_tool("context", {"query": "Halvorsen", "budget": 1200})
            wrong = await client.call_tool("page_in", {"page": 99999})  # a number is read as an id; this one is unknown
            huge = await client.call_tool("remember", {"text": "y" * 300_000})
            still = await client.call_tool("search", {"query": "Okta"})
            started = time.perf_counter()
            for _ in range(20):
                await client.call_tool("search", {"query": "Okta"})
            latency = (time.perf_counter() - started) / 20
            return found, paged, block, wrong, huge, still, latency

    found, paged, block, wrong, huge, still, latency = asyncio.run(main())
    assert "Okta" in found.content[0].text and not paged.is_error
    assert "Okta SSO" in block.content[0].text
    assert wrong.is_error and "does not exist" in wrong.content[0].text
    assert huge.is_error and "too long" in huge.content[0].text
    assert not still.is_error and "Okta" in still.content[0].text
    assert latency < 0.5
    traces = list((tmp_path / "h" / "traces").glob("desk-toolkit-*.jsonl"))
    assert traces and replay(traces[0], check=True).divergence is None


WRITER = """
import sys, time
from pager.config import Config
from pager.tools import Toolkit
kit = Toolkit(config=Config(home=sys.argv[1], session="shared", embedder="hash"))
for i in range(int(sys.argv[2])):
    kit.call("remember", {"text": f"from the other process: item {i} codeword heliotrope{i}"})
print("written", flush=True)
sys.stdin.readline()  # stay alive (journal unflushed) until told
print(kit.call("search", {"query": "written here first"}), flush=True)
kit.close()
"""


def test_two_processes_on_one_home_see_each_others_pages(tmp_path):
    home = str(tmp_path / "h")
    other = subprocess.Popen([sys.executable, "-c", WRITER, home, "300"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline().strip() == "written"
    with Toolkit(config=Config(home=home, session="shared", embedder="hash")) as kit:
        seen = kit.call("search", {"query": "heliotrope250"})
        assert "heliotrope250" in seen
        kit.call("remember", {"text": "written here first: the rose garden"})
        assert kit.session.turn_count == 301
        out, _ = other.communicate("go\n", timeout=60)
    assert "rose garden" in out
    with Toolkit(config=Config(home=home, session="shared", embedder="hash"), trace=False) as kit:
        texts = [t.text for t in kit.home.store.turns("", "shared")]
        assert len(texts) == len(set(texts)) == 301


def test_mcp_stdout_carries_nothing_but_protocol(tmp_path):
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "remember", "arguments": {"text": "hi"}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "search", "arguments": {"query": "hi", "k": "x"}}},
    ]
    env = {**os.environ, "PAGER_HOME": str(tmp_path / "h")}
    proc = subprocess.Popen([sys.executable, "-m", "pager.cli", "mcp", "-s", "raw"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    replies = []
    for request in requests:
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        if "id" in request:
            replies.append(json.loads(proc.stdout.readline()))  # every stdout line is a JSON-RPC message
    proc.stdin.close()
    rest = proc.stdout.read()
    proc.wait(timeout=30)
    assert rest.strip() == ""
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert replies[1]["result"]["isError"] is False and replies[2]["result"]["isError"] is True


def test_the_readme_agent_loop_runs(tmp_path, monkeypatch):
    """The README's litellm loop, driven by the offline shell instead of a provider."""
    import re

    from pager.llm import litellm, register
    from pager.offline import OfflineShell

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Tool bundle and MCP\n.*?```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.setenv("PAGER_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("PAGER_EMBEDDER", "hash")
    litellm()
    register("offline", OfflineShell())
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    ask, memory = namespace["ask"], namespace["memory"]
    assert "Noted" in ask("Our wifi password at the cabin is moose-lake-42.", model="pager/offline")
    for i in range(60):
        memory.call("remember", {"text": f"small talk {i} about the weather"})
    answer = ask("What is the wifi password at the cabin?", model="pager/offline")
    assert "moose-lake-42" in answer
    memory.close()


def test_no_tool_makes_a_session_whose_name_serve_could_not_reach(tmp_path):
    """`pager mcp --session a/b`: remember was refused, but state_set and pin made the session 'a/b'
    (a journal op, not a turn). Every first write of a new session checks its name, and the toolkit
    refuses the name when it opens, before any tool is called."""
    from pager.errors import InputError
    from pager.home import Home

    config = Config(home=tmp_path / "h", session="a/b", embedder="hash", budget=2048)
    with pytest.raises(InputError, match='must not contain "/"'):
        Toolkit(config=config)
    with Home(config) as home:   # the write path checks it too, for every caller
        session = home.open()
        with pytest.raises(InputError, match='must not contain "/"'):
            session.set_state("order", "A-1")
        with pytest.raises(InputError, match='must not contain "/"'):
            session.append("ann", "hello")
        assert home.store.sessions() == [] and session.turn_count == 0


def test_mcp_reads_a_null_argument_as_sent_not_as_a_missing_one(toolkit):
    """A null used to reach the tool as an absent argument: a required one was "missing", an optional one
    silently took its default. Both now get the dispatcher's answer, as the Python API and function calls do."""
    from mcp import Client

    from pager.tools.mcp_server import build

    async def main():
        async with Client(build(toolkit)) as client:
            required = await client.call_tool("remember", {"text": None})
            optional = await client.call_tool("search", {"query": "x", "k": None})
            nullable_fine = await client.call_tool("remember", {"text": "kept", "speaker": "maya"})
            return required, optional, nullable_fine

    required, optional, fine = asyncio.run(main())
    direct = toolkit.run("remember", {"text": None})
    assert required.is_error and required.content[0].text == direct[0]
    assert "missing" not in required.content[0].text and "text" in required.content[0].text
    assert optional.is_error and optional.content[0].text == toolkit.run("search", {"query": "x", "k": None})[0]
    assert not fine.is_error and toolkit.session.turn_count == 1   # the refused calls stored nothing


def test_the_mcp_server_says_its_version():
    """`pager mcp` (and /mcp of `pager serve`) answered `initialize` with `"serverInfo": {"name": "pager",
    "version": ""}`: an MCP client shows and logs the server it talks to by that version."""
    from pager import __version__
    from pager.tools import Toolkit
    from pager.tools.mcp_server import build

    server = build(Toolkit.__new__(Toolkit))
    assert __version__ and server.version == __version__


INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})


def test_ctrl_c_stops_pager_mcp_while_it_waits_for_a_client(tmp_path):
    """`pager mcp` started in a terminal to see what it does waits for JSON-RPC on stdin; Ctrl-C did nothing
    until a line or Ctrl-D came (stdin was read by a worker thread that the cancel and the exit wait
    for). Now the event loop waits on stdin, and Ctrl-C exits 130 at once. Every wait here has a
    timeout and the child is killed in any case, so the test cannot hang."""
    import queue
    import signal
    import threading

    env = {**os.environ, **ENV, "PAGER_HOME": str(tmp_path)}
    # Ctrl-C as a terminal's foreground process takes it: a test run started in the background (`.ci/run &`)
    # ignores SIGINT, and a child inherits that, so the child gives itself Python's handler first
    terminal = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "sys.argv = ['pager', 'mcp', '-s', 'desk']; runpy.run_module('pager.cli', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", terminal], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        proc.stdin.write(INITIALIZE.encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(lines.get(timeout=120))["id"] == 1   # serving, and waiting for the next line
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)    # stdin stays open: before, this waited for a line that never came
        err = proc.stderr.read().decode()
        assert code == 130 and "interrupted" in err, (code, err)
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_pager_mcp_reads_a_file_or_dev_null_on_stdin(tmp_path):
    """The loop waits on a terminal or a pipe; a file on stdin (`pager mcp < requests.jsonl`), which it
    cannot wait on, is read as before, and /dev/null ends the server at once."""
    requests = tmp_path / "requests.jsonl"
    requests.write_text(INITIALIZE + "\n")
    env = {**os.environ, **ENV, "PAGER_HOME": str(tmp_path)}
    with open(requests) as stdin:
        done = subprocess.run([sys.executable, "-m", "pager.cli", "mcp"], stdin=stdin, capture_output=True,
                              timeout=120, env=env)
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[0])["id"] == 1, done.stderr.decode()
    done = subprocess.run([sys.executable, "-m", "pager.cli", "mcp"], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=120, env=env)
    assert done.returncode == 0 and not done.stdout, done.stderr.decode()
