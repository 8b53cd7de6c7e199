"""`pager bench producer`: a memory model's facts over LoCoMo conversations, written once as a producer file.

Each conversation is ingested into a fresh home whose memory model is the one given, and every sealed
page is named by it, a batch per call (`Session.write_bookmarks(force=True)`, the same calls a live
session makes after its replies). The facts it kept are written with the dia_ids of their source
turns, in the shape of the dataset's own `observation` facts, so `pager bench locomo --memory FILE`
shows them exactly as `--memory recorded` shows the dataset's (same slabs, same summaries, same
coverage accounting) and the two coverages sit side by side. A model is slow here (a call over a
batch of eight pages takes about a minute on 2 cores), so the file is made once and read many times.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from functools import partial
from typing import Callable

from ..config import Config
from ..formats import parse_locomo
from ..home import memory_home


def write(data: Path, conversations: list[str], config: Config, out: Path,
          say: Callable[[str], None] = lambda line: None, writer=None) -> dict:
    """writer: the memory writer to use (a test's scripted one); by default the config's memory model."""
    convs = {c.sample_id: c for c in parse_locomo(data)}
    missing = [c for c in conversations if c not in convs]
    if missing:
        raise ValueError(f"no conversation {', '.join(missing)} in {data}; it has {', '.join(convs)}")
    produced: dict = {}
    for sid in conversations:
        conv = convs[sid]
        with tempfile.TemporaryDirectory(prefix="pager-producer-") as folder:
            home = memory_home(config.with_(home=Path(folder), session=sid), writer=writer)
            session = home.open()
            heard: dict[str, list] = {"memory_error": [], "memory_rejected": [], "bookmarks_written": []}
            session.events.listeners.append(partial(_hear, heard))
            turns = session.append_many(conv.messages)
            ref = {t.turn: t.ref for t in turns}
            started = time.perf_counter()
            while session.unwritten:   # a failed batch stays unwritten: its turns are left to the next call
                before = len(session.unwritten)
                say(f"{sid}: {before} pages left to name")
                session.write_bookmarks(force=True)
                if len(session.unwritten) == before:
                    session.unwritten = session.unwritten[home.writer.batch:]   # that batch failed: go on
            facts = [[f.subject, f.text, [ref[t] for t in f.turns if t in ref]]
                     for f in session.facts.items if not f.ends]
            produced[sid] = {
                "facts": [f for f in facts if f[2]],
                "calls": len(heard["bookmarks_written"]) + len(heard["memory_error"]),   # one answer per call
                "failed_calls": len(heard["memory_error"]),
                "errors": [e["error"] for e in heard["memory_error"]][:5],
                "rejected_items": sum(len(e["rejected"]) for e in heard["memory_rejected"]),
                "pages": len(session.pages),
                "seconds": round(time.perf_counter() - started, 1),
            }
            home.journal.close(remove=True)
    report = {"dataset": Path(data).name, "memory_model": config.memory_model, "conversations": produced}
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


def _hear(heard: dict[str, list], event) -> None:
    if event.kind in heard:
        heard[event.kind].append(event.data)


def read(path: Path) -> dict[str, list[tuple[str, str, list[str]]]]:
    """sample_id → (subject, text, refs), as formats.parse_locomo_observations gives the dataset's."""
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    return {sid: [(str(s), str(t), [str(r) for r in refs]) for s, t, refs in c["facts"]]
            for sid, c in report["conversations"].items()}
