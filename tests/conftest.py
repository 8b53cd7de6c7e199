import json
import os
import sys
from pathlib import Path

import pytest

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.store import MemoryStore

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
LOCOMO = SHARED / "locomo" / "locomo_dev.json"


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", help="run the long reliability runs")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long mode only (pytest --long)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def config(tmp_path):
    return Config(home=tmp_path / "home", budget=2048, page_tokens=128, embedder="hash")


@pytest.fixture
def mem_home(config):
    """A home with an in-memory store and the hashing embedder: fast, no LanceDB."""
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    yield home
    home.journal.close(remove=True)


@pytest.fixture
def lance_home(config):
    home = Home(config, embedder=HashEmbedder())
    yield home
    if not home.closed:
        home.close()


@pytest.fixture
def tmpfs(tmp_path):
    """A 3 MB tmpfs, for disks that really fill up (needs root to mount; skipped otherwise)."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


DEMO = ROOT / "pager" / "data" / "demo_conversation.jsonl"
ENV = {"PAGER_EMBEDDER": "hash"}
PEANUTS = "Sam Okafor is allergic to peanuts"   # the demo conversation's fact on p5


@pytest.fixture(scope="module")
def maya(tmp_path_factory):
    """A home with the demo conversation ingested as session 'maya' (the chat of docs/chat.md)."""
    home = tmp_path_factory.mktemp("maya")
    result = _cli().invoke(_app(), ["--home", str(home), "ingest", str(DEMO), "--session", "maya"], env=ENV)
    assert result.exit_code == 0, result.output
    return home


def chat(home, lines, *args, session="maya"):
    result = _cli().invoke(_app(), ["--home", str(home), "chat", "--session", session, *args],
                           input="".join(line + "\n" for line in lines), env=ENV)
    assert result.exit_code == 0, result.output
    return result.output


def answers(output: str) -> list[str]:
    return [" ".join(part.split("you>")[0].split()) for part in output.split("pager>")[1:]]


def hash_config(home, **kw) -> Config:
    """A home's settings with the hashing embedder and a 2,048-token budget."""
    return Config(home=home, embedder="hash", budget=2048, **kw)


def ingest_lines(home, session: str, lines: list[dict]) -> None:
    """`pager ingest - -s SESSION` of these messages, as JSON lines on standard input."""
    text = "".join(json.dumps(line) + "\n" for line in lines)
    result = _cli().invoke(_app(), ["--home", str(home), "ingest", "-", "-s", session], input=text, env=ENV)
    assert result.exit_code == 0, result.output


def ingest_file(tmp_path, name: str, content: str, *args: str):
    """Write content to tmp_path/name and `pager ingest` it into the home tmp_path/home; the CLI's result."""
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return _cli().invoke(_app(), ["--home", str(tmp_path / "home"), "ingest", str(path), *args], env=ENV)


def listed_sessions(home) -> dict:
    """`pager sessions --json` as {session: (turns, pages)}."""
    result = _cli().invoke(_app(), ["--home", str(home), "sessions", "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    return {r["session"]: (r["turns"], r["pages"]) for r in json.loads(result.output)["sessions"]}


def numbered_conversation(path: Path, n: int) -> Path:
    """A JSONL conversation of n dated, numbered notes, written to path."""
    path.write_text("".join(json.dumps({"speaker": "ann" if i % 2 else "bob", "text": f"note {i}: the crate holds "
                                        f"{i * 7} bolts and {i} washers for bay {i % 5}", "date": "8 May 2023"}) + "\n"
                            for i in range(n)))
    return path


def _cli():
    from typer.testing import CliRunner

    return CliRunner()


def _app():
    from pager.cli.app import app

    return app


def say(session, n, start=0, words=12):
    """Append n turns with distinct, checkable text."""
    msgs = [{"speaker": "ann" if i % 2 else "bob", "text": f"turn {i} says " + " ".join(f"w{i}x{j}" for j in range(words))}
            for i in range(start, start + n)]
    return session.append_many(msgs)


def run_py(code: str, env=None, **kw):
    import subprocess

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, **kw)


@pytest.fixture(scope="session")
def s3_server():
    """A local S3-compatible server (moto's standalone server) on 127.0.0.1 and a free port, for the
    session: yields its endpoint; every test makes its own bucket. Skips when moto is not installed."""
    pytest.importorskip("moto.server", reason="moto[server] (the test extra) runs the local S3 server")
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import tempfile

    log = tempfile.TemporaryFile()  # its request log: a pipe nobody reads would fill and stall the server
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        while True:  # wait for the server to answer (the event), not for a duration
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"the local S3 server exited: {log.read().decode()[-500:]}")
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=5).read()
                break
            except OSError:
                time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


_buckets = iter(range(10**6))


@pytest.fixture
def s3(s3_server):
    """A fresh bucket on the local S3 server: (environment for pager, store URI)."""
    return _bucket(s3_server)


def _bucket(s3_server):
    import boto3

    bucket = f"pager-test-{os.getpid()}-{next(_buckets)}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=bucket)
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "PAGER_S3_ENDPOINT": s3_server,
           "PAGER_S3_REGION": "us-east-1", "PAGER_S3_ALLOW_HTTP": "true"}
    return env, f"s3://{bucket}/pager"


@pytest.fixture
def s3ddb(s3_server):
    """A fresh bucket and DynamoDB table on the local server (moto serves both): a store whose commits
    go through LanceDB's DynamoDB commit store, `s3+ddb://bucket/prefix?ddbTableName=T`. The table is
    made as LanceDB's docs say: hash key base_uri (string), range key version (number)."""
    import boto3

    env, uri = _bucket(s3_server)
    table = uri.split("/")[2] + "-commits"
    boto3.client("dynamodb", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_table(
        TableName=table, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "base_uri", "AttributeType": "S"},
                              {"AttributeName": "version", "AttributeType": "N"}],
        KeySchema=[{"AttributeName": "base_uri", "KeyType": "HASH"}, {"AttributeName": "version", "KeyType": "RANGE"}])
    return {**env, "PAGER_DYNAMODB_ENDPOINT": s3_server}, f"s3+ddb{uri[2:]}?ddbTableName={table}"

