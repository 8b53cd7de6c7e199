"""Whose a session is: the words that send a user to the PAGER_USER that holds the session asked for."""

import shlex

from pager.errors import InputError


def held_by(owner: str) -> str:
    """How to open a session of the name asked for that another PAGER_USER (or none) holds."""
    return (f"user {owner!r} has one: PAGER_USER={shlex.quote(owner)} opens it" if owner else
            "one of no user is there: unset PAGER_USER to open it")


def refuse_held_elsewhere(home, user: str, session: str) -> None:
    """Refuse a new session whose name another user of the store holds, naming whose it is and the
    setting that opens it (`pager chat -s notes` under the wrong PAGER_USER started an empty session)."""
    owners = [r["user"] for r in home.session_rows() if r["session"] == session and r["user"] != user]
    if owners:
        of_user = f" of user {user!r}" if user else ""
        raise InputError(f"no session {session!r}{of_user} in {where(home)}; {held_by(owners[0])}, or "
                         f"--new starts a new session {session!r}{of_user}")


def where(home) -> str:
    """The home, and the store when --db (PAGER_DB) put it elsewhere: the sessions are the store's."""
    return f"{home.path}" + (f" (store {home.config.db})" if home.config.db else "")
