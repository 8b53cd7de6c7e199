"""Sessions and users are namespaces: hostile ids read nothing of another session."""

from conftest import say
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home


def test_quoted_session_id_reads_nothing_of_another(tmp_path):
    cfg = Config(home=tmp_path / "h", page_tokens=128, embedder="hash")
    with Home(cfg, embedder=HashEmbedder()) as home:
        victim = home.open("alice-private")
        victim.append("alice", "my bank PIN is 4711 and my passport number is X99")
        say(victim, 60)
    for hostile in ["s3' OR '1'='1", "alice-private' --", "%", "*", "alice-private\" OR 1=1", "../alice-private"]:
        with Home(cfg, embedder=HashEmbedder()) as home:
            s = home.open(hostile)
            assert s.turn_count == 0 and not s.pages
            assert s.search("bank PIN passport", k=5) == []
            assert home.store.turns("", hostile) == []
    with Home(cfg, embedder=HashEmbedder()) as home:
        assert home.open("alice-private").turn_count == 61


def test_users_are_namespaces(tmp_path):
    cfg = Config(home=tmp_path / "h", page_tokens=128, embedder="hash")
    with Home(cfg, embedder=HashEmbedder()) as home:
        home.open("default", user="ann").append("ann", "ann's secret garden")
        home.open("default", user="bob").append("bob", "bob's bicycle")
    with Home(cfg, embedder=HashEmbedder()) as home:
        ann, bob = home.open("default", user="ann"), home.open("default", user="bob")
        assert [t.text for t in home.store.turns("ann", "default")] == ["ann's secret garden"]
        assert [t.text for t in home.store.turns("bob", "default")] == ["bob's bicycle"]
        assert ann.turn_count == bob.turn_count == 1
