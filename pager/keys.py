"""Bearer keys for `pager serve`: one tenant each, stored hashed in the home.

    PAGER_HOME/keys.json   {"version": 1, "keys": [{"id", "tenant", "salt", "hash", "created"}]}

A key reads `pgr_<id>_<secret>`. Only a salted SHA-256 of the secret is kept, so the file
grants nothing to whoever reads it; the key itself is printed once, at creation. The id
finds the record without comparing secrets one by one, and the comparison is constant time
(`hmac.compare_digest`). The file is written whole to a temporary file (mode 0600) and
renamed over the old one, so a reader sees the old set or the new one, never half.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from .errors import InputError, StoreError

FILE = "keys.json"
VERSION = 1
TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_KEY = re.compile(r"^pgr_([0-9a-f]{12})_([A-Za-z0-9_-]{20,80})$")


def is_key(text: str) -> bool:
    """Whether text has the shape of a pager key (`pgr_<id>_<secret>`), valid or not."""
    return bool(_KEY.match(text or ""))


@dataclass(frozen=True)
class KeyRecord:
    id: str
    tenant: str
    salt: str
    hash: str
    created: float

    def public(self) -> dict:
        """What `pager keys list` shows: never the hash or the salt."""
        return {"id": self.id, "tenant": self.tenant, "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.created))}


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


class KeyRing:
    """The keys of one home. Reads the file on every `verify` only when it changed on disk,
    so a key created or revoked by the CLI takes effect in a running server."""

    def __init__(self, home: str | Path) -> None:
        self.path = Path(home) / FILE
        self._records: dict[str, KeyRecord] = {}
        self._stamp: tuple[int, int] | None = None

    # -- reading ------------------------------------------------------------------------------------
    def records(self) -> list[KeyRecord]:
        self._reload()
        return sorted(self._records.values(), key=lambda r: (r.tenant, r.created, r.id))

    def __bool__(self) -> bool:
        return bool(self.records())

    def _reload(self) -> None:
        try:
            st = self.path.stat()
        except (FileNotFoundError, NotADirectoryError):   # no keys (yet): the home itself is checked where it is opened
            self._records, self._stamp = {}, None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            data = json.loads(self.path.read_text())
            newer = data.get("version") if isinstance(data, dict) else None
            if type(newer) is int and newer > VERSION:   # not damaged: kept whole for the pager that wrote it
                raise InputError(f"{self.path} was written by a newer pager (keys v{newer}; this one reads "
                                 f"v{VERSION}); upgrade pager on this host (pip install -U pager)")
            rows = data["keys"] if data.get("version") == VERSION else None
            if rows is None:
                raise ValueError(f"version {data.get('version')!r}")
            self._records = {r["id"]: KeyRecord(**r) for r in rows}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{self.path} is damaged ({exc}); restore it or remove it and create keys again") from exc
        self._stamp = stamp

    def verify(self, key: str) -> str | None:
        """The tenant of a valid key, else None (the same work is done whether the id exists or not)."""
        self._reload()
        match = _KEY.match(key or "")
        record = self._records.get(match.group(1)) if match else None
        secret = match.group(2) if match else ""
        salt, expected = (record.salt, record.hash) if record else ("00" * 16, "0" * 64)
        ok = hmac.compare_digest(_digest(salt, secret), expected)
        return record.tenant if ok and record else None

    # -- writing ------------------------------------------------------------------------------------
    def create(self, tenant: str) -> tuple[KeyRecord, str]:
        """A new key for the tenant: (its record, the key to hand out, shown only now)."""
        if not TENANT.match(tenant or ""):
            raise InputError(f"tenant {tenant!r} is not a valid name; use 1-64 letters, digits, '_', '.', '@' or '-', "
                             "starting with a letter or digit")
        with self._writing():
            key_id, secret, salt = secrets.token_hex(6), secrets.token_urlsafe(32), secrets.token_hex(16)
            record = KeyRecord(key_id, tenant, salt, _digest(salt, secret), time.time())
            self._write({**self._records, key_id: record})
        return record, f"pgr_{key_id}_{secret}"

    def revoke(self, key_id: str) -> KeyRecord:
        key_id = key_id.strip()
        match = _KEY.match(key_id)
        key_id = match.group(1) if match else key_id  # the whole key works as well as its id
        with self._writing():
            if key_id not in self._records:
                raise InputError(f"no key with id {key_id!r}; `pager keys list` shows the ids")
            records = dict(self._records)
            record = records.pop(key_id)
            self._write(records)
        return record

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One writer at a time (two `pager keys create` at once both keep their key), on the latest file."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self._refused(exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._stamp = None
            self._reload()
            yield
        finally:
            os.close(fd)

    def _write(self, records: dict[str, KeyRecord]) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({"version": VERSION, "keys": [asdict(r) for r in records.values()]}, fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:   # a read-only or full disk: the keys file stays as it was
            tmp.unlink(missing_ok=True)
            raise self._refused(exc) from None
        self._records, self._stamp = dict(records), None

    def _refused(self, exc: OSError) -> StoreError:
        return StoreError(f"cannot write the keys in {self.path.parent} ({exc.strerror or exc}); "
                          "free disk space, fix its permissions, or pick another home with --home (or PAGER_HOME)")
