"""Record a trace of a session with the offline agent: a conversation ingested, then questions.

Used for the LoCoMo policy comparison (`pager bench trace`) and to make the sample traces and
the demo's bundled trace. Everything runs offline through the real loop, so the trace
replays with `pager replay --check`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterable

from ..agent import Agent
from ..config import Config
from ..home import Home
from ..model import HandlerModel, Model
from ..offline import OfflineShell
from ..store import MemoryStore
from ..trace import TraceWriter, begin, end


def record(out: Path, messages: list[dict], questions: Iterable[str], config: Config, note: str,
           model: Model | None = None, setup=None, chunk: int = 64, writer=None) -> dict:
    """Ingest messages in chunks, run setup(session, agent) if given, then ask each question.
    writer: a bookmark or memory writer (its answers are recorded; replay calls no model)."""
    model = model or HandlerModel(OfflineShell())
    out = Path(out)
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="pager-record-") as folder:
        home = Home(config.with_(home=Path(folder)), store=MemoryStore(), durable=False, writer=writer)
        session = home.open()
        writer = TraceWriter(out, note=note)
        session.events.listeners.append(writer)
        agent = Agent(session, model)
        begin(session, model.name, agent.budget)
        for i in range(0, len(messages), chunk):
            session.append_many(messages[i : i + chunk])
        if setup:
            setup(session, agent)
        for question in questions:
            agent.ask(question)
        end(session)
        writer.close()
        home.journal.close(remove=True)
        return dict(session.counters)
