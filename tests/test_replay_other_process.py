"""A chat's trace replays exactly when another process wrote to the session while a message was
being answered: its turns (and state) are taken in by the session's sync inside the answer, and
replay feeds them at that same point, not after the answer; and when its trace began after another
process had flushed turns, or while another live process held turns only in its journal."""

from pager.agent import Agent
from pager.embed import HashEmbedder
from pager.home import Home
from pager.model import HandlerModel
from pager.offline import OfflineShell
from pager.replay import replay
from pager.summaries import Draft
from pager.trace import TraceWriter, begin

from conftest import say


class Interrupted(HandlerModel):
    """The offline shell; on chosen calls another process writes to the session first."""

    def __init__(self, writes):
        super().__init__(OfflineShell())
        self.writes, self.calls = writes, 0

    def complete(self, messages, tools):
        self.calls += 1
        self.writes.get(self.calls, lambda: None)()
        return super().complete(messages, tools)


def test_a_trace_replays_with_another_process_writing_during_answers(config, tmp_path):
    a, b = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    sa, sb = a.open("dual"), b.open("dual")
    say(sa, 6)
    sb.sync()

    def other_writes():
        say(sb, 2, start=100)
        sb.set_state("deadline", "21 March")

    model = Interrupted({1: other_writes})
    writer = TraceWriter(tmp_path / "a.jsonl")
    sa.events.listeners.append(writer)
    agent = Agent(sa, model)
    begin(sa, "pager/offline", agent.budget)
    say(sb, 2, start=200)          # before the first message: taken in as it appends the question
    agent.ask("what does turn 3 say?")
    agent.ask("and turn 101?")     # the model's first call wrote turns 100-101 and a state change

    def other_summarizes(event):   # while this process's producer writes, the other one does too
        if event.kind == "summaries_written" and not sb.summaries.items:
            say(sb, 1, start=300)
            sb.add_summaries([Draft("episode", "e1", "the other process's summary", (1, 4), None)], "other")

    sa.events.listeners.append(other_summarizes)
    ours = sa.add_summaries([Draft("episode", "e5", "our summary", (5, 6), None)], "extractive")
    assert [x.n for x in ours] == [2]   # numbered after the other process's summary, taken in first
    writer.close()
    kinds = [(e["kind"], e.get("origin")) for e in map(__import__("json").loads, open(writer.path))]
    assert kinds.count(("append", "other process")) == 3, kinds   # the recording took both in mid-answer
    assert sa.state.values() == {"deadline": "21 March"}

    run = replay(writer.path, check=True)
    assert run.divergence is None, run.divergence
    b.close()
    a.close()


def test_a_trace_begun_after_another_process_flushed_replays(config, tmp_path):
    """Three `pager chat` processes started at once on one session: one opened the session at 6 turns,
    another flushed 4 more to the store before the first's trace began. The trace's snapshot was read
    from the store (10 turns) while its session held 6 and took the other 4 in at its first message (an
    `append` from another process): replay loaded the 4 twice and `pager replay --check` failed at the
    first turn. The snapshot now holds what the session held when its trace began."""
    a, b = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    sb = b.open("shared")
    say(sb, 6)
    sa = a.open("shared")          # takes b's 6 turns in from b's journal, sealing pages b has not stored
    say(sb, 4, start=100)
    b.close()                      # the other process ends: its turns are in the store
    assert sa.turn_count == 6 and sa.pending.pages
    writer = TraceWriter(tmp_path / "a.jsonl")
    sa.events.listeners.append(writer)
    agent = Agent(sa, HandlerModel(OfflineShell()))
    begin(sa, "pager/offline", agent.budget)
    agent.ask("what does turn 101 say?")
    writer.close()
    run = replay(writer.path, check=True)
    assert run.divergence is None, run.divergence.describe()
    a.close()


def test_a_trace_begun_holding_another_live_processs_unflushed_turns_replays(config, tmp_path):
    """The other way round: the session took in turns another live process had only in its journal, so
    the snapshot read from the store lacked them (0 turns for a session of 4) and replay numbered the
    next turn 1 where the recording had 5."""
    a, b = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    sb = b.open("shared")
    say(sb, 4)
    sa = a.open("shared")          # takes b's turns in from b's journal: b has flushed nothing
    assert sa.turn_count == 4
    writer = TraceWriter(tmp_path / "a.jsonl")
    sa.events.listeners.append(writer)
    agent = Agent(sa, HandlerModel(OfflineShell()))
    begin(sa, "pager/offline", agent.budget)
    say(sb, 2, start=100)
    agent.ask("what does turn 2 say?")
    writer.close()
    run = replay(writer.path, check=True)
    assert run.divergence is None, run.divergence.describe()
    b.close()
    a.close()
