"""Offline keyword extraction on tricky text (a discourse filler is no keyword), and the bookmark directory."""

from pager.bookmarks import Directory, aliases, extract, normalize
import pytest


def test_names_and_multiword_names():
    kws = extract("Maya: I met Sam Okafor and Priya Raman at the Casa do Rio hotel in Lisbon.")
    lowered = [k.lower() for k in kws]
    assert "sam okafor" in lowered and "priya raman" in lowered
    assert any("lisbon" in k for k in lowered)
    assert "i" not in lowered and "maya" not in lowered  # the speaker label is not content


def test_numbers_and_dates():
    kws = extract("ann: The budget is $18,400 and the launch is on 14 October 2025, rate limit 600/minute.")
    assert "$18,400" in kws
    assert kws[0] == "14 October 2025"
    assert {"budget", "launch", "limit"} <= set(kws)   # the words before the numbers said about them


def test_code_identifiers():
    kws = extract("dev: the bug is in doc_versions.updated_at; call parseConfig() from `loom.sync.engine`.")
    assert "doc_versions.updated_at" in kws
    assert "parseConfig" in kws
    assert "loom.sync.engine" in kws


def test_cjk_text():
    kws = extract("yuki: 来週は東京タワーに行きます。会議は大阪で。")
    assert any("東京タワー" in k for k in kws)


def test_sentence_starts_are_not_names():
    kws = [k.lower() for k in extract("bob: Thanks! What a day. Yesterday we went hiking. Hey, cool.")]
    assert not {"thanks", "what", "yesterday", "hey", "cool"} & set(kws)


def test_aliases_answer_to_head_words():
    assert {"alpha module", "alpha", "module"} <= aliases("Alpha module")
    parts = aliases("doc_versions.updated_at")
    assert {"doc", "versions", "updated", "version"} <= parts and "at" not in parts   # too short to look up
    assert {"dog", "dogs"} <= aliases("dogs") and "martial art" in aliases("martial arts")


def test_directory_lookup_by_alias_and_model_first():
    d = Directory()
    d.add(["Alpha module", "Loom"], [3])
    d.add(["release plan"], [3, 9], note="where we planned it", uid="u1", first=True)
    d.add(["release plan"], [4], uid="u1")  # the same uid again is ignored
    assert d.lookup("alpha") == {3}
    assert d.lookup("Release Plan") == {3, 9}
    assert d.keywords(3)[0] == "release plan"
    assert d.notes[9] == ["where we planned it"]
    assert normalize("  Release—Plan! ") == "release plan"


@pytest.mark.parametrize("text", [
    "Nate: They're actually competitors in the tournament, and he is allergic to shellfish.",
    "Joanna: Actually I've discovered my favorite icecream place near the harbour.",
    "Gina: Dancing seriously makes me happy, it is important to express yourself.",
])
def test_a_discourse_filler_is_not_a_bookmark_keyword(text):
    """The offline extractor bookmarked pages under "actually" (a long word, so "rare"), which names
    nothing a question asks about, in place of a word of the page."""
    from pager.bookmarks import extract

    keywords = [k.lower() for k in extract(text)]
    assert not {"actually", "actually i've", "seriously"} & set(keywords), keywords
    assert any(word in keywords for word in ("allergic", "icecream", "express")), keywords


NUMBERED_TALK = [
    "ann: my flight leaves at 7:45 from gate 12, the hotel room is 214 and the taxi costs 38 dollars.",
    "Maya: Budget for Q3 is 18,400 euros.\nBot: Got it, 18,400 euros for Q3.\nMaya: we ordered 250 stickers and 40 "
    "mugs for the 2025 conference",
    "user: my locker code is 3141 and the gym opens at 6am, membership is 45 per month, renewal on 12/03",
    "user: the order 88123 shipped with 3 boxes, tracking number 1Z999AA10123456784, 2 days late",
]


@pytest.mark.parametrize("text", NUMBERED_TALK)
def test_a_pages_automatic_keywords_are_words_and_numbers_come_after_them(text):
    """Talk in lower case with a few numbers was bookmarked under the numbers: "12,", "214", "38", "45",
    then "dollars" for the flight above; the memory map then told the model "214 → p3", which names
    nothing a question asks about. A page's words come first (short ones too when it has few long
    ones), numbers only after them, at most two, without the comma that followed them."""
    from pager.bookmarks import is_number

    keywords = extract(text)
    assert keywords and not is_number(keywords[0]), keywords
    assert sum(map(is_number, keywords)) <= 2, keywords
    numbers = [k for k in keywords if is_number(k)]
    assert all(k == k.rstrip(",.") for k in keywords), keywords
    assert all(keywords.index(n) > i for n in numbers for i, k in enumerate(keywords) if not is_number(k)), keywords
    assert sum(not is_number(k) for k in keywords) >= 3, keywords


def test_the_keywords_of_traces_recorded_before_words_came_first_are_as_they_were():
    """A trace records each sealed page's keywords, and replay makes them again: extraction as it was
    (`words_first=False`) is kept for traces recorded before it changed."""
    assert extract(NUMBERED_TALK[0], words_first=False) == ['12,', '214', '38', '45', 'dollars']
