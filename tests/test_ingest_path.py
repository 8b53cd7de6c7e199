"""The faster ingest path stores and finds exactly what the plain one does (issue 15).

Offline keywords use a quicker date pattern and skip scans that cannot match, BM25 terms of ASCII
text skip the CJK loop, a large append packs its pages while the embedding thread is still
embedding, and the packer counts a page's body from its end (with each line's own count made on
the embedding thread). Each is checked against the plain form here: the release's date pattern and
every scan, the general terms loop, a packer that counts every body whole, and a home fed one
message at a time without the embedding thread.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from pager import bookmarks as bm
from pager.bench.scale import NAMES, TextGenerator
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.page import Packer, Turn
from pager.search import _TOKEN, _term, terms
from pager.store import MemoryStore
from pager.tokens import get_tokenizer

# the date pattern of release 0.1, every month name spelled out
RELEASE_DATE = re.compile(
    r"\b\d{1,2}\s+(?:" + "|".join(bm.MONTHS) + r")[a-z]*,?\s+\d{4}\b|\b(?:" + "|".join(bm.MONTHS)
    + r")[a-z]*\s+\d{1,2}(?:st|nd|rd|th)?,?\s+\d{4}\b|\b\d{4}-\d{2}-\d{2}\b",
    re.IGNORECASE,
)

PIECES = ["1", "9", "12", "31", "2023", "1999-12-31", "2023-5-1", "May", "may", "MAY", "Sept", "September", "sept",
          "Jun", "jUNE", "Julyish", "Decimal", "march", "Mar", "Maryland", "3rd", "21st", "2nd", "th", ",", ".", " ",
          "  ", "\n", "\t", "x", "ab", "-", "_", "05", "Mayday", "junk", "Aug", "of", "the", "Bank", "of", "England",
          "`cfg.load`", "cfg.load", "camelCase", "McDonald", "snake_case", "$40", "20%", "3 pm", "東京大学", "é", "ſep",
          "Zoë", "K", "ok", "Sam:", "(9 May 2023)", "Maya", "Petra", "v2.0", "e.g.", "U.S.", "'s", "’s"]
texts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=30).map("".join)
spaced = st.lists(st.sampled_from(PIECES), min_size=1, max_size=30).map(" ".join)


# the name and number patterns of release 0.1, each led by its word-boundary assertion
RELEASE_NAME_RUN = re.compile(r"\b(?:[A-Z][\w'’-]*|[A-Z]{2,})(?:\s+(?:of\s+|de\s+|the\s+)?(?:[A-Z][\w'’-]*|[A-Z]{2,}|\d+))*")
RELEASE_NUMBER = re.compile(r"(?<![\w.])\$?\d[\d,.]*(?:\s?(?:%|k|m|am|pm|kg|km|mi|miles|hours?|minutes?|years?|days?))?(?![\w.])")
NUMBERISH = ["$", "$$", "$5", "a$5", ".5", "5.", "1,000", "3 pm", "20%", "x9", "_9", "é9", "9k", "12 days", "٣", "²", "Ⅻ",
             "A", "AB", "Bank", "of", "the", "de", "Ünal", "ÉMILE", "x", "'", "’", "-"]
odd_numbers = st.lists(st.sampled_from(PIECES + NUMBERISH), min_size=1, max_size=30)


@settings(max_examples=600, deadline=None)
@given(st.one_of(texts, spaced, odd_numbers.map("".join), odd_numbers.map(" ".join)))
def test_the_name_and_number_patterns_find_what_the_release_patterns_found(text):
    for new, old in ((bm._NAME_RUN, RELEASE_NAME_RUN), (bm._NUMBER, RELEASE_NUMBER)):
        assert [m.group(0) for m in new.finditer(text)] == [m.group(0) for m in old.finditer(text)], (text, new.pattern)
    assert [m.span() for m in bm._NAME_RUN.finditer(text)] == [m.span() for m in RELEASE_NAME_RUN.finditer(text)]
    assert [m.span() for m in bm._NUMBER.finditer(text)] == [m.span() for m in RELEASE_NUMBER.finditer(text)]


@settings(max_examples=600, deadline=None)
@given(st.one_of(texts, spaced))
def test_the_date_pattern_finds_what_the_release_pattern_found(text):
    assert [m.span() for m in bm._DATE.finditer(text)] == [m.span() for m in RELEASE_DATE.finditer(text)], text


def _release_extract(text, monkeypatch_like):
    """extract() with the release's date pattern and no scan skipped."""
    with monkeypatch_like.context() as m:
        m.setattr(bm, "_DATE", RELEASE_DATE)
        m.setattr(bm, "_may_hold_identifier", lambda body: True)   # the identifier scan always runs
        m.setattr(bm, "_may_hold_date", lambda body: True)         # and the date scan
        return bm.extract(text)


def _samples() -> list[str]:
    gen = TextGenerator(5)
    pages = ["\n".join(f"{NAMES[i % len(NAMES)]}: {t}" for i, t in enumerate(gen.turns(3))) for _ in range(150)]
    return pages + ["Dr. `cfg.load` and snake_case_name met camelCase at 9 May 2023, v2.0 on 2023-05-09.",
                    "東京大学 で Maya と会った 12 May 2024", "(9 May 2023)\nSam: we fly on May 9th, 2024 to Lake Como"]


def test_offline_keywords_are_the_release_keywords(monkeypatch):
    for text in _samples():
        assert bm.extract(text) == _release_extract(text, monkeypatch), text


@settings(max_examples=300, deadline=None)
@given(spaced)
def test_offline_keywords_of_odd_text_are_the_release_keywords(text):
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        assert bm.extract(text) == _release_extract(text, mp), text


def _plain_extract(text: str, limit: int = 6, words_first: bool = True) -> list[str]:
    """extract() with every keyword through add() and the covered-phrase check phrase by phrase."""
    from collections import Counter, defaultdict

    body = "\n".join(bm._strip_speaker(line) for line in text.splitlines() if not bm._DATE_MARKER.match(line))
    scored: dict[str, float] = defaultdict(float)
    display: dict[str, str] = {}

    def add(keyword: str, weight: float) -> None:
        key = bm.normalize(keyword)
        if len(key) < 2 or key in bm.STOPWORDS or key in bm.NOT_NAMES:
            return
        scored[key] += weight
        display.setdefault(key, keyword.strip())

    for match in bm._DATE.finditer(body):
        add(match.group(0), 4.0)
    for match in bm._NAME_RUN.finditer(body):
        phrase = bm._trim_name(match.group(0))
        if phrase:
            add(phrase, 3.0 + 0.5 * phrase.count(" "))
    for match in bm._IDENT.finditer(body):
        add(match.group(1) or match.group(2), 3.0)
    for match in bm._CJK.finditer(body):
        run = match.group(0)
        add(run if len(run) <= 8 else run[:8], 2.5)
    numbers = set()
    for match in bm._NUMBER.finditer(body):
        number = match.group(0).strip().rstrip(",." if words_first else "")
        digits = sum(map(str.isdecimal, number))
        if digits >= 2 or not number.isdigit():
            add(number, 0.3 + 0.01 * min(digits, 9) if words_first else 2.0)
            numbers.add(bm.normalize(number))
    for word, count in Counter(w.lower() for w in bm._WORD.findall(body)).items():
        if word not in bm.STOPWORDS:
            add(word, 0.6 + 0.4 * min(count, 3) + 0.05 * len(word))
    if words_first and numbers and len(scored) - len(numbers) < limit:
        for word, count in Counter(w.lower() for w in bm._SHORT_WORD.findall(body)).items():
            add(word, 0.4 + 0.1 * min(count, 3) + 0.05 * len(word))
    chosen: list[str] = []
    left = bm.NUMBERS if words_first else limit
    for key in sorted(scored, key=lambda k: (-scored[k], k)):
        if any(key in c.lower() for c in chosen):
            continue
        if key in numbers and scored[key] < 1.0:
            if not left:
                continue
            left -= 1
        chosen.append(display[key])
        if len(chosen) == limit:
            break
    return chosen


WORDY = ["Congratulations", "congratulations", "Wednesday", "wednesday", "marathon", "marathons", "Marathon",
         "don't-stop", "well-known", "Lake Como", "lake como", "Bank of England", "England", "Como", "Lakeside"]


@settings(max_examples=500, deadline=None)
@given(st.one_of(texts, spaced, st.lists(st.sampled_from(PIECES + WORDY), min_size=1, max_size=40).map(" ".join)))
def test_offline_keywords_are_those_of_the_plain_loop(text):
    """extract()'s shortcuts (a word of letters skips normalize, the covered check is one search) pick
    the keywords the plain loop picks."""
    assert bm.extract(text) == _plain_extract(text), text
    assert bm.extract(text, words_first=False) == _plain_extract(text, words_first=False), text


def test_offline_keywords_of_pages_are_those_of_the_plain_loop():
    for text in _samples():
        assert bm.extract(text) == _plain_extract(text), text
        assert bm.extract(text, words_first=False) == _plain_extract(text, words_first=False), text


def _general_terms(text: str) -> list[str]:
    """terms() without its ASCII shortcut: the CJK-aware loop for every text."""
    out, cjk = [], []
    for tok in _TOKEN.findall(text.lower()) + [""]:
        if len(tok) == 1 and ord(tok) > 0x3000:
            cjk.append(tok)
            continue
        if cjk:
            out.extend(cjk if len(cjk) == 1 else [a + b for a, b in zip(cjk, cjk[1:])])
            cjk = []
        if tok and _term(tok) is not None:
            out.append(_term(tok))
    return out


@settings(max_examples=400, deadline=None)
@given(st.one_of(texts, spaced))
def test_bm25_terms_are_those_of_the_general_loop(text):
    assert terms(text) == _general_terms(text)


@pytest.mark.parametrize("listen", [True, False])
def test_a_home_fed_in_appends_of_1000_stores_and_finds_what_one_fed_a_message_at_a_time_does(tmp_path, monkeypatch,
                                                                                              listen):
    """Appends of 1,000 through the durable path (journal, embedding on another thread beside the packing,
    token counts of the whole group) against one message at a time without a journal: the same pages, keywords,
    vectors and search results, and (with a listener, which gets each turn's count) the same events."""
    import pager.intake

    messages = [{"speaker": NAMES[i % len(NAMES)], "text": t} for i, t in enumerate(TextGenerator(11).turns(2500))]
    messages[5:9] = [{"speaker": "Maya", "text": "ok!"}, {"speaker": "/x", "text": "we x!"}, {"speaker": "Sam", "text": "done."},
                     {"speaker": "Sam", "text": "long " * 400}]   # a speaker count_appended must not sum, a split turn
    counted = []
    count_turns = pager.intake.count_turns
    monkeypatch.setattr(pager.intake, "count_turns", lambda *a: counted.append(len(a[0])) or count_turns(*a))

    def ingest(durable: bool, size: int):
        cfg = Config(home=tmp_path / f"h{durable}", budget=4096, page_tokens=128, embedder="hash")
        store = MemoryStore()
        home = Home(cfg, store=store, embedder=HashEmbedder(), durable=durable)
        s = home.open("work")
        events: list = []
        if listen:
            s.events.listeners.append(events.append)
        for i in range(0, len(messages), size):
            s.append_many(messages[i : i + size])
        home.flush()
        used = home.writes.early is not None
        pages = [(p.n, p.text, p.spans, p.keywords, p.tokens, p.importance) for p in s.pages.values()]
        results = [[(h.n, round(h.score, 6)) for h in s.search(q, k=8)]
                   for q in ("what did Maya say about the budget?", "deploy review on 3 May", "the dog and the coffee",
                             "Petra marathon 1200")]
        stored, stored_vectors = store.pages(s.user, s.name)
        assert [(p.n, p.keywords) for p in stored] == [(p[0], p[3]) for p in pages]   # flushed as held
        vectors = s.index.vectors().copy()
        home.close()
        events = [(e.kind, e.data) for e in events if e.kind in ("turn", "page_sealed")]
        return pages, results, (vectors, np.concatenate(stored_vectors)), used, events

    fast = ingest(True, 1000)
    assert sum(counted) == len(messages) and max(counted) == 1000   # every turn counted, a group at once
    plain = ingest(False, 1)
    assert sum(counted) == 2 * len(messages)   # and one at a time
    assert fast[3] and not plain[3]   # the durable home embedded on the other thread; the other had no fsync to wait for
    assert len(fast[0]) > 500
    assert fast[0] == plain[0]
    assert fast[1] == plain[1]
    assert np.array_equal(fast[2][0], plain[2][0]) and np.array_equal(fast[2][1], plain[2][1])
    assert fast[4] == plain[4] and len(fast[4]) == (len(messages) + len(fast[0]) if listen else 0)
    if listen:
        assert [d["tokens"] for k, d in fast[4] if k == "turn"] == [get_tokenizer("cl100k_base").count(m["text"])
                                                                    for m in messages]


def test_the_benchmark_bulk_build_stores_what_per_session_puts_store(tmp_path):
    """`bench scale` writes its background sessions in large appends, past Store.put: the same rows."""
    from pager.bench.scale import _Bulk, _bulk_session
    from pager.store import LanceStore
    from pager.tokens import get_tokenizer

    tokenizer = get_tokenizer("cl100k_base")

    def build(bulk: bool):
        store = LanceStore(str(tmp_path / f"db{bulk}"), dim=8)
        sink = _Bulk(store, size=500) if bulk else store
        for i in range(4):
            _bulk_session(sink, tokenizer, f"u{i % 2}", f"s{i}", 300, 128, seed=i + 10)
        if bulk:
            sink.flush()
        store.refresh()
        out = {}
        for i in range(4):
            pages, vectors = store.pages(f"u{i % 2}", f"s{i}")
            out[i] = ([t.to_dict() for t in store.turns(f"u{i % 2}", f"s{i}")], pages,
                      [np.asarray(v).tobytes() for v in vectors])
        return out

    bulk, plain = build(True), build(False)
    assert all(len(bulk[i][1]) == 300 for i in range(4))
    assert bulk == plain


# text where tiktoken's pre-tokens cross line and word ends: punctuation before newlines, runs of spaces
# and newlines, digits, contractions, CJK, emoji, accents, and letters next to all of them
ODD = st.lists(st.one_of(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]),
                        st.sampled_from(["\n", " ", "  ", ".", "!?\n", "'s", "’", ":", "/", "\t", "\r", "123",
                                         "東京", "😀", "é", "May", "x", "-", "("])),
               min_size=1, max_size=60).map("".join).filter(lambda t: t.strip() and "\x00" not in t)
SPEAKERS = st.sampled_from(["Maya", "sam", "A b", "Z", "ü", "東京", "1x", "'s", "(x)", "-", "😀", "x\ty", "/x", "/"])
ENCODINGS = st.sampled_from(["cl100k_base", "o200k_base"])


class WholePacker(Packer):
    """The packer as it was: every body counted whole."""

    def count_appended(self, line, known=None):
        return self.tokenizer.count(self._body_with(line))


@settings(max_examples=300, deadline=None)
@given(turns=st.lists(st.tuples(SPEAKERS, st.one_of(ODD, spaced, texts), st.sampled_from(["", "1 May 2023", "2 May 2023"]),
                                st.booleans()), min_size=1, max_size=40),
       page_tokens=st.sampled_from([48, 64, 128, 256]), encoding=ENCODINGS)
def test_a_packer_counting_from_the_end_seals_the_pages_of_one_counting_whole(turns, page_tokens, encoding):
    """Packer.count_appended recounts only the body's end (and takes a line's own count when given):
    after every turn the open body's count is its exact whole count, and every sealed page is the one
    a packer counting every body whole seals, tokens included."""
    tokenizer = get_tokenizer(encoding)
    fast, whole = Packer("s", tokenizer, page_tokens), WholePacker("s", tokenizer, page_tokens)
    for n, (speaker, text, date, known) in enumerate(turns, 1):
        turn = Turn("s", n, speaker, text, date=date)
        line_tokens = tokenizer.count(f"{speaker}: {text}") if known else None
        assert fast.add(turn, line_tokens=line_tokens) == whole.add(turn)
        body = "\n".join(p.line for p in fast.pieces)
        assert fast.body_tokens == whole.body_tokens == tokenizer.count(body), repr(body)
    if fast.pieces:
        assert fast.seal() == whole.seal()


@settings(max_examples=600, deadline=None)
@given(body=st.lists(st.one_of(ODD, spaced), min_size=1, max_size=3), line=st.one_of(ODD, spaced), head=SPEAKERS,
       encoding=ENCODINGS)
@example(body=["we saw x!"], line="hi", head="/x", encoding="o200k_base")   # o200k's "!\n/" is one pre-token
@example(body=["so it goes."], line="a", head="//x", encoding="o200k_base")
def test_a_body_with_a_line_counts_as_its_end_plus_the_line(body, line, head, encoding):
    """The sums count_appended makes, on any text: the body's count less its end's, plus the end with
    the newline and the line (or, for a line starting with an ASCII letter, the end with the newline
    plus the line's own count) is the whole body's count."""
    tokenizer = get_tokenizer(encoding)
    packer = Packer("s", tokenizer, 10_000)
    for i, text in enumerate(body, 1):
        packer.add(Turn("s", i, "Maya", text))
    line = f"{head}: {line}"
    whole = tokenizer.count("\n".join(p.line for p in packer.pieces) + "\n" + line)
    assert packer.count_appended(line) == whole
    assert packer.count_appended(line, tokenizer.count(line)) == whole


QUOTING = ["From p12: “", "from p3 (9 May 2023): “", "Also from p7: “", "Sam: From p1: “", ". From p2", "rom p", "From p",
           "(offline memory shell", "?", "x", " ", "\n"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(QUOTING + PIECES), min_size=1, max_size=12).map("".join))
def test_a_piece_kind_is_that_of_the_quote_pattern_alone(text):
    """piece_kind looks for "rom p" before it runs the quote pattern: the kind is the pattern's."""
    from pager.search import _QUOTES_PAGE, PLAIN, QUESTION, QUOTE, SHELL_NOTE, piece_kind

    plain = QUOTE if _QUOTES_PAGE.search(text) or SHELL_NOTE in text else QUESTION if "?" in text else PLAIN
    assert piece_kind(text) == plain


def test_a_page_table_snapshot_holds_its_state_fields_in_order():
    """PageTable.snapshot reads the fields directly: the values of STATE_FIELDS, in that order."""
    from pager.page_table import Entry, PageTable

    table = PageTable()
    table[3] = Entry(3, tokens=9, resident=True, frame=2, pinned=True, referenced=True, last_use=7, use_count=4,
                     fault_count=2, relevance=0.5)
    table[4] = Entry(4)
    assert table.snapshot() == {"3": [getattr(table[3], f) for f in PageTable.STATE_FIELDS]}
    assert table.snapshot(every=True)["4"] == [getattr(table[4], f) for f in PageTable.STATE_FIELDS]


# -- one token scan for the BM25 terms and the vocabulary, the page vector as an array --------------------------
RELEASE_WORD = re.compile(r"[a-z][a-z'’-]{2,}")   # the vocabulary's word pattern, scanned on its own before
WORDISH = ["-", "'", "’", "well-known", "dogs'", "don't", "abc1def", "a1", "7up", "x9y", "1999", "Kelvin K", "ſ",
           "İstanbul", "ı", "café", "naïve", "・", "ー", "ゝ", "東京", "ソウル", "서울", "Tokyo", "TOKYO", "is", "zzz"]
wordy_texts = st.lists(st.sampled_from(PIECES + WORDY + WORDISH), min_size=1, max_size=40).map(" ".join)
glued_texts = st.lists(st.sampled_from(PIECES + WORDISH), min_size=1, max_size=30).map("".join)


@settings(max_examples=600, deadline=None)
@given(st.one_of(wordy_texts, glued_texts, st.text(max_size=60), st.text(st.characters(max_codepoint=127), max_size=80)))
def test_one_token_scan_gives_the_terms_and_the_vocabulary_words_of_two(text):
    """Index.add scans a piece's lower case once: the ASCII pattern finds _TOKEN's matches in ASCII text, and
    the vocabulary's words taken from those tokens are _WORD's matches, in order."""
    from pager.search import _ASCII_TOKEN, _terms, _tokens, _vocabulary_words

    low = text.lower()
    if text.isascii():
        assert _ASCII_TOKEN.findall(low) == _TOKEN.findall(low)
    assert _tokens(low, text.isascii()) == _TOKEN.findall(low)   # split after translate, in ASCII without "'"
    tokens = (_ASCII_TOKEN if text.isascii() else _TOKEN).findall(low)
    assert _terms(tokens, text.isascii()) == _general_terms(text)
    assert _vocabulary_words(low, tokens) == RELEASE_WORD.findall(low), text


def test_an_index_holds_the_terms_and_vocabulary_of_the_separate_scans():
    """Pages indexed with one scan per piece hold the terms, postings and vocabulary (in its order) of
    terms() and Vocabulary.add(text) run on each piece."""
    from pager.search import BM25, Index, Vocabulary

    tok = get_tokenizer("cl100k_base")
    packer = Packer("s", tok, 96)
    extra = ["well-known dogs' toys don't abc1def", "東京大学 で Maya と会った", "Kelvin K and İstanbul café"]
    pages = []
    for n, text in enumerate(TextGenerator(3).turns(300) + extra, 1):
        pages += packer.add(Turn("s", n, NAMES[n % len(NAMES)], text, date="1 May 2023"))
    index = Index(4)
    for page in pages:
        index.add(page, np.zeros((len(page.spans), 4), dtype=np.float32))
    texts = [page.piece_text(i) for page in pages for i in range(len(page.spans))]
    vocabulary, bm25, last = Vocabulary(4), BM25(), []
    for text, kind in zip(texts, index.piece_kind):
        words = _general_terms(text)
        bm25.add(words + last)
        last = words if kind != 2 else []
        for word in set(RELEASE_WORD.findall(text.lower())):   # Vocabulary.add as it was
            if word not in vocabulary.index and word not in bm.STOPWORDS and len(vocabulary.index) < vocabulary.limit:
                vocabulary.index[word] = len(vocabulary.words)
                vocabulary.words.append(word)
    assert index.piece_terms == [tuple(_general_terms(t)) for t in texts]
    assert index.bm25.postings == bm25.postings and index.bm25.lengths == bm25.lengths
    assert index.vocabulary.words == vocabulary.words and len(vocabulary.words) > 50


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(st.lists(st.floats(-1e3, 1e3, width=32), min_size=8, max_size=8), min_size=1, max_size=4),
                     min_size=1, max_size=5))
def test_a_page_row_with_its_vector_as_an_array_makes_the_table_of_the_list(rows):
    """_page_vectors hands Arrow the float32 mean itself, not its list: the same pages table."""
    import types

    import pyarrow as pa

    from pager.store import LanceStore, _page_row

    schema = LanceStore._schemas(types.SimpleNamespace(dim=8))["pages"]
    packer = Packer("s", get_tokenizer("cl100k_base"), 64)
    pages = packer.add(Turn("s", 1, "Ann", "a few words to seal " * 40, date="1 May 2023"))
    pieces = [np.array(r, dtype=np.float32) for r in rows]
    new = [_page_row(pages[0], p) for p in pieces]
    old = [{**row, "vector": row["vector"].tolist()} for row in new]
    assert all(isinstance(row["vector"], np.ndarray) for row in new)
    assert pa.Table.from_pylist(new, schema=schema).equals(pa.Table.from_pylist(old, schema=schema))


@settings(max_examples=300, deadline=None)
@given(end=st.one_of(ODD, spaced, texts), suffix=st.sampled_from(["\n", "\n\n", " ", "\nSam: hi", "!"]),
       encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_the_cached_difference_of_an_end_is_its_count_with_the_suffix_less_its_own(end, suffix, encoding):
    """Tokenizer.delta, which the packer adds for a line's newline, is the difference of the two counts, cached or not."""
    tokenizer = get_tokenizer(encoding)
    for _ in range(2):   # computed, then from the cache
        assert tokenizer.delta(end, suffix) == tokenizer.count(end + suffix) - tokenizer.count(end)


# dates of every shape the date pattern takes, odd cases, spaces and ordinals included, among other text
_DAY = st.sampled_from(["1", "9", "09", "12", "31", "٣", "3"])
_MONTH_WORD = st.sampled_from(bm.MONTHS + ["MAY", "Sept", "ſeptember", "ſep", "AUGust", "Decimal", "marchish", "Junes"])
_GAP = st.sampled_from([" ", "  ", "\n", "\t", "\u3000", " \n "])
_YEAR = st.sampled_from(["2023", "1999", "0000", "20234", "٢٠٢٣"])
_ORDINAL = st.sampled_from(["", "st", "nd", "rd", "th", "ST", "ſt", "Th"])
_COMMA = st.sampled_from(["", ","])
a_date = st.one_of(
    st.tuples(_DAY, _GAP, _MONTH_WORD, _COMMA, _GAP, _YEAR).map("".join),
    st.tuples(_MONTH_WORD, _GAP, _DAY, _ORDINAL, _COMMA, _GAP, _YEAR).map("".join),
    st.tuples(_YEAR, st.just("-"), st.sampled_from(["05", "5", "12"]), st.just("-"), st.sampled_from(["09", "9", "31"])).map("".join),
)
dated = st.lists(st.one_of(a_date, st.sampled_from(PIECES)), min_size=1, max_size=12)


@settings(max_examples=800, deadline=None)
@given(st.one_of(dated.map(" ".join), dated.map("".join), texts, spaced))
def test_a_body_the_date_pattern_matches_holds_the_date_core(text):
    """extract() skips the date scan of a body without _DATE_CORE: every body with a date holds it."""
    if bm._DATE.search(text) or RELEASE_DATE.search(text):
        assert bm._may_hold_date(text), text
    assert [m.span() for m in bm._DATE.finditer(text)] == [m.span() for m in RELEASE_DATE.finditer(text)], text


@settings(max_examples=300, deadline=None)
@given(dated.map(" ".join))
def test_offline_keywords_of_dated_text_are_the_release_keywords(text):
    with pytest.MonkeyPatch.context() as mp:
        assert bm.extract(text) == _release_extract(text, mp), text



def test_the_benchmark_times_the_reference_beside_each_append_and_question_and_leaves_nothing(tmp_path):
    """`bench scale` times the reference's work next to pager's: each append of 1,000 turns beside the
    reference's append of the same turns, and each question beside the reference's two queries, in
    alternating order; the reference's table and the indexes it made are gone afterwards, so the
    store's files are counted as pager left them."""
    from pager.bench import scale
    from pager.bench.scale import NAMES, WORDS, _bulk_session, _ingest, _Reference

    cfg = Config(home=tmp_path / "h", session="measured", user="u0", db=str(tmp_path / "db"), embedder="hash")
    order: list[str] = []
    with Home(cfg, embedder=HashEmbedder(64)) as home:
        _bulk_session(home.store, home.tokenizer, "u0", "measured", 400, cfg.page_tokens, seed=7, embedder=home.embedder)
        session = home.open()
        pages = home.store._tables["pages"]
        before = sorted(i.name for i in pages.list_indices())
        reference = _Reference(home)
        append = reference.append
        reference.append = lambda texts, first: (order.append("reference"), append(texts, first))[1]
        many = session.append_many
        session.append_many = lambda messages: (order.append("pager"), many(messages))[1]
        turns = session.turn_count
        texts = TextGenerator(5).turns(3 * scale.INGEST_APPEND)
        rate, cpu_rate = _ingest(home, session, texts, scale.INGEST_APPEND, _NoBar(), reference)
        assert order == ["reference", "pager", "pager", "reference", "reference", "pager"]
        assert session.turn_count == turns + len(texts) and rate > 0 and cpu_rate > 0
        assert reference.table.count_rows() == reference.appended == len(texts)
        # the rows are the turns, numbered in order, each with its text's embedding
        stored = reference.table.to_arrow().sort_by("turn").to_pylist()
        assert [r["turn"] for r in stored] == list(range(1, len(texts) + 1))
        assert [r["text"] for r in stored] == texts and {(r["user"], r["session"]) for r in stored} == {("u0", "reference")}
        assert np.array_equal(np.array([r["vector"] for r in stored[:50]], dtype=np.float32), home.embedder.embed(texts[:50]))
        asks = [f"what did {NAMES[i]} say about the {WORDS[20 + i]}?" for i in range(3)]
        reference.index(asks)
        assert reference.made and set(reference.made).isdisjoint(before)
        for i in range(len(asks)):
            reference.query(i)
        reference.close()
        report = reference.report()
        assert len(report) == 6 and report["append_turns_per_s"] > 0 and report["query_ms"]["p50"] > 0
        assert scale._Reference.TABLE not in home.store._table_names()
        pages.checkout_latest()
        assert sorted(i.name for i in pages.list_indices()) == before


class _NoBar:
    def add_task(self, *args, **kwargs) -> int:
        return 0

    def update(self, *args, **kwargs) -> None:
        pass
