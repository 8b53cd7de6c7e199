"""The working state: one key at a time, durable through the one write path, seen by other
processes, recovered after a crash, kept in the store with every change, always in the prompt."""

import json

import pytest
from typer.testing import CliRunner

from pager import journal
from pager.cli.app import app
from pager.config import Config
from pager.context import build
from pager.embed import HashEmbedder
from pager.errors import InputError
from pager.home import Home
from pager.state import parse_statements
from pager.tools import MODEL

from conftest import say

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


def test_set_replace_and_unset_keep_every_change(mem_home):
    s = mem_home.open("st")
    say(s, 3)
    assert "set to 'Paris'" in MODEL.call(s, "state_set", {"key": "My home city", "value": "Paris"})
    say(s, 20, start=3)
    MODEL.call(s, "state_set", {"key": "home city", "value": "Berlin"})
    assert "nothing changed" in MODEL.call(s, "state_set", {"key": "home city", "value": "Berlin"})
    MODEL.call(s, "state_set", {"key": "dose", "value": "5 mg"})
    MODEL.call(s, "state_unset", {"key": "dose"})
    assert s.state.values() == {"home city": "Berlin"}
    paris, berlin = s.state.history("home city")
    assert (paris.value, berlin.value) == ("Paris", "Berlin") and paris.page < berlin.page
    assert [c.unset for c in s.state.history("dose")] == [False, True]
    assert [c.seq for c in s.state.changes] == [1, 2, 3, 4]
    assert [c.value for c in s.state.find("where is the home city?")] == ["Berlin", "Paris"]
    assert "no key 'weight'" in MODEL.call(s, "state_unset", {"key": "weight"})
    assert "at most" in MODEL.call(s, "state_set", {"key": "note", "value": "x" * 500})
    with pytest.raises(InputError, match="needs a word"):
        s.set_state("  ", "x")


def test_changes_are_durable_seen_by_another_process_and_reloaded(config):
    a = Home(config, embedder=HashEmbedder())
    b = Home(config, embedder=HashEmbedder())
    sa, sb = a.open("st"), b.open("st")
    say(sa, 4)
    sa.set_state("deadline", "14 March")
    sb.sync()
    assert sb.state.values() == {"deadline": "14 March"}
    change = sb.set_state("deadline", "21 March")  # numbered after the other process's change
    assert change.seq == 2 and change.turn == 4
    sa.set_state("order id", "A-17")
    assert sa.state.values() == {"deadline": "21 March", "order id": "A-17"}
    b.close()
    a.close()
    with Home(config, embedder=HashEmbedder()) as c:
        s = c.open("st")
        assert s.state.values() == {"deadline": "21 March", "order id": "A-17"}
        assert [x.value for x in s.state.history("deadline")] == ["14 March", "21 March"]
        assert [x.seq for x in c.store.state_changes("", "st")] == [1, 2, 3]


def test_a_dead_process_state_changes_are_recovered(config):
    dead = Home(config, embedder=HashEmbedder())
    s = dead.open("st")
    say(s, 2)
    s.set_state("medication dose", "10 mg")
    s.set_state("medication dose", None)
    s.set_state("medication dose", "20 mg")
    dead.journal.close(remove=False)  # killed: nothing flushed, the segment stays
    dead.leases.stop()   # and its lease thread dies with it
    with Home(config, embedder=HashEmbedder()) as home:
        assert home.recovered == 2
        assert home.open("st").state.values() == {"medication dose": "20 mg"}
        assert [c.unset for c in home.store.state_changes("", "st")] == [False, True, False]


def test_the_journal_refuses_malformed_state_ops(tmp_path):
    good = {"op": "state", "user": "", "session": "s", "seq": 1, "key": "city", "value": "Oslo", "unset": False,
            "page": 1, "turn": 1, "ts": 0.0, "source": "model"}
    assert journal.valid(good) == ""
    assert journal.valid({**good, "seq": 0})
    assert journal.valid({**good, "value": ""})               # a set needs a value
    assert journal.valid({**good, "unset": True})             # an unset carries none
    assert journal.valid({**good, "key": 3})
    path = tmp_path / "x.wal"
    path.write_bytes(journal.frame([good, {**good, "seq": -1}]))
    read = journal.read_segment(path, final=True)
    assert [op["seq"] for op in read.ops] == [1] and len(read.damage) == 1


def test_the_state_region_comes_before_the_pages_and_is_counted(mem_home):
    s = mem_home.open("st")
    say(s, 60)
    s.set_state("home city", "Berlin")
    ctx = build(s, "where do I live?", chat=False)
    head, _, rest = ctx.memory.partition("[state")
    assert "[p" not in head and "- home city: Berlin (p" in rest
    assert rest.index("home city") < rest.index("[p")
    assert ctx.tokens["state"] == s.tokenizer.count(ctx.memory.split("\n\n")[1] + "\n\n")
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 2048


def test_a_state_too_large_for_its_share_shows_the_newest_keys(mem_home):
    s = mem_home.open("st")
    say(s, 5)
    for i in range(40):
        s.set_state(f"key {i}", f"value number {i} " + "word " * 20)
    ctx = build(s, "anything", chat=False)
    assert ctx.tokens["state"] <= 0.15 * 2048
    assert "key 39:" in ctx.memory and "key 0:" not in ctx.memory and "older keys not shown" in ctx.memory


def test_inspect_json_has_the_state(tmp_path):
    home = tmp_path / "h"
    env = {"PAGER_HOME": str(home), "PAGER_EMBEDDER": "hash"}
    runner = CliRunner()
    with Home(Config(home=home, embedder="hash"), embedder=HashEmbedder()) as h:
        s = h.open("default")
        say(s, 3)
        s.set_state("home city", "Berlin")
        tail = f"p{s.tail_n}"
    out = runner.invoke(app, ["inspect", "--json"], env=env)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["state"]["home city"]["value"] == "Berlin" and data["state"]["home city"]["page"] == tail


@pytest.mark.parametrize("text, expected", [
    ("My home city is Berlin.", [("home city", "Berlin")]),
    ("my dose is now 20 mg", [("dose", "20 mg")]),
    ("Remember: the project deadline is 21 March", [("project deadline", "21 March")]),
    ("remember that my locker code is 4471", [("locker code", "4471")]),
    ("Order id: A-1734\nProduct: standing desk", [("order id", "A-1734"), ("product", "standing desk")]),
    ("What is my home city?", []),
    ("My home city is not Paris", []),
    ("I think my dose is 20 mg", []),
    ("My sister was in Berlin", []),
    ("It is raining and my umbrella is somewhere in the car, I guess, or at the office near the station", []),
    ("Note: call the bank", []),
    ("We moved the meeting to Friday because the room was taken", []),
    ("my favourite thing about the trip was the food", []),
    ("My dog's name is Biscuit and she is a beagle.", [("dog's name", "Biscuit")]),
    ("My address is 12 Main St, and I moved in in May", [("address", "12 Main St")]),
    ("My favourite band is Simon and Garfunkel", [("favourite band", "Simon and Garfunkel")]),
    ("My sister is visiting next week from Lisbon.", []),
    ("My brother is moving to Oslo in June", []),
    ("My address is King Street 12", [("address", "King Street 12")]),
    ("My hobby is painting", [("hobby", "painting")]),
])
def test_the_offline_parser_takes_only_plain_statements(text, expected):
    assert parse_statements(text) == expected


def test_the_offline_shell_keeps_stated_values_and_answers_from_the_state_and_its_history(tmp_path):
    from pager.replay import replay

    home = tmp_path / "h"
    script = ("My home city is Paris.\nRemember: the project deadline is 14 March\n"
              + "".join(f"Small talk number {i} about the weather and lunch.\n" for i in range(40))
              + "My home city is now Berlin.\n/state never set\n/state\n/state home city\nWhat is my home city?\n"
              "What was my home city before?\n/quit\n")
    result = CliRunner().invoke(app, ["--home", str(home), "chat", "-s", "moves", "--budget", "2048"], input=script,
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 0, result.output
    assert "kept in the working state: state 'home city' set to 'Paris'" in " ".join(result.output.split())
    output = " ".join(result.output.split())  # rich wraps long lines
    now, before = output.split("you> What is my home city?")[-1].split("you> What was my home city before?")
    assert "From the state" in now and "Berlin" in now and "Paris" not in now
    assert "home city: Berlin" in before and "before: Paris (p1, change 1)" in before
    assert "the state has no key 'never set'; its keys: home city, project deadline" in output
    table = result.output.split("/state home city")[-1].split("What is my")[0]
    assert "Paris" in table and "Berlin" in table
    trace = next((home / "traces").glob("moves-*.jsonl"))
    kinds = [json.loads(line)["kind"] for line in trace.read_text().splitlines()]
    assert kinds.count("state") == 3
    assert replay(trace, check=True).divergence is None


@pytest.mark.parametrize("text", ["note 3: the bus timetable changed again on line 3",
                                  "Update: we shipped the release and everyone went home early to celebrate",
                                  "re: lunch tomorrow"])
def test_labelled_lines_that_are_not_values_state_nothing(text):
    assert parse_statements(text) == []


def test_the_offline_shell_answers_from_the_state_only_for_the_key_asked():
    """"What is my cat's name?" shares "name" with the key `dog's name`: the state does not answer it
    (it named the dog's name as the cat's); the key's own words, or its value, do."""
    from pager.offline import OfflineShell

    system = "[state · 2 keys]\n- dog's name: Biscuit (p1, 1 Dec 2026)\n- flight number: LH 402 (p2, 1 Dec 2026)\n"
    shell = OfflineShell()
    assert "the state" not in shell.answer("What is my cat's name?", system)
    assert "the state" not in shell.answer("What is my passport number?", system)
    assert shell.answer("What is my dog's name?", system).startswith("From the state: “dog's name: Biscuit")
    assert shell.answer("Who is Biscuit?", system).startswith("From the state: “dog's name: Biscuit")
    assert shell.answer("Which flight number do I have?", system).startswith("From the state: “flight number")


def test_the_offline_shell_never_quotes_its_own_state_replies_back(tmp_path):
    """A user asked what was noted and got the shell's own "Noted, and kept in the working state"
    reply as the answer: the reply is marked as the shell's, like its other replies."""
    script = "My home city is Paris.\nMy sister is visiting next week from Lisbon.\nWhat did you note?\nWho is visiting?\n"
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "chat", "-s", "own"], input=script,
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    noted, visiting = output.split("you> What did you note?")[1].split("you> Who is visiting?")
    assert "kept in the working state" not in noted.split("pager>")[1], noted
    assert "state 'sister'" not in output                 # a visit is an event, not a value
    assert "My sister is visiting next week from Lisbon" in visiting, visiting


def test_the_offline_shell_lists_the_working_state_when_asked_for_it(tmp_path):
    """"What is in the working state?" named no key, and the shell answered that it found nothing."""
    script = ("What is in the working state?\nMy home city is Paris.\nRemember: the project deadline is 14 March\n"
              "What is in the working state?\nWhat is the capital of the working week?\n")
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "chat", "-s", "st"], input=script,
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    empty, full = output.split("you> What is in the working state?")[1:3]
    assert "The working state is empty" in empty
    full = full.split("you>")[0]
    assert "The working state holds:" in full and "home city: Paris" in full and "project deadline: 14 March" in full
    assert "working state holds" not in output.split("you> What is the capital of the working week?")[1]
