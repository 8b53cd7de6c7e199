"""The write-ahead journal: an accepted turn is on local disk before anything else happens.

Each process appends to a segment of its own (`journal/<ns>-<pid>-<rand>.wal`) and holds an
exclusive flock on it while it lives. The segment is created under a hidden name, locked, and
only then renamed into view, so no other process can ever see it unlocked while its owner lives
(a visible unlocked segment belongs to a dead process and is recovered).

Framing (version 2), after RFC 7464 JSON text sequences and LevelDB's log: every `append` is one
frame, all of its records or none,

    0x1E  <body length, 8 hex digits> SP <CRC-32 of the body, 8 hex digits> SP  <body>  LF

where the body is `{"v": 2, "ops": [...]}`. 0x1E never occurs inside JSON text, so a reader that
meets a torn or damaged frame skips to the next 0x1E: a torn tail costs exactly the torn frame,
never the frame after it. A failed write is also cut off the file (ftruncate) before the error is
raised. Damaged frames and records that are not valid ops are reported once each, naming file and
offset, and never stop a reader. Segments of version 1 (`*.jsonl`, one JSON object per line, from
release 0.1) are still read and recovered.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Iterator

from .errors import StoreError

VERSION = 2
RS = b"\x1e"
HEADER = 1 + 8 + 1 + 8 + 1  # RS, length, space, crc, space
SUFFIX = ".wal"
LEGACY_SUFFIX = ".jsonl"

# what a valid op carries: name → (field → type)
_TURN_FIELDS = {"session": str, "turn": int, "speaker": str, "text": str, "role": str, "date": str,
                "ts": (int, float), "ref": str, "user": str}
OPS: dict[str, dict] = {
    "turn": _TURN_FIELDS,
    "bookmark": {"user": str, "session": str, "uid": str, "keywords": list, "pages": list},
    "pin": {"user": str, "session": str, "page": int, "pinned": bool},
    "settings": {"user": str, "session": str, "page_tokens": int, "encoding": str},
    "state": {"user": str, "session": str, "seq": int, "key": str, "value": str, "unset": bool, "page": int,
              "turn": int, "ts": (int, float), "source": str},
    "fact": {"user": str, "session": str, "n": int, "subject": str, "text": str, "turns": list, "pages": list,
             "ts": (int, float), "date": str, "source": str},
    "summary": {"user": str, "session": str, "n": int, "kind": str, "key": str, "version": int, "text": str,
                "pages": list, "turns": list, "ts": (int, float), "date": str, "source": str},
}


def frame(ops: list[dict]) -> bytes:
    body = json.dumps({"v": VERSION, "ops": ops}, ensure_ascii=False, separators=(",", ":")).encode()
    return b"%s%08x %08x %s\n" % (RS, len(body), zlib.crc32(body), body)


def valid(op) -> str:
    """'' for a well-formed op, else what is wrong with it."""
    if not isinstance(op, dict):
        return "not an object"
    fields = OPS.get(op.get("op"))  # type: ignore[arg-type]
    if fields is None:
        return f"unknown op {op.get('op')!r}"
    for name, kind in fields.items():
        value = op.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            return f"field {name!r} is {type(value).__name__}, not {getattr(kind, '__name__', 'a number')}"
    if op["op"] == "turn" and (op["turn"] < 1 or not op["text"] or not isinstance(op.get("key", ""), str)):
        return "a turn needs a number of 1 or more, some text and a string key"
    if op["op"] == "state" and (op["seq"] < 1 or not op["key"] or op["unset"] == bool(op["value"])):
        return "a state change needs a number of 1 or more, a key, and a value unless it unsets"
    if op["op"] == "fact" and (op["n"] < 1 or not op["text"].strip() or not isinstance(op.get("ends", False), bool)):
        return "a fact needs a number of 1 or more and some text (and `ends` true or false)"
    if op["op"] == "summary" and (op["n"] < 1 or op["version"] < 1 or not op["text"].strip() or len(op["pages"]) != 2
                                  or len(op["turns"]) != 2 or not all(type(x) is int for x in op["pages"] + op["turns"])):
        return "a summary needs a number and version of 1 or more, some text, and first and last page and turn"
    return ""


@dataclass
class Read:
    """What a read of one segment found."""

    ops: list[dict] = field(default_factory=list)
    end: int = 0                                   # offset after the last whole frame
    damage: list[str] = field(default_factory=list)  # "file at offset N: why"
    newer: int = 0                                 # the highest journal version above VERSION among its frames


def read_segment(path: Path, offset: int = 0, final: bool = False) -> Read:
    """Ops from offset on. A frame still being written (a live writer's tail) is left for the next
    read; with final (the owner is dead) it is a torn write that was never acknowledged."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return Read(end=offset)
    if path.suffix == LEGACY_SUFFIX:
        return _read_legacy(path, offset, data, final)
    out = Read(end=offset)
    pos = 0
    while pos < len(data):
        if data[pos : pos + 1] != RS:
            nxt = data.find(RS, pos)
            out.damage.append(f"{path.name} at offset {offset + pos}: {(nxt if nxt >= 0 else len(data)) - pos} "
                              "bytes that are not a frame")
            if nxt < 0:
                out.end = offset + len(data)
                break
            pos = nxt
            out.end = offset + pos
            continue
        head = data[pos : pos + HEADER]
        nxt = data.find(RS, pos + 1)
        try:
            length, crc = int(head[1:9], 16), int(head[10:18], 16)
            if head[9:10] != b" " or head[18:19] != b" ":
                raise ValueError
        except ValueError:
            if nxt < 0 and len(head) < HEADER:
                if final:
                    out.end = offset + len(data)  # torn: never acknowledged
                break  # else a header still being written
            out.damage.append(f"{path.name} at offset {offset + pos}: a damaged frame header")
            pos = nxt if nxt >= 0 else len(data)
            out.end = offset + pos
            continue
        body_end = pos + HEADER + length
        if body_end + 1 > len(data) and nxt < 0:
            if final:
                out.end = offset + len(data)  # torn: never acknowledged
            break
        body = data[pos + HEADER : body_end]
        if zlib.crc32(body) != crc or data[body_end : body_end + 1] != b"\n":
            out.damage.append(f"{path.name} at offset {offset + pos}: a frame whose checksum does not match")
            pos = nxt if nxt >= 0 else len(data)
            out.end = offset + pos
            continue
        _take_body(body, path, offset + pos, out)
        pos = body_end + 1
        out.end = offset + pos
    return out


def _take_body(body: bytes, path: Path, where: int, out: Read) -> None:
    try:
        obj = json.loads(body)
        ops = obj["ops"]
        if not isinstance(ops, list):
            raise TypeError
    except (ValueError, TypeError, KeyError):
        out.damage.append(f"{path.name} at offset {where}: a frame that is not a list of ops")
        return
    if isinstance(obj.get("v"), int) and obj["v"] > VERSION:  # a newer pager wrote it: keep it for that pager
        out.newer = max(out.newer, obj["v"])
        out.damage.append(f"{path.name} at offset {where}: a frame of journal v{obj['v']}, newer than this pager "
                          f"(v{VERSION}); upgrade pager to recover it")
        return
    for i, op in enumerate(ops):
        problem = valid(op)
        if problem:
            out.damage.append(f"{path.name} at offset {where}, op {i}: {problem}")
        else:
            out.ops.append(op)


def _read_legacy(path: Path, offset: int, data: bytes, final: bool) -> Read:
    """Version 1: JSON lines. A torn last line (no newline yet) is left alone or, when final, dropped."""
    out = Read(end=offset)
    end = data.rfind(b"\n") + 1
    pos = 0
    for line in data[:end].split(b"\n")[:-1]:
        where = offset + pos
        pos += len(line) + 1
        try:
            op = json.loads(line)
        except ValueError:
            out.damage.append(f"{path.name} at offset {where}: not a JSON line")
            continue
        problem = valid(op)
        if problem:
            out.damage.append(f"{path.name} at offset {where}: {problem}")
        else:
            out.ops.append(op)
    out.end = offset + (len(data) if final else end)
    return out


class Journal:
    """This process's segment, and the readers of everyone else's."""

    def __init__(self, folder: Path, fsync: bool = True, read_only: bool = False,
                 report: Callable[[str], None] | None = None, tag: str = "", lazy: bool = False) -> None:
        self.folder = Path(folder)
        self.tag = tag   # in this pager's segment names, after the random part (home.HOME_TAG)
        self.fsync = fsync
        self.read_only = read_only
        self.report = report or (lambda message: None)
        self._reported: set[str] = set()
        self._fd = -1
        self.path: Path | None = None
        self.written = 0
        self.newer = 0   # the newest journal version above VERSION a read found (a reader skips those frames)
        self._deferred = threading.local()   # a thread inside deferred(): its frames are fsync'd at the end
        self._fd_lock = threading.Lock()     # sync() from another thread never meets a segment being rotated
        if read_only or lazy:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the journal folder {self.folder}: {exc}; check --home") from exc
        self._open_segment()

    def _open_segment(self) -> None:
        name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}{self.tag}{SUFFIX}"
        hidden = self.folder / f".{name}.new"  # not matched by the readers' glob
        try:
            fd = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # locked before it is visible
            os.rename(hidden, self.folder / name)
        except OSError as exc:
            raise StoreError(f"cannot write the journal in {self.folder}: {exc}; check the disk and --home") from exc
        self._fd, self.path = fd, self.folder / name
        self.written = 0

    def append(self, ops: list[dict]) -> None:
        """Write ops as one frame and make it durable before returning; on failure nothing of it stays."""
        if not ops:
            return
        if self.read_only:
            raise StoreError("this home was opened read-only; nothing can be written")
        if self._fd < 0:
            self._open_segment()
        data = frame(ops)
        size = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if self.fsync:
                if getattr(self._deferred, "on", False):
                    self._deferred.dirty = True
                else:
                    os.fsync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, size)  # cut the torn frame off: the next one starts clean
            except OSError:
                pass  # readers skip it by its checksum
            raise StoreError(f"the journal write failed ({exc}); free disk space or fix permissions on "
                             f"{self.folder}; the message was not accepted") from exc
        self.written += len(ops)

    def syncs_on_append(self) -> bool:
        """Does append wait for an fsync before it returns (a durable journal, this thread outside deferred())?"""
        return self.fsync and not getattr(self._deferred, "on", False)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Appends of this thread inside the block write their frames at once and make them durable
        together at its end: one fsync for what is acknowledged together (a chat call's question and
        reply, answered in one response). A frame written is already safe from a crash of this process
        (it is in the kernel); the fsync at the end covers a crash of the machine. Nothing written in
        the block may be acknowledged before the block ends (or `sync` is called)."""
        if getattr(self._deferred, "on", False):
            yield
            return
        self._deferred.on, self._deferred.dirty = True, False
        try:
            yield
        finally:
            self._deferred.on = False
            if self._deferred.dirty:
                self.sync()

    def sync(self) -> None:
        """Make every frame written so far durable (any thread may call it)."""
        if not self.fsync:
            return
        with self._fd_lock:
            if self._fd < 0:
                return
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise StoreError(f"the journal could not be made durable ({exc}); free disk space or fix "
                                 f"permissions on {self.folder}") from exc

    def rotate(self) -> None:
        """Start a new segment and drop the old one: call only when all its ops are in the store."""
        if self.read_only or self._fd < 0:
            return
        with self._fd_lock:
            old_fd, old_path = self._fd, self.path
            self._fd, self.path = -1, None
            try:
                self._open_segment()
            finally:
                os.close(old_fd)
                if old_path is not None:
                    old_path.unlink(missing_ok=True)

    def close(self, remove: bool) -> None:
        with self._fd_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
                if remove and self.path is not None:
                    self.path.unlink(missing_ok=True)

    def segments(self, own: bool = False) -> list[Path]:
        """Every visible segment but (unless own) this process's, oldest first; anything else is ignored."""
        try:
            paths = [p for p in self.folder.iterdir() if p.suffix in (SUFFIX, LEGACY_SUFFIX)
                     and not p.name.startswith(".") and (own or p != self.path)]
        except OSError:
            return []
        return sorted((p for p in paths if p.is_file()), key=lambda p: p.name)

    def _note(self, damage: list[str]) -> None:
        for message in damage:
            if message not in self._reported:
                self._reported.add(message)
                self.report(f"journal damage: {message}; that record is skipped")

    def orphans(self, untagged: str = "") -> Iterator[tuple[Path, list[dict], bool]]:
        """Segments of dead processes (path, ops, damaged?), each locked while the caller recovers it;
        the caller removes it (or sets it aside if damaged) before the next one is offered. With
        untagged, only the segments whose names lack that tag (an older pager's)."""
        if self.read_only:
            return
        for path in self.segments():
            if untagged and path.stem.endswith(untagged):
                continue
            fd = self._unlocked(path)
            if fd is None:
                continue
            try:
                if os.fstat(fd).st_nlink == 0:
                    continue  # recovered by another process while we waited
                read = read_segment(path, 0, final=True)
                self._refuse_newer(path, read)
                self._note(read.damage)
                yield path, read.ops, bool(read.damage)
            finally:
                os.close(fd)

    def dead(self) -> list[Path]:
        """The segments of other processes that hold no lock: their processes died (orphans offers them)."""
        if self.read_only:
            return []
        found = []
        for path in self.segments():
            fd = self._unlocked(path)
            if fd is not None:
                os.close(fd)   # closing releases the flock
                found.append(path)
        return found

    @staticmethod
    def _unlocked(path: Path) -> int | None:
        """A descriptor of the segment holding its flock, or None when its process is alive (or it is gone)."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None   # its process is alive
        return fd

    def _refuse_newer(self, path: Path, read: Read) -> None:
        """A segment holding frames of a newer pager (a host downgraded, or a newer pager running beside this
        one on the home): this pager cannot read their records, so a writer would number over their turns
        and recovery would set the segment aside where no pager reads it again. A writer refuses; the
        segment stays where it is, for the newer pager to recover. A reader says so and reads the rest
        (`newer` tells an export or a check that it is not the whole session)."""
        self.newer = max(self.newer, read.newer)
        if read.newer and not self.read_only:
            raise StoreError(f"the journal {path} holds records of journal v{read.newer}, written by a newer pager "
                             f"(this one reads v{VERSION}); nothing is written until that pager has recovered them: "
                             "run the newer pager on this home once (any pager command that writes), or upgrade "
                             "pager (pip install -U pager)")

    def set_aside(self, path: Path) -> None:
        """Keep a recovered segment that had damage, for a person to look at; it is not read again."""
        aside = self.folder / "damaged"
        aside.mkdir(exist_ok=True)
        os.replace(path, aside / path.name)

    def read_new(self, offsets: dict[str, int], own: bool = False, skip: Collection[str] = ()) -> list[dict]:
        """Ops other processes (and with own, this one) appended since the reader's offsets
        (segment name → bytes read); the segments named in skip are not read."""
        seen = set()
        ops: list[dict] = []
        for path in self.segments(own):
            if path.name in skip:
                continue
            seen.add(path.name)
            read = read_segment(path, offsets.get(path.name, 0))
            self._refuse_newer(path, read)
            offsets[path.name] = read.end
            self._note(read.damage)
            ops.extend(read.ops)
        for name in set(offsets) - seen:
            del offsets[name]
        return ops
