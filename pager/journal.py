"""The write-ahead journal: an accepted turn is on local disk before anything else happens.

Each process appends JSON lines to a segment file of its own and holds an exclusive lock on
it while it lives. `append` returns only after fsync, so whatever it returned for survives
`kill -9`. Records are written to the store in batches (see pager.home); a fully written
segment is then replaced by a fresh one. A segment whose lock can be taken belongs to a dead
process: its records are replayed into the store (writes there are insert-if-absent, so a
record that already landed lands once) and the segment is removed. A torn last line, from a
crash inside a write that was never acknowledged, is ignored.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Iterator

from .errors import StoreError

VERSION = 1


class Journal:
    def __init__(self, folder: Path, fsync: bool = True) -> None:
        self.folder = Path(folder)
        self.fsync = fsync
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the journal folder {self.folder}: {exc}; check --home") from exc
        self._fd = -1
        self.path: Path | None = None
        self._open_segment()

    def _open_segment(self) -> None:
        name = f"{time.time_ns():020d}-{os.getpid()}.jsonl"
        path = self.folder / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot write the journal in {self.folder}: {exc}; check the disk and --home") from exc
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fd, self.path = fd, path
        self.written = 0

    def append(self, records: list[dict]) -> None:
        """Write records as one group and make them durable before returning."""
        if not records:
            return
        data = "".join(json.dumps({"v": VERSION, **r}, ensure_ascii=False, separators=(",", ":")) + "\n"
                       for r in records).encode()
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if self.fsync:
                os.fsync(self._fd)
        except OSError as exc:
            raise StoreError(f"the journal write failed ({exc}); free disk space or fix permissions on "
                             f"{self.folder}; the message was not accepted") from exc
        self.written += len(records)

    def rotate(self) -> None:
        """Start a new segment and drop the old one: call only when all its records are in the store."""
        old_fd, old_path = self._fd, self.path
        self._open_segment()
        os.close(old_fd)
        try:
            os.unlink(old_path)
        except FileNotFoundError:
            pass

    def close(self, remove: bool) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            if remove and self.path is not None:
                self.path.unlink(missing_ok=True)

    def others(self) -> list[Path]:
        return sorted(p for p in self.folder.glob("*.jsonl") if p != self.path)

    def orphans(self) -> Iterator[tuple[Path, list[dict]]]:
        """Segments of dead processes, each locked while the caller recovers it (then removed)."""
        for path in self.others():
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # its process is alive
            try:
                records, _ = read_records(path, 0)
                yield path, records
                path.unlink(missing_ok=True)
            finally:
                os.close(fd)

    def read_new(self, offsets: dict[str, int]) -> list[dict]:
        """Records other processes appended since the reader's offsets (segment name → bytes read)."""
        seen = set()
        records: list[dict] = []
        for path in self.others():
            seen.add(path.name)
            new, offsets[path.name] = read_records(path, offsets.get(path.name, 0))
            records.extend(new)
        for name in set(offsets) - seen:
            del offsets[name]
        return records


def read_records(path: Path, offset: int) -> tuple[list[dict], int]:
    """Complete JSON lines from offset on, and the offset after the last complete one."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    records = []
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a torn write that was never acknowledged
    return records, offset + end
