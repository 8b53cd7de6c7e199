"""Exact token counts with tiktoken, offline.

tiktoken downloads its encodings on first use; litellm ships cl100k_base and o200k_base,
so the cache folder is pointed there before tiktoken is imported. litellm itself is not
imported (it costs seconds): its folder is found with importlib.
"""

from __future__ import annotations

import os
import re
import threading
from functools import lru_cache

# Model families whose tokenizer is o200k_base; every other model is counted with cl100k.
O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o", "gpt-oss")


def encoding_for_model(model: str | None) -> str:
    """o200k for the gpt-4o family and later OpenAI models, cl100k otherwise."""
    name = (model or "").split("/")[-1].lower()
    return "o200k_base" if name.startswith(O200K_PREFIXES) else "cl100k_base"


def _offline_cache() -> None:
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    from .deferred import folder

    litellm = folder("litellm")
    if litellm is not None and (litellm / "litellm_core_utils" / "tokenizers").is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(litellm / "litellm_core_utils" / "tokenizers")


class Tokenizer:
    """Counts, encodes and decodes with one tiktoken encoding."""

    def __init__(self, encoding: str = "cl100k_base"):
        self.name = encoding
        self._loaded = None         # the tiktoken encoding, loaded when a count is not known (_enc)
        self._lock = threading.Lock()
        self.known: dict[str, int] = {}   # texts whose exact counts are known without encoding them (learn)
        self._digits: dict[str, int] | None = None   # every run of one to three ASCII digits → its tokens (digit_tokens)
        self._deltas: dict[tuple[str, str, bool], int] = {}   # (end of a text, suffix, suffix first) → tokens the suffix adds

    @property
    def _enc(self):
        """The tiktoken encoding, loaded on first use (~0.13 s of CPU): a process that only looks at a
        session whose counts its snapshot holds never loads it."""
        enc = self._loaded
        if enc is None:
            with self._lock:
                if self._loaded is None:
                    _offline_cache()
                    import tiktoken

                    self._loaded = tiktoken.get_encoding(self.name)
                enc = self._loaded
        return enc

    def __reduce__(self):
        return (get_tokenizer, (self.name,))   # the process's own tokenizer of this encoding, not a copy

    def learn(self, counts: dict[str, int]) -> None:
        """Exact counts of texts by this encoding, made by a process that encoded them (a session
        snapshot's, Caches.snapshot): count answers them without loading the encoding."""
        if len(self.known) + len(counts) > KNOWN_MOST:
            self.known = {}
        self.known.update(counts)

    def recorder(self) -> Recorder:
        """A tokenizer of this encoding that keeps every count it makes (Recorder.seen)."""
        return Recorder(self)

    def count(self, text: str) -> int:
        # encode_ordinary is encode(text, disallowed_special=()) without its scan for special tokens (tiktoken
        # says so; tests/test_tokens.py holds them equal): ~20% less per count of a ~50-token line
        if not text:
            return 0
        known = self.known.get(text) if self.known else None
        return known if known is not None else len(self._enc.encode_ordinary(text))

    def count_extended(self, text: str, tokens: int, suffix: str) -> int:
        """Exact tokens of text + suffix, given text's own exact count: only the end of text after its
        last pre-token boundary is counted again (with and without the suffix), and that difference is
        cached. The boundary is the last space after an ASCII letter: in the tiktoken encodings pager
        uses (cl100k, o200k) no pre-token holds a letter followed by a space (a run of letters takes a
        non-letter only in front of it, a contraction only starting with an apostrophe), so every
        pre-token before it is the same whatever follows, and text[c:] + suffix is pre-tokenized alone
        as it is within the whole. Without such a space, the whole is counted. A suffix starting with
        ASCII whitespace (a separator, a newline) needs less: only the text's closing punctuation
        (tail_start), so the few such ends (".", "?", none) are counted once per process."""
        c = tail_start(text, suffix)
        if c < 0:
            c = last_boundary(text)
            if c <= 0:
                return self.count(text + suffix)
        return tokens + self.delta(text[c:], suffix)

    def digit_tokens(self, digits: str) -> int:
        """Tokens of a run of one to three ASCII digits (a pre-token of its own in cl100k and o200k: a page
        number's digits go in threes), from a table of all 1,110 such runs counted once per encoding
        (~1 ms), where each page shown or listed for the first time counted its own."""
        table = self._digits
        if table is None:
            runs = [f"{i:0{width}d}" for width in (1, 2, 3) for i in range(10**width)]
            table = self._digits = dict(zip(runs, map(self.count, runs)))
        return table[digits]

    def count_spaced(self, text: str, tokens: int) -> int | None:
        r"""Exact tokens of " " + text, given text's own exact count, or None when that is not known to
        be exact. The text must start with a run of ASCII letters followed by nothing, or by an ASCII
        character that is neither a letter nor an apostrophe: in the tiktoken encodings pager uses
        (cl100k, o200k) that run's pre-tokens end where it ends (a letter pre-token takes letters, and
        an apostrophe's contraction, only), and its first pre-token takes a space in front of it
        (`[^\r\n\p{L}\p{N}]?` before the letters), so the space changes the run's first pre-token alone:
        the difference is the run's, count(" " + run) - count(run), cached (a speaker's name)."""
        word = leading_word(text)
        return None if word is None else tokens + self.delta(" ", word, prefix=True)

    def delta(self, end: str, suffix: str, prefix: bool = False) -> int:
        """count(end + suffix) - count(end), cached: the ends of texts after their last boundary repeat
        (the last word and its stop), and so do the suffixes pager puts after them. prefix=True: the
        other way round, count(end + suffix) - count(suffix) (a space put before a word)."""
        key = (end, suffix, prefix)
        delta = self._deltas.get(key)
        if delta is None:
            if len(self._deltas) > 100_000:
                self._deltas.clear()
            delta = self._deltas[key] = self.count(end + suffix) - self.count(suffix if prefix else end)
        return delta

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)

    def fit(self, text: str, limit: int) -> str:
        """A prefix of text of at most limit tokens, cut at a character boundary, that one more
        character would take over the limit (fit_end)."""
        if self.count(text) <= limit:
            return text
        return text[:self.fit_end(text, 0, limit, least=0)]

    @property
    def longest_token(self) -> int:
        """The most characters one token can cover (its bytes bound its characters)."""
        return _longest_token(self.name)

    def fit_end(self, text: str, start: int, limit: int, head: str = "", least: int = 1) -> int:
        """An end such that head + text[start:end] counts at most limit tokens and one more character
        would not (the longest such piece, but where a token merges at the cut: "Ea" can count more
        than "Ear"), never below start + least (a piece must move on even when nothing fits). Costs a few counts of about
        limit tokens each however long text is (a search over the whole text re-counted megabytes per
        page): past limit × the longest token nothing fits, and the search starts where the
        limit-th token of one encoding of a window falls."""
        floor, hi = start + least, min(len(text), start + (limit + 1) * self.longest_token)

        def fits(end: int) -> bool:
            return self.count(head + text[start:end]) <= limit

        window = max(64, 8 * limit)
        while True:   # a window holding more than limit tokens, or all the text that could fit
            end = min(hi, start + window)
            ids = self._enc.encode_ordinary(head + text[start:end])
            if len(ids) > limit or end >= hi:
                break
            window *= 4
        guess = end
        if len(ids) > limit:
            chars = len(self._enc.decode_bytes(ids[:limit]).decode("utf-8", errors="ignore"))  # a guess only
            guess = min(max(floor, start + chars - len(head)), hi)
        if fits(guess):   # gallop up to an end that does not fit
            lo, step = guess, 1
            while lo + step <= hi and fits(lo + step):
                lo, step = lo + step, step * 2
            top = min(hi, lo + step - 1)
        else:             # gallop down to an end that fits, or to the floor
            bad, step = guess, 1
            while bad - step > floor and not fits(bad - step):
                bad, step = bad - step, step * 2
            lo, top = max(floor, bad - step), bad - 1
        while lo < top:   # bisect: lo fits (or is the floor), top + 1 does not
            mid = (lo + top + 1) // 2
            if fits(mid):
                lo = mid
            else:
                top = mid - 1
        return lo


ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def last_boundary(text: str, within: int = 200) -> int:
    """The last index c (in text's last `within` characters) where text[c] is a space after an ASCII
    letter, a pre-token boundary whatever comes after (Tokenizer.count_extended); 0 if none."""
    c = text.rfind(" ", max(1, len(text) - within))
    while c > 0:
        if text[c - 1] in ASCII_LETTERS:
            return c
        c = text.rfind(" ", max(1, len(text) - within), c)
    return 0


ASCII_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
CLOSING = frozenset("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~")   # ASCII punctuation but the apostrophe
ASCII_SPACE = frozenset(" \t\n\r")


def tail_start(text: str, suffix: str) -> int:
    """Where text's closing punctuation starts, when text + suffix may be counted from there
    (Tokenizer.count_extended), else -1: the suffix starts with ASCII whitespace, and text ends in a
    run of ASCII punctuation other than the apostrophe (maybe none) after an ASCII letter or digit.
    In the tiktoken encodings pager uses (cl100k, o200k) the pre-token holding that letter or digit
    ends there whatever follows (a letter pre-token takes letters and a contraction, which needs an
    apostrophe; a digit pre-token digits), so every pre-token before it is the same with or without
    the suffix, and the punctuation with the suffix is pre-tokenized alone as within the whole."""
    if not suffix or suffix[0] not in ASCII_SPACE:
        return -1
    c = len(text)
    while c > 0 and text[c - 1] in CLOSING:
        c -= 1
    return c if c > 0 and text[c - 1] in ASCII_ALNUM else -1


_LEADING_WORD = re.compile(r"[A-Za-z]++(?![^\x00-\x7f]|')")   # a run of ASCII letters, then no apostrophe nor non-ASCII


def leading_word(text: str) -> str | None:
    """The run of ASCII letters text starts with, when nothing or an ASCII character other than a
    letter or an apostrophe follows it (Tokenizer.count_spaced); else None."""
    found = _LEADING_WORD.match(text)
    return found.group() if found else None


def least_tokens(text: str) -> int:
    """A lower bound on a text's tokens, without the tokenizer: its runs between ASCII spaces that hold
    something other than whitespace. In the tiktoken encodings pager uses (cl100k, o200k) a pre-token
    holding a non-space character has an ASCII space at most as its first character (a letter run, a
    digit run or a run of punctuation takes at most one character, which may be a space, in front of
    it; the other pre-tokens are whitespace alone), so each such run needs a pre-token of its own, and
    each pre-token is at least one token. Python's whitespace holds all of the regex's `\\s` (so a run
    counted holds a character no pattern takes for whitespace). Property-tested against the count."""
    return sum(1 for run in text.split(" ") if run and not run.isspace())


KNOWN_MOST = 50_000   # counts a tokenizer keeps from snapshots before it lets them go


class Recorder(Tokenizer):
    """The same encoding, keeping each text it counts with its count: what a later process, given them
    (Tokenizer.learn), can answer without loading the encoding."""

    def __init__(self, of: Tokenizer) -> None:
        super().__init__(of.name)
        self._of = of
        self.seen: dict[str, int] = {}

    @property
    def _enc(self):
        return self._of._enc

    def count(self, text: str) -> int:
        n = self._of.count(text)
        if text:
            self.seen[text] = n
        return n


@lru_cache(maxsize=4)
def get_tokenizer(encoding: str = "cl100k_base") -> Tokenizer:
    return Tokenizer(encoding)


LONGEST_TOKEN = {"cl100k_base": 128, "o200k_base": 128}   # what _longest_token finds in each (tests/test_tokens.py)


@lru_cache(maxsize=None)
def _longest_token(encoding: str) -> int:
    """The longest token's bytes: known for the encodings pager ships with (finding it walks every token,
    a tenth of the tokenizer's load), found in any other."""
    if encoding in LONGEST_TOKEN:
        return LONGEST_TOKEN[encoding]
    return max(len(b) for b in get_tokenizer(encoding)._enc.token_byte_values())
