"""Each page carries its pieces' token counts, made when it was packed (the durable path counts
every turn's line early, beside the journal's fsync), and stored with it (schema 8, `m008_piece_tokens`): a
process that shows a piece as an excerpt line, or a page as a block, counts it from stored counts and
cached parts instead of the tokenizer. Every composition is held against the whole count here, for
both encodings, and assembled contexts are counted exactly (test_budget_property, test_assembly_reference)."""

from types import SimpleNamespace

from hypothesis import example, given, settings, strategies as st

from pager import context
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.page import Packer, Turn
from pager.render import Renderer
from pager.store import LanceStore, MemoryStore
from pager.tokens import get_tokenizer, tail_start

ENCODINGS = st.sampled_from(["cl100k_base", "o200k_base"])
# what sits where the counts are joined: letters and contractions, digits, ASCII and other punctuation,
# combining marks, whitespace of every kind, o200k's "/" after punctuation and newlines
TRICKY = [" ", "  ", "\n", "\t", "\r", "\xa0", "\u3000", ".", "!", "?", "...", "'", "'s", "'ll", "’", "/", "//", "-", "·",
          ")", "(", "]", ":", ",", "\u0301", "2023", "7", "Maya", "MAYA", "McDonald", "é", "Ünï", "🙂", "x", "said"]
alphabet = st.one_of(st.characters(codec="utf-8", exclude_categories=["Cs"]), st.sampled_from(TRICKY))
texts = st.lists(alphabet, min_size=1, max_size=40).map("".join)


@settings(max_examples=600, deadline=None)
@given(text=texts, suffix=st.sampled_from(["\n\n", "\n", " ", "\t", "\n\n[p4", "\nMaya: hi", "]", "s", "'s", "1"]),
       encoding=ENCODINGS)
@example(text="we saw it", suffix="\n/x", encoding="o200k_base")
@example(text="it'", suffix="\ns", encoding="o200k_base")
def test_a_text_counts_with_a_suffix_from_its_closing_punctuation(text, suffix, encoding):
    """count_extended with a suffix starting with whitespace counts from the text's closing punctuation
    (tail_start) where it may: the result is the whole count, for any text and suffix."""
    tokenizer = get_tokenizer(encoding)
    for t in (text, "Maya: " + text + ".", text + "!?", text + "x"):
        assert tokenizer.count_extended(t, tokenizer.count(t), suffix) == tokenizer.count(t + suffix), (t, suffix)


def test_the_closing_punctuation_is_taken_only_after_a_letter_or_digit_and_before_whitespace():
    assert tail_start("he said so.", "\n\n") == len("he said so")
    assert tail_start("he said so", "\n") == len("he said so")
    assert tail_start("in 2023?!", "\n") == len("in 2023")
    assert tail_start("he said so.", "]") == -1            # a suffix that may join the punctuation run's neighbours
    assert tail_start("rock'", "\n") == -1                  # an apostrophe may start a contraction
    assert tail_start("so .", "\n") == -1                    # a space before the punctuation joins it
    assert tail_start("café.", "\n") == -1                   # not an ASCII letter


@settings(max_examples=600, deadline=None)
@given(text=texts, encoding=ENCODINGS)
@example(text="Maya's", encoding="o200k_base")
@example(text="McDonald: yes", encoding="o200k_base")
def test_a_text_after_a_space_counts_from_its_own_count(text, encoding):
    """count_spaced: where it answers, " " + text counts what it says."""
    tokenizer = get_tokenizer(encoding)
    for t in (text, "Maya: " + text, "Jo" + text, "ABC" + text):
        spaced = tokenizer.count_spaced(t, tokenizer.count(t))
        assert spaced is None or spaced == tokenizer.count(" " + t), repr(t)
    assert tokenizer.count_spaced("Maya: we met", tokenizer.count("Maya: we met")) is not None


@settings(max_examples=500, deadline=None)
@given(n=st.integers(min_value=1, max_value=10**8),
       date=st.one_of(st.just(""), st.sampled_from(["8 May 2023", "12 December 1999", "2023-05-08", "May", "x."]), texts),
       text=st.one_of(texts, st.builds(lambda s, t: f"{s}: {t}", st.sampled_from(["Maya", "Sam", "DJ", "Jo-Ann", "Ōe"]), texts)),
       encoding=ENCODINGS)
def test_an_excerpt_line_counts_as_its_parts(n, date, text, encoding):
    """Renderer.excerpt_counted: wherever it keeps a count for an excerpt line, that count is the line's."""
    tokenizer = get_tokenizer(encoding)
    render = Renderer(SimpleNamespace(tokenizer=tokenizer, packer=SimpleNamespace(tokenizer=tokenizer)))
    line = f"- p{n}{' · ' + date if date else ''} · {text}"
    render.excerpt_counted(line, n, date, text, tokenizer.count(text))
    kept = render.known_lines().get(line)
    assert kept is None or kept == tokenizer.count(line), (line, kept)


def test_an_excerpt_line_is_not_counted_from_a_count_of_another_tokenizer():
    cl, o2 = get_tokenizer("cl100k_base"), get_tokenizer("o200k_base")
    render = Renderer(SimpleNamespace(tokenizer=cl, packer=SimpleNamespace(tokenizer=o2)))
    render.excerpt_counted("- p4 · Maya: hello there", 4, "", "Maya: hello there", o2.count("Maya: hello there"))
    assert render.known_lines() == {}


turns = st.lists(st.tuples(st.sampled_from(["Maya", "Sam", "/x", "Ōe"]), texts.filter(str.strip),
                           st.sampled_from(["", "8 May 2023", "9 May 2023"]), st.booleans()), min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(turns=turns, page_tokens=st.sampled_from([24, 48, 96]), encoding=ENCODINGS)
def test_a_sealed_page_carries_the_exact_count_of_each_piece_it_counted(turns, page_tokens, encoding):
    """Packer: a piece's stored count is its text's count, or -1; given the early counts, every whole
    turn on a page is counted."""
    tokenizer = get_tokenizer(encoding)
    packer = Packer("s", tokenizer, page_tokens)
    pages = []
    for n, (speaker, text, date, known) in enumerate(turns, 1):
        line = tokenizer.count(f"{speaker}: {text}") if known else None
        pages += packer.add(Turn("s", n, speaker, text, date=date), line_tokens=line)
    if packer.pieces:
        pages.append(packer.seal())
    for page in pages:
        assert len(page.piece_tokens) in (0, len(page.spans))
        for i, (turn, start, end) in enumerate(page.spans):
            own = page.piece_count(i)
            assert own == -1 or own == tokenizer.count(page.piece_text(i))
            whole = start == 0 and end == len(turns[turn - 1][1])
            if whole and turns[turn - 1][3]:
                assert own >= 0


def _long_session(home, name="days"):
    from pager.bench.scale import NAMES, TextGenerator

    s = home.open(name)
    texts = TextGenerator(3).turns(400)
    for i in range(0, len(texts), 100):   # appends of 100: each turn's line counted early, beside the fsync
        s.append_many([{"speaker": NAMES[j % len(NAMES)], "text": t} for j, t in enumerate(texts[i:i + 100])])
    return s


def test_a_reopened_session_shows_pages_and_excerpts_without_counting_their_text(tmp_path):
    """The counts made at ingest are stored with the pages: a new process shows a page's block and a
    piece's excerpt line without handing their text to the tokenizer (it counts header parts, a
    body's closing punctuation with the separator, a speaker's name after a space, and nothing of
    what was said), and the context it assembles counts what a count of the whole says."""
    config = Config(home=tmp_path / "h", embedder="hash", budget=2048, page_tokens=128)
    with Home(config, embedder=HashEmbedder()) as home:
        _long_session(home)
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("days")
        assert s.pages and all(len(p.piece_tokens) == len(p.spans) for p in s.pages.values())
        assert all(c == s.tokenizer.count(p.piece_text(i)) for p in s.pages.values() for i, c in enumerate(p.piece_tokens))
        counted: list[str] = []
        real = s.tokenizer.count
        s.tokenizer.count = lambda text: counted.append(text) or real(text)   # type: ignore[method-assign]
        try:
            shown = []
            for question in ("what did Maya say about the harbor budget?", "when was the kitchen finished?",
                             "who talked about the garden and the river?"):
                ctx = context.build(s, question, prefix="You are a helpful assistant.")
                shown.append(ctx)
        finally:
            del s.tokenizer.count
        assert any(ctx.excerpts for ctx in shown), "the leftover showed no excerpt: the test shows nothing"
        said = [p.piece_text(i).split(": ", 1)[1] for p in s.pages.values() for i in range(len(p.spans))]
        heard = [t for t in counted if len(t) > 40]   # the message, the prefix: not what a page says
        for ctx in shown:
            assert ctx.tokens["memory"] == real(ctx.memory) and ctx.tokens["total"] == \
                sum(4 + real(m["content"]) for m in ctx.messages()) + 3
        for text in said:
            if len(text) > 40:
                assert not any(text in t for t in heard), f"counted the text of a piece: {text[:60]!r}"


def test_a_store_before_schema_8_gains_the_column_by_its_named_step_and_answers_the_same(tmp_path):
    """m008_piece_tokens: a store written before pages carried their pieces' counts opens with a notice;
    its pages read with none (counted when shown, as before) and answer as the same store with them;
    pages sealed after it carry theirs."""
    import shutil

    question = "what did Maya say about the harbor budget?"
    made = Config(home=tmp_path / "made", embedder="hash", budget=2048, page_tokens=128)
    with Home(made, embedder=HashEmbedder()) as home:
        _long_session(home)
    shutil.copytree(tmp_path / "made", tmp_path / "old")
    old = Config(home=tmp_path / "old", embedder="hash", budget=2048, page_tokens=128)
    store = LanceStore(str(old.db_uri), dim=HashEmbedder().dim)   # as schema 7 left it: no column, no record
    store._tables["pages"].drop_columns(["piece_tokens"])
    store._tables["meta"].delete("key = 'migration:m008_piece_tokens'")
    store._tables["meta"].update(where="key = 'schema'", values={"value": "7"})
    store.close()
    with Home(made, embedder=HashEmbedder()) as home:
        expected = context.build(home.open("days"), question)
    with Home(old, embedder=HashEmbedder()) as home:
        s = home.open("days")
        assert any("m008_piece_tokens" in w for w in home.warnings), home.warnings
        pages = len(s.pages)
        assert pages and all(p.piece_tokens == () for p in s.pages.values())
        ctx = context.build(s, question)
        assert (ctx.memory, ctx.tokens, ctx.excerpts) == (expected.memory, expected.tokens, expected.excerpts)
        s.append_many([{"speaker": "Maya", "text": f"a new turn number {i} about the harbor."} for i in range(60)])
    with Home(old, embedder=HashEmbedder()) as home:
        s = home.open("days")
        assert not home.warnings   # migrated once
        assert len(s.pages) > pages and all(p.piece_tokens for n, p in s.pages.items() if n > pages)


def test_a_memory_store_keeps_the_counts_it_is_given():
    store = MemoryStore()
    tokenizer = get_tokenizer()
    packer = Packer("s", tokenizer, 64)
    packer.add(Turn("s", 1, "Maya", "hello there"), line_tokens=tokenizer.count("Maya: hello there"))
    page = packer.seal()
    from pager.store import Batch
    import numpy as np

    store.put(Batch(pages=[page], vectors=[np.zeros((1, 256), dtype=np.float32)]))
    assert store.pages("", "s")[0][0].piece_tokens == (tokenizer.count("Maya: hello there"),)


def test_two_homes_migrating_one_object_store_at_once_both_open_and_answer_the_same(tmp_path, s3):
    """m008 on the local S3 server, raced: two homes open a schema-7 store at the same time (each in its
    own thread, LanceDB's native calls without the GIL), both get the column and answer the same."""
    import threading

    env, uri = s3

    def config(name):
        return Config.load(env={**env, "PAGER_EMBEDDER": "hash"}, home=tmp_path / name, db=uri, budget=2048)

    with Home(config("made"), embedder=HashEmbedder()) as home:
        _long_session(home)
    made = config("made")
    store = LanceStore(made.db_uri, dim=HashEmbedder().dim, storage_options=made.storage_options)
    store._tables["pages"].drop_columns(["piece_tokens"])   # as schema 7 left it
    store._tables["meta"].delete("key = 'migration:m008_piece_tokens'")
    store._tables["meta"].update(where="key = 'schema'", values={"value": "7"})
    store.close()
    question = "what did Maya say about the harbor budget?"
    ready, answers, failures = threading.Barrier(2), {}, []

    def open_and_ask(name):
        try:
            ready.wait()
            with Home(config(name), embedder=HashEmbedder()) as home:
                answers[name] = context.build(home.open("days"), question).memory
        except Exception as exc:  # noqa: BLE001 - the test reports it
            failures.append(f"{name}: {exc!r}")

    threads = [threading.Thread(target=open_and_ask, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert answers["a"] == answers["b"]
    store = LanceStore(made.db_uri, dim=HashEmbedder().dim, storage_options=made.storage_options)
    assert "piece_tokens" in store._tables["pages"].schema.names
    applied = store._tables["meta"].search().where("key = 'migration:m008_piece_tokens'").to_list()
    assert len(applied) >= 1
    store.close()
