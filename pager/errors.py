"""Errors of the user or the programmer. Each message names the fix.

Mistakes of the model never raise: they come back to it as tool-result text (see
pager.tools). Everything here is for people, and the CLI prints it as one line.
"""


class PagerError(Exception):
    """Base of every known failure; the CLI prints its message and exits non-zero."""

    exit_code = 1


class ConfigError(PagerError):
    """A setting is out of range or contradicts another."""

    exit_code = 2


class BudgetError(PagerError):
    """The token budget cannot hold what must be in it."""


class PageNotFound(PagerError):
    """A page id that the session does not have."""


class SessionNotFound(PagerError):
    """A session that holds nothing in this home (usually a mistyped name)."""


class InputError(PagerError):
    """A file, message or argument that pager cannot accept as it is."""

    exit_code = 2


class KeyReused(InputError):
    """An idempotency key the session holds, sent with other words: a new message needs a new key."""


class StoreError(PagerError):
    """The disk (LanceDB or the journal) refused or is damaged."""


class LeaseLapsed(StoreError):
    """This home's lease of a session ran out by its own clock while a write was under way (a slow store,
    a stall): nothing of the write went in under it. Taken again and tried again before it is said."""


class NewerStore(StoreError):
    """The store was made, or migrated, by a newer pager than this one: upgrade pager to use it."""


class ModelError(PagerError):
    """The model provider failed in a way retries did not fix."""


class ToolError(PagerError):
    """A typed Toolkit call the tool refused; the message is the tool's answer and names the fix."""


class LeaseHeld(PagerError):
    """Another host holds the write lease of a session (pager.lease)."""
