"""One home, two stores (--db): two independent memories. The journal and the locks belong to one
store, so turns are numbered from that store's own last turn, nothing is reported as damage, and a
dead process's journal is recovered into the store it was written for."""

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.journal import frame

from conftest import ENV, _app, _cli


def pager(home, *args, text=""):
    result = _cli().invoke(_app(), ["--home", str(home), *args], input=text, env=ENV)
    return result.exit_code, result.output


def chat(home, line, *db):
    code, output = pager(home, *db, "chat", "-s", "s", text=f"{line}\n/quit\n")
    assert code == 0, output
    return output


def test_a_chat_on_another_store_leaves_the_home_store_whole(tmp_path, caplog):
    home, other = tmp_path / "h", tmp_path / "h" / "other"
    chat(home, "a")
    chat(home, "b", "--db", str(other))   # the bug: "turn 1 … is in no journal and not in the store"
    chat(home, "c")
    # about this session or a journal (a lease thread another test left running may speak meanwhile)
    assert not [r.message for r in caplog.records if r.levelname == "WARNING" and ("'s'" in r.message or "journal" in r.message)]
    for db in ([], ["--db", str(other)]):
        code, output = pager(home, *db, "check", "-s", "s")
        assert code == 0 and "PROBLEMS" not in output, output
    config = Config(home=home, embedder="hash")
    with Home(config, read_only=True) as h, Home(config.with_(db=str(other)), read_only=True) as o:
        mine = [(t.turn, t.text) for t in h.store.turns("", "s")]
        theirs = [(t.turn, t.text) for t in o.store.turns("", "s")]
    assert [n for n, _ in mine] == list(range(1, len(mine) + 1)) and [t for _, t in mine if t in "abc"] == ["a", "c"]
    assert [n for n, _ in theirs] == list(range(1, len(theirs) + 1)) and [t for _, t in theirs if t in "abc"] == ["b"]


def _killed(config, text):
    """A process that acknowledged a turn and died before any flush."""
    dead = Home(config, embedder=HashEmbedder())
    dead.open("s").append("ann", text)
    dead.journal.close(remove=False)
    dead.leases.stop()   # and its lease thread dies with it
    dead.leases.stop()


def _texts(config):
    with Home(config, embedder=HashEmbedder()) as home:
        return [t.text for t in home.store.turns("", "s")]   # recovery ends with a flush


def test_a_dead_process_is_recovered_into_its_own_store(tmp_path):
    config = Config(home=tmp_path / "h", budget=1024, embedder="hash")
    other = config.with_(db=str(tmp_path / "elsewhere"))
    _killed(other, "meant for the other store")
    _killed(config, "meant for the home store")
    assert _texts(config) == ["meant for the home store"]        # the other store's journal is left alone
    assert _texts(other) == ["meant for the other store"]
    assert _texts(config.with_(db=str(tmp_path / "h" / "db"))) == ["meant for the home store"]  # the same store


def test_an_older_pagers_journal_is_recovered_by_the_first_process(tmp_path):
    """Before stores/, every store's journal was <home>/journal; its segments do not say their store."""
    config = Config(home=tmp_path / "h", budget=1024, embedder="hash", db=str(tmp_path / "s3-stand-in"))
    folder = tmp_path / "h" / "journal"
    folder.mkdir(parents=True)
    op = {"op": "turn", "user": "", "session": "s", "turn": 1, "speaker": "ann", "text": "from an older pager",
          "role": "user", "date": "", "ts": 1.0, "ref": ""}
    (folder / "00000000000000000001-4242-abcdef.wal").write_bytes(frame([op]))
    assert _texts(config) == ["from an older pager"]
    assert not list(folder.glob("*.wal"))
