"""Packages imported without the parts pager never uses (pager/deferred.py): LanceDB without its REST
namespace client (pager/lance.py), snowballstemmer without 29 of its 30 languages; each package is
still there, whole, for whatever reads it."""

import subprocess
import sys

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
