"""Settings refused where they are read, naming the setting and the fix: a NaN, a value of the wrong
type, object-store settings LanceDB cannot read, a store URI without a bucket; a store that cannot be
opened names its own cloud's settings (the region's too), and a store of another vector size names the
embedder settings, of the CLI and of Python, that match it."""

import pytest
from typer.testing import CliRunner

import pager
from pager.cli.app import app
from pager.config import Config
from pager.errors import ConfigError, StoreError

from conftest import ENV

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


runner = CliRunner()


def test_a_store_of_another_vector_size_names_the_embedders_of_its_size(tmp_path):
    """`pager demo --keep D` (the demo keeps its own embedder) then `PAGER_EMBEDDER=hash pager --home D chat
    -s demo`: "set PAGER_EMBEDDER to the embedder it was made with", which the user never chose."""
    home = tmp_path / "h"
    (tmp_path / "a.jsonl").write_text('{"speaker": "Ann", "text": "hello"}\n')
    assert runner.invoke(app, ["--home", str(home), "ingest", str(tmp_path / "a.jsonl"), "-s", "a"],
                         env=ENV).exit_code == 0   # the hashing embedder: 256-dim
    result = runner.invoke(app, ["--home", str(home), "search", "hello", "-s", "a"], env={"PAGER_EMBEDDER": "wordllama"})
    assert result.exit_code != 0 and "PAGER_EMBEDDER=hash" in result.output and "wordllama:256" in result.output, result.output


@pytest.mark.parametrize("setting", ["PAGER_LEASE_S", "PAGER_LEASE_WAIT_S", "PAGER_LEASE_IDLE_S", "PAGER_RECENCY_WEIGHT"])
def test_a_setting_of_nan_is_refused_like_any_other_non_number(tmp_path, setting):
    """`PAGER_LEASE_S=nan` passed the check that a lease is above 0 (every comparison with NaN is
    false) and `PAGER_RECENCY_WEIGHT=nan` the check that it is not negative: a lease that never lapses
    or is never held, NaN scores. Refused now, naming the setting."""
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "hello there"}\n')
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(tmp_path / "one.jsonl")],
                                env={"PAGER_EMBEDDER": "hash", setting: "nan"})
    assert result.exit_code == 2 and setting in result.output, result.output


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


@pytest.mark.parametrize("given", [{"session": 123}, {"user": ["bob"]}, {"home": 5}])
def test_settings_of_the_wrong_type_name_the_setting(tmp_path, given):
    """`pager.Toolkit(session=123)` was an AttributeError from deep in the engine, `home=5` a TypeError.
    Config refuses them, naming the setting."""
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
