"""Writes the sample traces in traces/ and the demo's bundled trace (pager/data/demo_trace.jsonl).

Each trace pins one behaviour and opens with a note saying which. No real model was involved
in any of them: replies come from the offline memory shell or from a script, as each note
says. `python -m pager.data.sample_traces [FOLDER]` rewrites them; the tests replay every one
with --check, so a change in the engine that alters a paging decision shows up there.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ..bench.record import record
from ..config import Config
from ..formats import parse_jsonl
from ..memory import MemoryWriter
from ..model import HandlerModel
from ..offline import Script
from .demo_script import QUESTIONS

HERE = Path(__file__).parent


def conversation() -> list[dict]:
    return parse_jsonl(HERE / "demo_conversation.jsonl", "demo")["demo"]


def _call(name: str, arguments: str, id: str) -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


class ScriptedMemory:
    """A memory model written as a script (no LLM): it knows what a few sentences say, and decides
    ADD, UPDATE or INVALIDATE against the facts its prompt shows with their ids, as a real one would."""

    KNOWN = [("home city is Paris", "home city", "Maya lives in Paris.", "Paris"),
             ("deadline is 14 March", "project deadline", "The project deadline is 14 March.", "14 March"),
             ("dose is 10 mg", "medication dose", "Maya takes 10 mg of her medication.", "10 mg"),
             ("home city is now Berlin", "home city", "Maya moved to Berlin.", "Berlin"),
             ("deadline is now 21 March", "project deadline", "The project deadline moved to 21 March.", "21 March"),
             ("stopped taking the medication", "medication dose", "Maya stopped taking the medication.", None)]

    def __call__(self, messages: list[dict], tools: list[dict]) -> dict:
        prompt = messages[-1]["content"]
        shown = {subject: fid for fid, subject in re.findall(r"^- (f\d+) \[([^\]]+)\]", prompt, re.M)}
        facts, state = [], []
        for turn, line in re.findall(r"^\(t(\d+)\) (?:Maya|user): (.*)$", prompt, re.M):
            for phrase, subject, text, value in self.KNOWN:
                if phrase not in line:
                    continue
                if value is None:
                    facts.append({"op": "INVALIDATE", "id": shown.get(subject, "?"), "text": text, "turns": [int(turn)]})
                    state.append({"op": "unset", "key": subject})
                else:
                    op = {"op": "UPDATE", "id": shown[subject]} if subject in shown else {"op": "ADD", "subject": subject}
                    facts.append({**op, "text": text, "turns": [int(turn)]})
                    state.append({"op": "set", "key": subject, "value": value})
        marks = {pid: {"keywords": ["check-in"], "note": "a check-in"} for pid in re.findall(r"^\[(p\d+)", prompt, re.M)}
        return {"content": json.dumps({"bookmarks": marks, "facts": facts, "state": state})}


def make(folder: Path) -> dict[str, dict]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    talk = conversation()
    out = {}
    out["eviction_under_pressure"] = record(
        folder / "eviction_under_pressure.jsonl", talk, ["What did we decide about the sync engine?"],
        Config(budget=1536, session="pressure"),
        "Eviction under pressure: 390 turns pass through a 1536-token prompt (5 frames), so sealing pages "
        "evicts by CLOCK all along; the question then faults the sync-engine pages in, evicting others, and "
        "the memory map carries the pressure notice. Replies: the offline memory shell (no LLM).")
    out["fault_after_long_gap"] = record(
        folder / "fault_after_long_gap.jsonl", talk, ["Sam is joining the team dinner. Anything the restaurant should know?"],
        Config(budget=3072, session="gap"),
        "A fault after a long gap: the allergy is said in week 3, then 370 turns go by; the question faults "
        "that page (p5) back in by automatic paging and the shell quotes it. Replies: the offline memory "
        "shell (no LLM).")

    def pin_first_fact(session, agent) -> None:
        session.emit("command", line="/pin p3")  # as the REPL records a slash command
        session.pin(3)
        more = [{"speaker": "Maya", "text": f"Another busy day, item {i}: reviews, standup, deploys."} for i in range(120)]
        session.append_many(more)

    out["pinned_fact_survives"] = record(
        folder / "pinned_fact_survives.jsonl", talk[:30], ["What is my name again?", "Where is the offsite?"],
        Config(budget=1536, session="pinned"),
        "A pinned fact survives: p3 (Maya's name and role) is pinned with /pin, then 120 more turns and two "
        "questions churn the frames; p3 is never evicted. Replies: the offline memory shell (no LLM).",
        setup=pin_first_fact)
    script = Script([
        {"content": None, "tool_calls": [_call("page_in", "{page: p5", "c1")]},
        {"content": None, "tool_calls": [_call("page_in", '{"page": "p4040"}', "c2"),
                                         _call("format_disk", "{}", "c3")]},
        {"content": None, "tool_calls": [_call("search", '{"query": "peanut allergy", "k": "three"}', "c4")]},
        {"content": None, "tool_calls": [_call("search", '{"query": "peanut allergy"}', "c5")]},
        {"content": "Sam Okafor has a severe peanut allergy (p5)."},
    ])
    out["malformed_tool_call"] = record(
        folder / "malformed_tool_call.jsonl", talk, ["Does anyone on the team have an allergy?"],
        Config(budget=3072, session="malformed"),
        "Malformed tool calls: a scripted model (recorded replies, no LLM) sends invalid JSON, a page that "
        "does not exist, an unknown tool and a mistyped argument; each comes back as a tool result saying "
        "what to do instead, and the session goes on to an answer.",
        model=HandlerModel(script, name="pager/script"))
    questions = [q for q, _ in QUESTIONS] + [QUESTIONS[0][0], QUESTIONS[2][0], "What else happened with the sync engine?"]
    out["clock_vs_lru"] = record(
        folder / "clock_vs_lru.jsonl", talk, questions, Config(budget=3072, session="policies"),
        "CLOCK and LRU differ: nine questions revisit earlier topics, so pages come back while others are "
        "used once; `pager replay --policy all` shows different faults per policy, each against OPT. "
        "Replies: the offline memory shell (no LLM).")
    out["working_state_changes"] = record(
        folder / "working_state_changes.jsonl", talk[:80],
        ["My home city is Paris.", "Remember: the project deadline is 14 March", "My medication dose is 10 mg.",
         "My home city is now Berlin.", "Project deadline: 21 March", "What is my home city?",
         "What was my home city before?", "What is the project deadline?"],
        Config(budget=2048, session="state"),
        "The working state: the offline memory shell keeps plainly stated values with state_set (a move, a "
        "new deadline), the state block sits in every prompt before the pages, the current value answers "
        "and the state's history answers 'before'. Replies: the offline memory shell (no LLM).")
    fillers = [f"Notes for today, item {i}: standup, two reviews and a deploy." for i in range(4)]
    out["memory_model_updates"] = record(
        folder / "memory_model_updates.jsonl", talk[:40],
        ["My home city is Paris.", "The project deadline is 14 March.", "My medication dose is 10 mg.", *fillers,
         "My home city is now Berlin.", "The project deadline is now 21 March.",
         "I stopped taking the medication, the doctor says I am fine.", *fillers,
         "What was my home city before?", "What is the project deadline?"],
        Config(budget=2048, session="memory", memory_model="pager/script-memory", bookmark_batch=2),
        "The memory model: one call per sealed batch of two pages returns bookmarks and memory operations, "
        "decided against the similar facts shown with their ids: ADD the city, deadline and dose, UPDATE "
        "the city and the deadline when they change (the old facts superseded, with their dates), "
        "INVALIDATE the dose when Maya stops the medication (ended, nothing replaces it), and state keys "
        "set and unset. Memory model: a script (no LLM); replies: the offline memory shell. Replay feeds "
        "the recorded answers back (facts_written, state_written) and calls no model.",
        writer=MemoryWriter(HandlerModel(ScriptedMemory(), "pager/script-memory"), 2))
    out["episode_summaries"] = episode_summaries(folder, talk)
    out["live_summaries"] = live_summaries(folder, talk)
    out["demo"] = record(
        HERE / "demo_trace.jsonl", talk, [q for q, _ in QUESTIONS], Config(budget=2048, session="demo"),
        "The demo's session: the bundled conversation under a 2048-token budget and the six demo questions. "
        "Replies: the offline memory shell (no LLM).")
    return out


def episode_summaries(folder: Path, talk: list[dict]) -> dict:
    """The summaries tier: written through the session's own API by the extractive producer (no model),
    so the trace holds its `summaries_written` answer and one `summary` event per summary."""

    def summarize(session, agent) -> None:
        from ..summaries import Extractive

        session.summarize(Extractive())   # what `pager summarize` does

    return record(
        Path(folder) / "episode_summaries.jsonl", talk[:160],
        ["What happened in the first weeks?", "Who is Sam?"], Config(budget=2048, session="summaries"),
        "The summaries tier: 160 turns (the first weekly check-ins), then the extractive producer (no "
        "model: the most central sentences, verbatim) writes one summary per episode and a rolling one, "
        "each a `summary` event (the timeline's summaries lane); then two questions. Replay feeds the "
        "recorded answer back (summaries_written) and runs no producer. "
        "Replies: the offline memory shell (no LLM).", setup=summarize)


LIVE_DAYS = [["What did we decide about the sync engine?", "Remind me who is allergic to peanuts."],
             ["What does Halvorsen need before they sign?", "Note: the offsite moved to Lisbon."],
             ["Where is the offsite now?"]]


def live_summaries(folder: Path, talk: list[dict]) -> dict:
    """Summaries made during a live chat: questions on three days (a clock set a day apart), so each
    day's first message closes the episode before it and the agent loop summarizes it after the reply.
    The demo's talk, ingested before, closed its episodes before the chat: the first reply summarizes them too."""
    import tempfile

    from ..agent import Agent
    from ..home import Home
    from ..offline import OfflineShell
    from ..search import label_time
    from ..store import MemoryStore
    from ..trace import TraceWriter, begin, end

    path = Path(folder) / "live_summaries.jsonl"
    path.unlink(missing_ok=True)
    last = label_time(talk[79]["date"])
    assert last is not None, "the demo's last check-in names a day"
    start = last + 3 * 86_400 + 9 * 3600   # 9 am, three days after the last check-in
    now = [start]
    with tempfile.TemporaryDirectory(prefix="pager-record-") as home_folder:
        home = Home(Config(home=Path(home_folder), budget=2048, session="live"), store=MemoryStore(), durable=False,
                    clock=lambda: now[0])
        session = home.open()
        writer = TraceWriter(path, note=(
            "Summaries during a live chat: 80 turns of check-ins, then questions on three days (the clock a day "
            "apart). Each day's first message closes the episode before it, and after its reply the agent loop "
            "writes that episode's summary and the rolling summary's next version (the extractive producer: no "
            "model), as `summaries_written` and `summary` events; replay takes the recorded ones and runs no "
            "producer. Replies: the offline memory shell (no LLM)."))
        session.events.listeners.append(writer)
        agent = Agent(session, HandlerModel(OfflineShell()), speaker="Maya")
        begin(session, "pager/offline", agent.budget)
        session.append_many(talk[:80])
        for d, day in enumerate(LIVE_DAYS):
            for i, question in enumerate(day):
                now[0] = start + d * 86_400 + 60 * i
                agent.ask(question)
        end(session)
        writer.close()
        home.journal.close(remove=True)
        return {**session.counters, "summaries": len(session.summaries)}


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd() / "traces"
    print(json.dumps(make(target), indent=1))
