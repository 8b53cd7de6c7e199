"""Fusion, dates and the automatic-paging search."""

from datetime import datetime

import pytest
from pager.context import build
from pager.search import date_range, terms

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


def test_terms_stem_and_drop_stopwords():
    assert terms("We went camping and she camped") == ["went", "camp", "camp"]
    assert terms("东京塔") == ["东京", "京塔"]


def test_exact_keyword_page_ranks_first(mem_home):
    s = mem_home.open("a")
    for i in range(60):
        s.append("ann", f"ordinary talk number {i} about the weather, lunch and the sprint board")
    s.append("bob", "The staging cluster is called heron-staging and production is heron-prod.")
    for i in range(60):
        s.append("ann", f"more ordinary talk {i} about coffee and standups")
    hits = s.search("which cluster is heron-staging?", k=3)
    assert "heron-staging" in s.pages[hits[0].n].text
    assert hits[0].signals["bm25"] > 0  # explained


def test_bookmark_signal_finds_a_page_by_the_models_keyword(mem_home):
    s = mem_home.open("a")
    for i in range(80):
        s.append("ann", f"filler line {i} with nothing in particular")
    target = 5
    s.bookmark([target], ["Project Nightingale"], "the secret launch")
    hits = s.search("what is project nightingale", k=3)
    assert hits[0].n == target and "bookmark" in hits[0].signals
    # a search's weights override the defaults, page-level ones (bookmark, neighbour, episode) too
    unweighted = s.index.search("what is project nightingale", s.home.embedder, s.directory, k=3,
                                weights={"bookmark": 0.0})
    assert target not in [h.n for h in unweighted[:1]]


def test_temporal_query_finds_the_dated_page(mem_home):
    s = mem_home.open("a")
    for month in range(1, 13):
        ts = datetime(2023, month, 10).timestamp()
        for i in range(8):
            s.append("ann", f"we discussed the roadmap and the budget again, item {month}-{i}", ts=ts,
                     date=f"10 {datetime(2023, month, 10):%B} 2023")
    hits = s.search("what did we say about the budget in May 2023?", k=3)
    assert s.pages[hits[0].n].date_first == "10 May 2023"
    assert "date" in hits[0].signals


def test_date_range_expressions():
    now = datetime(2026, 11, 30, 12).timestamp()
    start, end = date_range("what happened on 8 May 2023?", now)
    assert start <= datetime(2023, 5, 8).timestamp() < end
    start, end = date_range("decisions from last May", now)
    assert datetime.fromtimestamp(start) == datetime(2026, 5, 1)
    start, end = date_range("in 2022 we moved", now)
    assert datetime.fromtimestamp(start).year == 2022 and datetime.fromtimestamp(end).year == 2023
    start, end = date_range("what did I say yesterday", now)
    assert datetime.fromtimestamp(start) == datetime(2026, 11, 29)
    assert date_range("what is the plan?", now) is None


def test_a_date_range_is_read_again_on_another_day_and_for_another_message():
    # the page search and the fact search ask for the same message: the answer is kept, but only for it
    morning, evening = datetime(2026, 11, 30, 8).timestamp(), datetime(2026, 11, 30, 22).timestamp()
    assert date_range("what did I say yesterday", morning) == date_range("what did I say yesterday", evening)
    start, _ = date_range("what did I say yesterday", datetime(2026, 12, 1, 8).timestamp())
    assert datetime.fromtimestamp(start) == datetime(2026, 11, 30)
    start, _ = date_range("what did I say today", datetime(2026, 12, 1, 9).timestamp())
    assert datetime.fromtimestamp(start) == datetime(2026, 12, 1)


def test_autopage_faults_with_readahead_inside_the_share(mem_home):
    s = mem_home.open("a")
    for i in range(150):
        s.append("ann", f"routine message {i} about nothing much at all")
    s.append("bob", "Remember: the vault code for the Oslo office is 7731.")
    for i in range(150):
        s.append("ann", f"routine message {i + 150} about nothing much at all")
    holder = next(n for n, p in s.pages.items() if "7731" in p.text)
    assert not s.table[holder].resident
    ctx = build(s, "what is the vault code for the Oslo office?", chat=False)
    assert holder in ctx.pages
    assert len(ctx.pages) <= ctx.frames
    faulted = sum(1 for e in s.table.values() if e.fault_count)
    assert faulted <= int(ctx.frames * s.home.config.autopage_share)


def _day(d: int) -> dict:
    when = datetime(2024, 3, d, 12)
    return {"ts": when.timestamp(), "date": f"{d} March 2024"}


def test_a_page_ranks_higher_when_its_episode_is_about_the_query(mem_home):
    s = mem_home.open("a")
    said = []

    def stretch(day: int, topic: str):
        for _ in range(40):
            s.append("ann", topic, **_day(day))
        s.append("bob", "I bought a kayak.", **_day(day))
        said.append(s.turn_count)
        for _ in range(40):
            s.append("ann", topic, **_day(day))

    # the same sentence among the same neighbours on two days; day 1 is also about kayaking
    for i in range(12):
        s.append("bob", f"paddling the river in the kayak, stretch {i}, the current was strong", **_day(1))
    stretch(1, "tax forms and receipts")
    stretch(2, "tax forms and receipts")
    s.append("ann", "end", **_day(3))
    day1, day2 = (next(n for n, p in s.pages.items() if t in p.turns) for t in said)
    hits = s.search("who bought a kayak to paddle the river", k=40)
    rank = [h.n for h in hits]
    # without the episode signal the two copies tie and the later page would win the tie
    assert rank.index(day1) < rank.index(day2)
    assert hits[rank.index(day1)].signals["episode"] > hits[rank.index(day2)].signals["episode"]
    # single-day sessions get no episode signal: there is nothing to tell apart
    one = mem_home.open("b")
    for i in range(40):
        one.append("ann", f"line {i} about kayaks and rivers", **_day(5))
    assert all("episode" not in h.signals for h in one.search("kayak river", k=10))


def test_a_deep_search_widens_the_query_with_its_best_pages_terms(mem_home):
    s = mem_home.open("a")
    for i in range(30):
        s.append("ann", f"lunch menu {i}: soup, salad and bread rolls")
        if i % 6 == 0:
            s.append("bob", f"The Alpha module deadline moved; Priya owns the scheduler rewrite (note {i}).")
    s.append("bob", "Priya says the scheduler rewrite needs one more review.")   # no query word at all
    for i in range(30):
        s.append("ann", f"parking spots {i} and the coffee machine")
    target = next(n for n, p in s.pages.items() if "one more review" in p.text)
    query = "when is the Alpha module deadline?"
    def best_piece_text(hit):
        return s.pages[hit.n].piece_text(s.index.page_pieces[hit.n].index(hit.piece))

    shallow = {h.n: h for h in s.search(query, k=8)}
    deep = {h.n: h for h in s.search(query, k=s.index.DEEP)}
    assert target not in shallow or "bm25" not in shallow[target].signals
    assert target in deep and "one more review" in best_piece_text(deep[target])
    assert deep[target].signals["bm25"] > 0   # reached through the added terms priya, scheduler, rewrite


def test_recency_is_a_signal_only_when_weighted(mem_home, config):
    from pager.home import Home
    from pager.store import MemoryStore
    from pager.embed import HashEmbedder

    def fill(s):
        s.append("ann", "The kayak is in the garage.")
        for i in range(300):
            s.append("bob", f"filler {i} on unrelated matters")
        s.append("ann", "The kayak is in the garage.")
        for i in range(20):
            s.append("bob", f"closing remark {i}")

    plain = mem_home.open("a")
    fill(plain)
    hits = plain.search("where is the kayak", k=2)
    assert all("recency" not in h.signals for h in hits)
    assert all("importance" in h.signals for h in hits if plain.pages[h.n].importance > 0)
    weighted = Home(config.with_(recency_weight=0.3), store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = weighted.open("a")
    fill(s)
    first, second = s.search("where is the kayak", k=2)
    assert first.n > second.n and first.signals["recency"] > second.signals["recency"]
    weighted.journal.close(remove=True)


def test_turns_with_a_date_label_and_no_timestamp_are_placed_on_that_day(mem_home):
    s = mem_home.open("a")
    months = ["January", "February", "March", "April", "May", "June"]
    s.append_many([{"speaker": "ann", "text": f"we went over the budget again, round {i}", "date": f"10 {m} 2023"}
                   for m in months for i in range(10)])
    assert datetime.fromtimestamp(s.pages[1].ts_first).date() == datetime(2023, 1, 10).date()
    hits = s.search("what did we say about the budget in May 2023?", k=3)
    assert s.pages[hits[0].n].date_first == "10 May 2023" and "date" in hits[0].signals
    assert "episode" in hits[0].signals      # six days, six episodes


def test_index_vectors_grow_in_place_and_pickle_without_spare_rows():
    """Pages sealed between searches append rows to spare capacity; the cache pickles only rows in use."""
    import pickle

    import numpy as np

    from pager.page import Page
    from pager.search import Index

    index = Index(4)
    rng = np.random.default_rng(7)
    added = []
    for n in range(1, 40):
        rows = rng.standard_normal((2, 4)).astype(np.float32)
        added.append(rows)
        index.add(Page("s", n, f"word{n} other{n}", 3, ((n, 0, 5), (n, 5, 10))), rows)
        if n % 3 == 0:
            assert np.array_equal(index.vectors(), np.vstack(added))
    assert np.array_equal(index.vectors(), np.vstack(added))
    copy = pickle.loads(pickle.dumps(index))
    assert copy.vectors().shape == (78, 4) and not hasattr(copy, "_spare")
    assert np.array_equal(copy.vectors(), np.vstack(added))


def _wordllamas_own(dim: int):
    """The wordllama package's own model, loaded by the package: what pager's loader must equal."""
    import os

    import wordllama
    from wordllama import WordLlama

    return WordLlama.load(cache_dir=os.path.dirname(wordllama.__file__), disable_download=True, dim=256,
                          trunc_dim=dim if dim != 256 else None)


def test_wordllama_loads_without_importing_the_package(tmp_path):
    """The embedder reads wordllama's weights and tokenizer itself: a fresh process that embeds with it
    has not imported wordllama (whose import configures the root logger) nor requests."""
    import subprocess
    import sys

    code = ("import sys, logging\n"
            "from pager.embed import make_embedder\n"
            "v = make_embedder('wordllama').embed(['the Lisbon offsite budget'])\n"
            "assert v.shape == (1, 128), v.shape\n"
            "print(sorted(m for m in ('wordllama', 'requests') if m in sys.modules), logging.getLogger().handlers)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []", out.stdout


def test_a_short_text_embeds_exactly_as_in_a_batch():
    """Up to four texts (a query, its words) are embedded one by one, past the batch tokenizer's
    thread pool: the vectors are wordllama's own batch vectors, bit for bit, at either size."""
    import numpy as np

    from pager.embed import WordLlamaEmbedder

    texts = ["What did Maya say about the offsite budget?", "pets", "", "Caroline's LGBTQ support group 😀",
             "日本語のテキスト", "a much longer text " * 40]
    for dim in (128, 256):
        e = WordLlamaEmbedder(dim)
        batch = np.asarray(_wordllamas_own(dim).embed(texts, norm=True), dtype=np.float32)
        alone = np.concatenate([e.embed([t]) for t in texts])
        assert alone.shape == (len(texts), dim)
        assert np.array_equal(alone, batch, equal_nan=True)   # the empty text is nan in both


def test_many_texts_embed_as_wordllamas_own_batches_bit_for_bit():
    """WordLlamaEmbedder._embed_many tokenizes every text in one call and pools them in groups of similar
    length (as few as CELLS allows), where wordllama pads each 64 texts to the longest of them: a text's
    vector is the same bits however it is grouped. Texts of every length, an empty one, a group split by
    CELLS, and a text longer than CELLS alone."""
    import numpy as np

    from pager.bench.scale import TextGenerator
    from pager.embed import WordLlamaEmbedder

    texts = TextGenerator(5).turns(700) + ["", "pets", "Caroline's LGBTQ support group 😀", "日本語のテキスト",
                                           "tab\tand\nnewline", "a much longer text " * 300, "x" * 5000]
    for dim in (128, 256):
        e, own = WordLlamaEmbedder(dim), _wordllamas_own(dim)
        for cells in (1 << 16, 300):   # one group for the short texts, then many
            e.CELLS = cells
            got = e.embed(texts)
            assert got.shape == (len(texts), dim) and got.dtype == np.float32
            assert np.array_equal(got, np.asarray(own.embed(texts, norm=True), dtype=np.float32), equal_nan=True)


def test_the_index_arrays_grown_page_by_page_equal_a_full_rebuild(tmp_path):
    """Index._arrays and the BM25 postings extend their arrays by what was added since the last search
    instead of rebuilding them; after every few pages they must equal what a rebuild gives."""
    import numpy as np

    from pager.config import Config
    from pager.home import memory_home

    s = memory_home(Config(home=tmp_path, embedder="hash")).open("grow")
    for i in range(200):
        s.append(f"sp{i % 3}", f"note {i}: the amber shelf holds box {i * 7}; what did I say in turn {i - 3}?")
        if i % 5 == 0:
            grown = dict(s.index._arrays())
            s.index._cache = {}
            rebuilt = s.index._arrays()
            assert grown.keys() >= rebuilt.keys()
            for name, value in rebuilt.items():
                same = np.array_equal(grown[name], value) if isinstance(value, np.ndarray) else grown[name] == value
                assert same, (i, name)
            bm25 = s.index.bm25
            query = {"amber": 1.0, "shelf": 1.0, "box": 0.5, f"{i * 7}": 1.0}
            grown_scores = bm25.scores(query)
            bm25._arrays, bm25._length_array = {}, np.zeros(0, dtype=np.float32)
            assert np.array_equal(grown_scores, bm25.scores(query)), i
    assert len(s.pages) > 20


def test_top_k_selects_what_argpartition_selects():
    """search.top_k ranks only the values above a floor of block maxima: it returns the indices
    argpartition would (ties at the cut decided by argpartition itself), for values with
    and without ties, zeros, and -inf; seeds printed on failure."""
    import numpy as np

    from pager.search import top_k

    for seed in range(400):
        rng = np.random.default_rng(seed)
        n, k = int(rng.integers(1, 30_000)), int(rng.integers(1, 300))
        values = rng.random(n).astype(np.float32)
        if seed % 4 == 1:
            values[rng.random(n) < 0.7] = 0
        elif seed % 4 == 2:
            values = np.round(values * 5).astype(np.float32)   # ties everywhere, at the cut too
        elif seed % 4 == 3:
            values[rng.random(n) < 0.1] = -np.inf
        if seed % 8 == 7:
            values = np.sort(values)   # the largest values all in one run of neighbours
        got = top_k(values, k)
        if k >= n:
            assert sorted(got.tolist()) == list(range(n)), seed
            continue
        assert sorted(got.tolist()) == sorted(np.argpartition(-values, k - 1)[:k].tolist()), seed
        kth = np.sort(values)[n - k]
        if np.count_nonzero(values >= kth) == k:   # no tie at the cut: largest first, the lower index among equals
            assert got.tolist() == sorted(got.tolist(), key=lambda i: (-values[i], i)), seed


def test_page_best_is_the_maximum_of_each_pages_pieces():
    """Index._page_best takes each page's best piece by layers: the same maxima as reduceat, with pages
    of one piece, of several, and (then by reduceat) of very many; seeds printed on failure."""
    import numpy as np

    from pager.search import Index

    for seed in range(60):
        rng = np.random.default_rng(seed)
        lengths = rng.integers(1, 6, int(rng.integers(1, 3000)))
        if seed % 3 == 0:
            lengths[int(rng.integers(len(lengths)))] = int(rng.integers(6, 120))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        fused = rng.random(int(lengths.sum())).astype(np.float32)
        fused[rng.random(len(fused)) < 0.3] = 0
        arrays = {"starts": starts}
        for _ in range(2):   # made, then kept
            assert np.array_equal(Index(4)._page_best(fused, arrays), np.maximum.reduceat(fused, starts)), seed


def test_an_explanation_read_late_is_the_one_its_search_made(tmp_path):
    """Hit.signals is made when first read, from the search's own arrays: read after later searches
    (other queries, echoes, boosts, pages added in between), it equals the one read at once."""
    from pager.config import Config
    from pager.home import memory_home

    s = memory_home(Config(home=tmp_path, embedder="hash")).open("late")
    for i in range(120):
        s.append(f"sp{i % 3}", f"note {i}: the amber shelf holds box {i * 7}; did sp{(i + 1) % 3} ask about the garden?")
    queries = ["what did sp1 say about the amber shelf?", "the garden box", "did sp2 ask about the garden?"]
    late, eager = [], []
    for depth in (4, 30):
        for q in queries:
            hits = s.index.search(q, s.home.embedder, s.directory, 30, boosts={3: 0.25}, depth=depth)
            late.append(hits)
            eager.append([dict(h.signals) for h in s.index.search(q, s.home.embedder, s.directory, 30,
                                                                  boosts={3: 0.25}, depth=depth)])
    s.append("sp0", "a last note about the amber shelf and the garden")   # the index grows before the late reads
    s.search("amber")
    assert [[h.signals for h in hits] for hits in late] == eager
    assert any(h.signals.get("boost") for hits in late for h in hits)


def test_bookmark_marks_per_page_with_and_without_gaps():
    """Index._marks sums each indexed page's bookmark matches: by offset when the page numbers run
    without a gap, by search otherwise; both equal a plain per-page sum (pages not indexed ignored)."""
    import numpy as np

    from pager.search import Index

    for seed in range(200):
        rng = np.random.default_rng(seed)
        first = int(rng.integers(1, 50))
        numbers = np.arange(first, first + int(rng.integers(1, 400)), dtype=np.int64)
        if seed % 2:
            numbers = numbers[rng.random(len(numbers)) < 0.7] if len(numbers) > 1 else numbers
        pages = rng.integers(0, first + 450, int(rng.integers(0, 300))).astype(np.int64)
        weights = rng.random(len(pages))
        where = {n: i for i, n in enumerate(numbers.tolist())}
        expected = np.zeros(len(numbers))
        for n, w in zip(pages.tolist(), weights.tolist()):
            if n in where:
                expected[where[n]] += w
        assert np.allclose(Index._marks((pages, weights), numbers), expected), seed


def test_query_words_the_session_never_said_are_embedded_once(tmp_path):
    """Vocabulary.expand keeps the vectors of query words outside the session's vocabulary (the same
    vectors: a text embeds alone as in a batch); the expansion is the one embedding them again gives,
    and the kept vectors are not pickled with the index."""
    import pickle

    from pager.embed import HashEmbedder
    from pager.search import Vocabulary

    class Counting(HashEmbedder):
        calls = 0

        def embed(self, texts):
            Counting.calls += len(texts)
            return super().embed(texts)

    embedder = Counting(64)
    vocabulary = Vocabulary(64)
    for i in range(50):
        vocabulary.add(f"the amber shelf holds box {i} and a garden hose, said speaker {i % 4}")
    words = ["amber", "zebra", "garden", "quokka"]
    first = vocabulary.expand(words, embedder, threshold=0.1)
    calls = Counting.calls
    again = vocabulary.expand(["quokka", "amber", "zebra"], embedder, threshold=0.1)
    assert Counting.calls == calls   # nothing new to embed
    fresh = pickle.loads(pickle.dumps(vocabulary))
    assert not hasattr(fresh, "_outside")
    assert again == fresh.expand(["quokka", "amber", "zebra"], embedder, threshold=0.1)
    assert first == fresh.expand(words, embedder, threshold=0.1)


def test_a_request_without_a_question_mark_is_a_question_not_an_answer():
    """"Tell me about the Lisbon offsite", asked before, outranked the page with the budget in the offline
    shell's answer to "How much money did we have for the Lisbon offsite?" (and came second after it)."""
    from pager.offline import OfflineShell
    from pager.search import PLAIN, QUESTION, piece_kind

    assert piece_kind("user: Tell me about the Lisbon offsite") == QUESTION == piece_kind("Maya: what about lunch")
    assert piece_kind("Maya: I told him about it") == PLAIN == piece_kind("Maya: Remind me: Sam is allergic to peanuts")
    system = ("[p16 · 21 April 2025]\nMaya: Lisbon offsite is approved. Budget is 18,400 euros, Casa do Rio.\n\n"
              "[p71 · 1 Dec 2026]\nuser: Tell me about the Lisbon offsite\n")
    answer = OfflineShell().answer("How much money did we have for the Lisbon offsite?", system)
    assert answer.startswith("From p16") and "Tell me about" not in answer, answer


def test_bm25_over_fixed_documents_scores_as_the_formula_word_by_word():
    """FixedBM25 (the facts' and summaries' BM25) computes each word's terms when built; a query's scores
    are those of Okapi BM25 computed word by word at query time, to the bit, for words shared or not."""
    import math
    import random
    from collections import Counter

    import numpy as np
    from pager.search import FixedBM25

    seed = 5
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(300)]
    documents = [Counter(rng.choices(vocabulary, k=rng.randint(1, 30))) for _ in range(500)] + [Counter()]
    n = len(documents)
    lengths = np.array([sum(d.values()) for d in documents], dtype=np.float64)
    avg = float(lengths.sum()) / n
    bm25 = FixedBM25(documents)
    for _ in range(50):
        query = rng.sample(vocabulary + ["never"], 5)
        expected = np.zeros(n)
        for w in query:
            at = np.array([i for i, d in enumerate(documents) if w in d], dtype=np.int64)
            if len(at):
                tf = np.array([documents[i][w] for i in at], dtype=np.float64)
                idf = math.log(1 + (n - len(at) + 0.5) / (len(at) + 0.5))
                expected[at] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths[at] / avg))
        assert np.array_equal(bm25.scores(query), expected), (seed, query)
    assert FixedBM25([]).scores(["w1"]).shape == (0,)
    assert not FixedBM25([Counter()]).scores(["w1"]).any()
