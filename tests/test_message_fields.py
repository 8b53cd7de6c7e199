"""A message's fields are checked before anything is written: the text a string; the speaker, ref and
key text; a date and a role of their types; a ts that is a time; no lone surrogate. Each refusal names
the field, and nothing of the group is kept."""

import pytest

import pager
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import InputError
from pager.home import Home


@pytest.mark.parametrize("message", [{"date": 3}, {"role": 7}, {"ts": "soon"}, {"ts": True}, {"ts": -1.0},
                                     {"ts": float("nan")}, {"ts": 1e20}, {"text": "lone \ud800"},
                                     {"speaker": "b\udc80b"}, {"key": "k\ud800"}])
def test_the_library_refuses_a_message_field_the_journal_could_not_read_back(config, message):
    """The same through the library, a `ts` that is no time (a string was a ValueError from float(),
    NaN was accepted) and a lone surrogate (a UnicodeEncodeError from the journal): InputError naming
    the field, nothing written."""
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("lib")
        with pytest.raises(InputError, match=next(iter(message))):
            s.append_many([{"speaker": "ann", "text": "typed wrong", **message}])
        assert s.turn_count == 0
        import numpy as np

        s.append_many([{"speaker": "ann", "text": "a numpy time is a time", "ts": np.float32(1.7e9)}])   # as before
        assert s.turn_count == 1


def test_a_message_whose_text_is_not_a_string_says_so(tmp_path):
    """`session.append("Maya", 5)` was refused as "an empty message has nothing to remember"; the text was
    there, it was a number. The refusal names the type and how to send it."""
    with pager.Home(Config(home=tmp_path / "home", embedder="hash")) as home:
        session = home.open("work")
        with pytest.raises(InputError) as refused:
            session.append("Maya", 5)  # type: ignore[arg-type]
        assert "must be a string, not int 5" in str(refused.value) and "empty" not in str(refused.value)
        with pytest.raises(InputError, match="empty"):
            session.append("Maya", "   ")


@pytest.mark.parametrize("field", ["speaker", "ref", "key"])
def test_a_message_field_that_is_not_text_is_refused_not_stored_as_its_str(tmp_path, field):
    """A speaker, ref or key that is not a string (a number, a list) was stored as its `str()`: a
    speaker `['Maya']` showed as "['Maya']" in every page. Refused like a role or a date, naming it;
    nothing of the group is accepted."""
    with pager.Home(Config(home=tmp_path / "home", embedder="hash")) as home:
        session = home.open("work")
        with pytest.raises(InputError) as refused:
            session.append_many([{"speaker": "Maya", "text": "fine"},
                                 {"speaker": "Maya", "text": "the bad one", field: ["Maya"]}])
        assert f"{field!r} must be text, not list" in str(refused.value)
        assert session.turn_count == 0
