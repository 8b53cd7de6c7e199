"""What an outside tester found running pager as a newcomer would: several `pager chat` processes on
one session with readers in between, `pager serve` options given as a user might type them."""

import pytest

from typer.testing import CliRunner

from pager.agent import Agent
from pager.cli.app import app
from pager.embed import HashEmbedder
from pager.home import Home
from pager.model import HandlerModel
from pager.offline import OfflineShell
from pager.replay import replay
from pager.trace import TraceWriter, begin

from conftest import say


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


@pytest.mark.parametrize("flag, value", [("--max-body", "0"), ("--max-body", "-1"), ("--max-messages", "0"),
                                         ("--max-messages", "-5"), ("--timeout", "0"), ("--timeout", "-1")])
def test_serve_limits_that_would_refuse_every_request_are_refused_at_start(tmp_path, monkeypatch, flag, value):
    """`pager serve --max-body 0` (or -1) died with a traceback from the MCP library; --max-messages 0
    served, then refused every chat request, --timeout 0 answered every turn 504. Each is one line at
    start naming the flag, and nothing listens."""
    import pager.serve

    def listens(*args, **kwargs):
        raise AssertionError("pager serve started")

    monkeypatch.setattr(pager.serve, "serve", listens)   # were the limits taken, the test ends here, not serving
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "serve", "--port", "0", flag, value],
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit) and flag in result.output, (result.output, result.exception)
