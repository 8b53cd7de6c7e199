"""Packages imported without the parts pager never uses (pager/deferred.py): LanceDB without its REST
namespace client and, on Python 3.11, without the `overrides` package's import-time checks, as LanceDB
imports itself on 3.12 (pager/lance.py); snowballstemmer without 29 of its 30 languages; each package
is still there, whole, for whatever reads it."""

import subprocess
import sys

import pytest

PROBE = """
import sys
from pager import lance
lancedb = lance.lancedb()
db = lancedb.connect(sys.argv[1])
db.create_table("t", data=[{"n": 1, "text": "the Lisbon budget"}])
rows = db.open_table("t").search().where(lancedb.expr.col("n") == lancedb.expr.lit(1)).to_list()
assert [r["text"] for r in rows] == ["the Lisbon budget"], rows
api = sorted(m for m in sys.modules if m.startswith("lance_namespace_urllib3_client.api"))
assert lance.lancedb() is lancedb
import lance_namespace_urllib3_client as client
assert client.ApiClient.__name__ == "ApiClient" and client.TableApi.__name__ == "TableApi"
loaded = "lance_namespace_urllib3_client.api.table_api" in sys.modules
print(api, loaded)
"""


def test_lancedb_works_without_its_rest_client_until_something_reads_it(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "db")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "True"], out.stdout


def test_lancedb_imported_first_by_someone_else_is_used_as_it_is(tmp_path):
    code = ("import sys, lancedb\nfrom pager import lance\n"
            "assert lance.lancedb() is lancedb\n"
            "print('lance_namespace_urllib3_client.api.table_api' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


OVERRIDES = """
import sys
if sys.argv[1] == "first":
    import overrides
before = sys.modules.get("overrides")
from pager import lance
lancedb = lance.lancedb()
assert sys.modules.get("overrides") is before   # what it was: the real package, or not imported
import overrides
assert overrides.override.__module__ == "overrides.overrides"
checked = lancedb.db.override is overrides.override
marked = getattr(lancedb.db.LanceDBConnection.table_names, "__override__", False)
print(checked, marked)
"""


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="LanceDB takes typing.override itself there")
@pytest.mark.parametrize("first", ["first", "not"])
def test_lancedb_is_imported_as_on_python_3_12_and_overrides_stays_what_it_was(first):
    out = subprocess.run([sys.executable, "-c", OVERRIDES, first], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # on 3.11 LanceDB's methods are marked, not checked, as typing.override does on 3.12
    assert out.stdout.split() == ["False", "True"], out.stdout


STEMMER = """
import sys
from pager.search import stem
assert [stem(w) for w in ("running", "offsites", "budgets")] == ["run", "offsit", "budget"]
alone = sorted(m for m in sys.modules if m.startswith("snowballstemmer"))
import snowballstemmer
assert snowballstemmer.stemmer("french").stemWord("continuellement") == "continuel"
assert snowballstemmer.stemmer("english").stemWord("running") == "run"
print(len(alone), "snowballstemmer.french_stemmer" in alone)
"""


def test_the_stemmer_imports_english_alone_and_the_package_stays_whole_for_others():
    out = subprocess.run([sys.executable, "-c", STEMMER], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "False"], out.stdout
