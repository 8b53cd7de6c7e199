"""`pager bench scale --session-pages`: one session of each size, what its open holds and how its costs
grow; the bytes an open session holds per page stay within a bound."""

import numpy as np
import pytest
from typer.testing import CliRunner

from pager.bench import growth
from pager.bench.scale import _bulk_session
from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.search import Index
from pager.store import MemoryStore

runner = CliRunner()


def test_one_session_of_each_size_reports_how_its_costs_grow(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGER_EMBEDDER", "hash")
    # the open measured here rather than in a new process, the cold search not run: the report's shape is the point
    monkeypatch.setattr(growth, "probe_process", growth.probe)
    monkeypatch.setattr(growth, "cold_search", lambda folder: 0.0)
    monkeypatch.setattr(Index, "SCREEN_FROM", 2000)   # the larger session's search screened, as at 100K pages
    report = growth.run([1000, 1500], tmp_path, queries=3, progress=False, cold_runs=1)
    assert report["session_pages"] == [1000, 1500]
    screened = report["screened_against_exact"]
    assert set(screened) == {"search_tool", "automatic_paging"} and screened["search_tool"]["k"] == 5
    for figures in screened.values():
        assert set(figures) == {"k", "top_page_same", "top_pages_found", "same_list", "top_pieces_found"}
        assert all(0 <= v <= 1 for name, v in figures.items() if name != "k")
    assert set(report["growth"]) == {"pages", "paging_p95", "paging_cpu_p95", "search_p95", "open", "open_cpu",
                                     "cold_search", "rss"}
    assert report["growth"]["pages"] == 1.5
    for row in report["sizes"].values():
        for key in ("open_s", "open_cpu_s", "cold_search_s", "first_open_s"):
            assert row[key] >= 0, key
        for key in ("paging_ms", "paging_cpu_ms", "search_ms"):
            assert set(row[key]) == {"p50", "p95", "p99"}
        held = row["held_bytes_per_page"]
        assert held["index_vectors"] > 0 and held["pages"] > 0 and held["directory"] > 0


def _session(tmp_path, pages: int):
    config = Config(home=tmp_path / "home", budget=2048, page_tokens=128, embedder="hash")
    store, embedder = MemoryStore(), HashEmbedder()
    home = Home(config, store=store, embedder=embedder, durable=False)
    _bulk_session(store, home.tokenizer, config.user, config.session, pages, config.page_tokens, seed=7,
                  embedder=embedder)
    return home, home.open()


def test_an_open_session_holds_a_bounded_number_of_bytes_per_page(tmp_path):
    """What an open session holds grows with its pages at a constant rate: the vectors exactly (128 or
    256 float32 per piece), everything else (pages, index lists and postings, page table, directory)
    within 6 KB a page, and the index's own arrays as the vectors."""
    home, session = _session(tmp_path, 400)
    try:
        held = growth.held_bytes(session)
        pieces = sum(len(p.spans) for p in session.pages.values())
        assert held["index_vectors"] == pytest.approx(pieces * session.index.dim * 4, rel=0.02)
        rest = sum(v for k, v in held.items() if k != "index_vectors")
        assert rest / len(session.pages) < 6_000, held
        assert held["pages"] < 3_000 * len(session.pages)
    finally:
        home.close()


def test_deep_sizes_count_an_array_buffer_once():
    base = np.zeros((100, 8), dtype=np.float32)
    assert growth._deep([base, base[:10], base[5:]], set()) == base.nbytes


@pytest.mark.parametrize("argv, needle", [
    (["bench", "scale"], "--pages N"),
    (["bench", "scale", "--pages", "2000", "--session-pages", "1000,2000"], "--pages N"),
    (["bench", "scale", "--session-pages", "10000"], "two sizes"),
    (["bench", "scale", "--session-pages", "500,1000"], "at least 1000"),
    (["bench", "scale", "--session-pages", "ten,twenty"], "separated by commas"),
])
def test_session_pages_wants_two_sizes_or_more_and_not_pages_too(argv, needle):
    result = runner.invoke(app, argv)
    assert result.exit_code != 0
    assert needle in result.output + (result.stderr or ""), result.output
