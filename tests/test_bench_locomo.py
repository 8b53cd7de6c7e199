"""The benchmark's evidence accounting on a hand-made conversation, and a small slice of the real one."""

import json

import pytest

from conftest import LOCOMO
from pager.bench.locomo import covered, run, turns_in_context
from pager.config import Config
from pager.context import build
from pager.embed import HashEmbedder
from pager.home import Home
from pager.store import MemoryStore


def test_covered_needs_the_whole_turn():
    assert covered([(0, 10)], 10)
    assert covered([(5, 10), (0, 5)], 10)
    assert not covered([(0, 9)], 10)
    assert not covered([(0, 4), (6, 10)], 10)
    assert not covered([], 3)


def test_a_turn_split_across_pages_counts_only_when_every_part_is_inside(tmp_path):
    cfg = Config(home=tmp_path, budget=2048, page_tokens=64, embedder="hash")
    home = Home(cfg, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("tiny")
    s.append("ann", "short opening line")
    long_turn = s.append("bob", " ".join(f"detail{i}" for i in range(120)))
    s.append("ann", "closing remark")
    parts = [n for n, p in s.pages.items() if any(t == long_turn.turn for t, _, _ in p.spans)]
    if any(piece.turn.turn == long_turn.turn for piece in s.packer.pieces):
        parts.append(s.tail_n)  # its last part is on the open tail page
    assert len(parts) >= 2, "the long turn spans pages"
    length = len(long_turn.text)
    spans = turns_in_context(s, parts)
    assert covered(spans[long_turn.turn], length)
    spans = turns_in_context(s, parts[:-1])
    assert not covered(spans[long_turn.turn], length)
    ctx = build(s, "detail7 detail8", chat=False)
    inside = turns_in_context(s, ctx.pages)
    whole = covered(inside.get(long_turn.turn, []), length)
    assert whole == all(n in ctx.pages for n in parts)
    home.journal.close(remove=True)


@pytest.mark.skipif(not LOCOMO.exists(), reason="needs ../shared/data/locomo (present in CI)")
def test_benchmark_slice_runs_and_reports_the_design_keys(tmp_path):
    report = run(LOCOMO, [1024, 2048], Config(embedder="wordllama"), limit_conversations=1, limit_questions=25,
                 progress=False)
    assert report["tokenizer"] == "cl100k_base"
    for row in report["results"]:
        for key in ("recall", "all_hit", "mean_tokens", "p50_ms", "p95_ms", "by_category"):
            assert key in row["pager"]
        assert set(row["baselines"]) == {"recent", "bm25", "vector"}
        assert row["pager"]["mean_tokens"] <= row["budget"]
        assert row["baselines"]["bm25"]["mean_tokens"] <= row["budget"]
        # paging beats the conversation tail by far on questions about the past
        assert row["pager"]["recall"] > row["baselines"]["recent"]["recall"] + 0.3
    json.dumps(report)


@pytest.mark.skipif(not LOCOMO.exists(), reason="needs ../shared/data/locomo (present in CI)")
def test_recorded_memory_reports_coverage_for_every_system(tmp_path):
    from pager.formats import parse_locomo_observations

    observations = parse_locomo_observations(LOCOMO)
    assert all(refs and text for facts in observations.values() for _, text, refs in facts)
    report = run(LOCOMO, [1024], Config(embedder="hash"), limit_conversations=1, limit_questions=40, progress=False,
                 memory="recorded")
    row = report["results"][0]
    assert report["memory"] == "recorded"
    for summary in [row["pager"], *row["baselines"].values()]:
        assert summary["coverage"] >= summary["recall"]   # a fact only ever adds evidence
        assert summary["mean_tokens"] <= 1024 and all("coverage" in c for c in summary["by_category"].values())
    assert row["pager"]["fact_tokens"] > 0 and row["pager"]["coverage"] > row["pager"]["recall"]
    assert row["baselines"]["recent"]["coverage"] == row["baselines"]["recent"]["recall"]  # it shows no facts


@pytest.mark.skipif(not LOCOMO.exists(), reason="needs ../shared/data/locomo (present in CI)")
def test_the_oracle_reranker_bounds_what_reordering_the_facts_can_gain(tmp_path):
    def coverage(**kw):
        report = run(LOCOMO, [1024], Config(embedder="hash", **kw), limit_conversations=1, limit_questions=40,
                     progress=False, baselines=False, memory="recorded")
        return report, report["results"][0]["pager"]["coverage"]

    plain_report, plain = coverage()
    assert "reranker" not in plain_report
    for pieces, facts in ((0, 100), (100, 0)):
        report, oracle = coverage(reranker="oracle", rerank_pieces=pieces, rerank_facts=facts)
        assert report["reranker"] == "oracle" and report["reranker_failures"] == 0
        assert (report["rerank_pieces"], report["rerank_facts"]) == (pieces, facts)
        assert oracle > plain, f"the evidence among the first {pieces or facts} {'pieces' if pieces else 'facts'} goes first"


def test_a_failing_reranker_is_counted_in_the_report(monkeypatch):
    import pager.rerank as rerank
    from pager.bench import locomo
    from pager.formats import Conversation, Question

    def down(self, query, documents):
        raise ConnectionError("no rerank server on localhost:7997")

    monkeypatch.setattr(rerank.LiteLLMReranker, "scores", down)
    plants = ("tulips", "roses", "basil", "mint")
    talk = [{"speaker": "Ann", "text": f"I planted {w} in the garden today.", "ref": f"D1:{i + 1}"}
            for i, w in enumerate(plants)]
    talk += [{"speaker": "Bo", "text": f"The bus was late again, the {i}th time this year.", "ref": f"D1:{i + 5}"}
             for i in range(40)]   # the garden's turns on sealed pages: the search has pieces to reorder
    conv = Conversation("c1", talk,
                        [Question("What did Ann plant?", 4, ["D1:2"]), Question("Did Ann plant basil in the garden?", 4, ["D1:3"])])
    observations = [("Ann", f"Ann planted {w}.", [f"D1:{i + 1}"]) for i, w in enumerate(plants)]
    tallies = {name: locomo.Tally() for name in locomo.SYSTEMS}
    failed: list[str] = []
    locomo.evaluate(conv, 1024, Config(embedder="hash", reranker="infinity/bge-reranker-base"), tallies, False,
                    recorded=observations, rerank_errors=failed)
    assert failed == ["ConnectionError: no rerank server on localhost:7997"] * 4, "each stage of each question, said"
    assert len(tallies["pager"].outcomes) == 2 and all(o.coverage is not None for o in tallies["pager"].outcomes)


@pytest.mark.skipif(not LOCOMO.exists(), reason="needs ../shared/data/locomo (present in CI)")
def test_a_vector_cache_makes_a_rerun_embed_nothing_and_report_the_same(tmp_path):
    from pager.bench.locomo import VectorCache
    from pager.embed import make_embedder

    embedder = make_embedder("hash")
    calls = []
    embed = embedder.embed

    def counted(texts):
        calls.append(len(texts))
        return embed(texts)

    embedder.embed = counted
    try:
        path = tmp_path / "vectors.npz"
        args = (LOCOMO, [1024], Config(embedder="hash"))
        kw = dict(limit_conversations=1, limit_questions=20, progress=False, baselines=False)
        plain = run(*args, **kw)
        calls.clear()
        first = run(*args, **kw, vector_cache=path)
        assert sum(calls) > 0 and path.is_file()
        held = VectorCache(path)
        assert len(held.vectors) == sum(calls)   # each text embedded once, kept by its hash
        calls.clear()
        second = run(*args, **kw, vector_cache=path)
        assert sum(calls) == 0, "a rerun over the same conversation embeds nothing"
        for report in (first, second):
            assert report["results"][0]["pager"]["recall"] == plain["results"][0]["pager"]["recall"]
            assert report["results"][0]["pager"]["by_conversation"] == plain["results"][0]["pager"]["by_conversation"]
        assert embedder.embed is counted, "the embedder is given back as it was"
    finally:
        del embedder.embed


def test_a_file_that_is_no_vector_cache_is_refused(tmp_path):
    from pager.bench.locomo import VectorCache
    from pager.errors import InputError

    bad = tmp_path / "notes.txt"
    bad.write_text("not vectors")
    with pytest.raises(InputError, match="not a vector cache"):
        VectorCache(bad)
