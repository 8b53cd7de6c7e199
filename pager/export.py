"""Export: every turn of a session as JSONL that `pager ingest` reads back (your data is yours)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TextIO

from .errors import InputError, StoreError
from .fsck import NEWER, NUMBERED_OVER, durable_turns


def export_turns(home, user: str, session: str, out: Path | TextIO) -> int:
    """Write the session's turns, store and live journals alike, in order; returns how many."""
    problems: list[str] = []
    turns = durable_turns(home, user, session, problems)
    clashes = [p for p in problems if p.endswith(NUMBERED_OVER)]
    if clashes:  # one number, two messages: writing either alone would leave an acknowledged one out
        raise StoreError(f"session {session!r} cannot be exported whole: {clashes[0]}")
    if home.journal.newer:   # records this pager cannot read: the export would leave them out without a word
        raise StoreError(f"session {session!r} cannot be exported whole: {NEWER.format(home.journal.newer)}")
    lines = []
    for t in turns:
        record = {"speaker": t.speaker, "role": t.role, "text": t.text, "date": t.date, "ts": t.ts, "ref": t.ref}
        record["key"] = t.key or t.identity()
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    if isinstance(out, (str, Path)):
        path = Path(out)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(lines)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise InputError(f"cannot write {path} ({exc.strerror or exc}); pick a file path you can write") from None
    else:
        out.writelines(lines)
    return len(turns)
