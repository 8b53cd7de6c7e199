"""`--db s3://…` for every command, against a local S3-compatible server the tests start (conftest:
s3_server, moto's standalone server on 127.0.0.1): nothing in the engine may assume the store is a
local path, and nothing of the store is written under the home."""

import json

from typer.testing import CliRunner

from pager.cli.app import app
from conftest import numbered_conversation

runner = CliRunner()


def test_every_command_works_on_an_object_store(tmp_path, s3):
    env, uri = s3
    env = {**env, "PAGER_EMBEDDER": "hash"}
    home = str(tmp_path / "h")
    data = tmp_path / "conv.jsonl"
    lines = [json.dumps({"speaker": "ann", "text": f"chit chat number {i} about the weather"}) for i in range(240)]
    lines.insert(5, json.dumps({"speaker": "maya", "text": "The spare key is under the blue flowerpot."}))
    data.write_text("\n".join(lines) + "\n")

    def run(*args, **kw):
        result = runner.invoke(app, ["--home", home, "--db", uri, *args], env=env, **kw)
        assert result.exit_code == 0, result.output
        return result.output

    assert "241 turns" in run("ingest", str(data), "--session", "house")
    assert not (tmp_path / "h" / "db").exists()  # the store is in the bucket, not under the home
    assert "flowerpot" in run("search", "spare key", "--session", "house")
    state = json.loads(run("inspect", "--session", "house", "--json"))
    assert state["turns"] == 241 and state["pages"] > 10
    exported = [json.loads(line) for line in run("export", "--session", "house").splitlines() if line.strip()]
    assert len(exported) == 241 and exported[5]["text"] == "The spare key is under the blue flowerpot."
    assert "ok" in run("check", "--session", "house")
    out = run("chat", "-s", "house", "--budget", "2048", input="Where is the spare key?\n/quit\n")
    assert "blue flowerpot" in out.split("Where is the spare key?")[-1]
    state = json.loads(run("inspect", "--session", "house", "--json"))
    assert state["turns"] > 241  # the chat's question and answer are in the bucket too


def test_an_unreachable_object_store_is_one_line_naming_the_settings(tmp_path, s3):
    env, _ = s3
    env = {**env, "PAGER_EMBEDDER": "hash", "PAGER_S3_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "--db", "s3://no-such-bucket/x", "inspect", "--json"],
                           env=env)
    assert result.exit_code == 1
    assert "PAGER_S3_ENDPOINT" in result.output and "Traceback" not in result.output
    assert "http://127.0.0.1:9 cannot be reached" in result.output and "RetryError" not in result.output


def test_a_missing_bucket_is_one_line_saying_so(tmp_path, s3):
    env, _ = s3
    env = {**env, "PAGER_EMBEDDER": "hash"}
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "--db", "s3://nobucket/x", "inspect", "--json"],
                           env=env)
    assert result.exit_code == 1
    assert "the bucket 'nobucket' does not exist" in result.output and "PAGER_DB" in result.output, result.output
    assert "RetryError" not in result.output and len(result.output.strip().splitlines()) == 1


def test_an_s3_ddb_store_commits_through_its_dynamodb_table(tmp_path, s3ddb):
    """LanceDB's DynamoDB commit store (s3+ddb://…?ddbTableName=T): every command works, and the commits
    are recorded in the table (base_uri, version), which is what makes concurrent writers safe on a store
    without conditional writes. tests/test_leases.py runs the several-hosts tests on it too."""
    import boto3

    env, uri = s3ddb
    env = {**env, "PAGER_EMBEDDER": "hash"}
    home = str(tmp_path / "h")
    data = tmp_path / "conv.jsonl"
    lines = [json.dumps({"speaker": "ann", "text": f"small talk number {i}"}) for i in range(60)]
    lines.insert(3, json.dumps({"speaker": "maya", "text": "The spare key is under the blue flowerpot."}))
    data.write_text("\n".join(lines) + "\n")

    def run(*args):
        result = runner.invoke(app, ["--home", home, "--db", uri, *args], env=env)
        assert result.exit_code == 0, result.output
        return result.output

    assert "61 turns" in run("ingest", str(data), "--session", "house")
    assert "flowerpot" in run("search", "spare key", "--session", "house")
    assert json.loads(run("inspect", "--session", "house", "--json"))["turns"] == 61
    table = uri.split("ddbTableName=")[1]
    items = boto3.client("dynamodb", endpoint_url=env["PAGER_DYNAMODB_ENDPOINT"], region_name="us-east-1",
                         aws_access_key_id="test", aws_secret_access_key="test").scan(TableName=table)["Items"]
    committed = {item["base_uri"]["S"].rsplit("/", 1)[-1] for item in items}
    assert {"turns.lance", "pages.lance", "meta.lance", "leases.lance"} <= committed, committed


def test_an_s3_ddb_store_without_its_table_is_one_line_naming_the_fix(tmp_path, s3ddb):
    env, uri = s3ddb
    env = {**env, "PAGER_EMBEDDER": "hash"}
    uri = uri.replace("ddbTableName=", "ddbTableName=missing-")
    data = tmp_path / "conv.jsonl"
    data.write_text(json.dumps({"speaker": "ann", "text": "hello"}) + "\n")
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "--db", uri, "ingest", str(data)], env=env)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "DynamoDB" in result.output and "base_uri" in result.output, result.output


def test_migrate_of_an_object_store_made_with_the_default_embedder_says_it_is_up_to_date(tmp_path, s3):
    """docs/storage.md's `pager --db s3://memory/team migrate`, run on a store `pager ingest` had just made,
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


def test_migrate_on_an_object_store_made_at_the_default_vector_size(tmp_path, s3):
    """docs/storage.md's `pager --db s3://memory/team migrate` refused every store made by this release:
    asking whether a store was there at all opened it as 256-dim, and today's default is 128."""
    env, uri = s3
    env = {**env, "PAGER_EMBEDDER": "wordllama"}   # the default the commands of docs/storage.md run with
    home = str(tmp_path / "h")
    made = runner.invoke(app, ["--home", home, "--db", uri, "ingest", str(numbered_conversation(tmp_path / "c.jsonl", 6)),
                               "-s", "planning"], env=env)
    assert made.exit_code == 0, made.output
    migrated = runner.invoke(app, ["--home", home, "--db", uri, "migrate"], env=env)
    assert migrated.exit_code == 0 and "is up to date" in migrated.output, migrated.output
    empty = runner.invoke(app, ["--home", home, "--db", uri + "-none", "migrate"], env=env)
    assert empty.exit_code != 0 and "no pager store" in empty.output, empty.output
