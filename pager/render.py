"""How a page appears in the prompt: its header, its body, its token cost, a snippet of it.

Headers and block costs are cached per page (a sealed page's body never changes; its header
changes only when its bookmarks do), so a page costs tokenizer time once, when first shown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .page import header_reserve, page_id
from .search import Hit

if TYPE_CHECKING:
    from .session import Session


_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def starts_clean(body: str) -> bool:
    """Does a body after a header's "]\n" start a pre-token of its own (Renderer.block_tokens)?"""
    return bool(body) and not body[0].isspace() and body[0] != "/"


_SUMMED = {"\n": 0, "\n\n": 0, "": 1}   # the separators after a block's last line list_tokens sums shares for: less this


class Renderer:
    def __init__(self, session: "Session") -> None:
        self.s = session
        self._headers: dict[int, tuple[tuple, str, int | None]] = {}   # n → (what it was made of, header, its tokens with "\n")
        self._keyword_costs: dict[str, int] = {}
        self._block_costs: dict[int, tuple[str, int]] = {}
        self._line_costs: dict[str, int] = {}
        self._line_shares: dict[str, int] = {}   # line → line_share
        self._body_costs: dict[int, tuple[str, int, int]] = {}
        self._blocks: dict[int, tuple[tuple[str, ...], str, str, int]] = {}   # n → (bookmarks shown, separator, block, tokens)
        self._map_count: tuple[str, int] | None = None
        self._tail_count: tuple[str, str, int] | None = None   # the open tail's last block, separator, tokens
        self._message_count: tuple[str, int] | None = None
        self._fixed: tuple[int, int, int, int, int] | None = None
        self._excerpt_head: tuple[int, str, int] | None = None   # (page, date, tokens of "- p42 · 8 May 2023 ·")
        self._newest: tuple[int, list[int]] | None = None
        self.state_block: tuple | None = None   # (what it was made of, the working state's block): context.render_state
        self.rolling_line: tuple | None = None   # (summary line, {room: the map's line}): context.rolling_line

    def body(self, n: int, hide_turn: int = 0) -> str | None:
        """Text of page n as the model sees it; the current message is shown once, as the message."""
        if n == self.s.tail_n:
            pieces = [p for p in self.s.packer.pieces if p.turn.turn != hide_turn]
            return "\n".join(p.line for p in pieces) if pieces else None
        page = self.s.pages[n]
        if hide_turn and all(t == hide_turn for t, _, _ in page.spans):
            return None
        return page.text

    def block(self, n: int, separator: str, hide_turn: int = 0) -> tuple[str, int] | None:
        """Page n's block (header, newline, body) and its tokens with the separator after it (None if
        nothing of it is shown). A sealed page's block and count are kept while its bookmarks are the
        same (its body and date never change), so a page shown again costs a lookup. The current
        message's turn (hide_turn) hides only a page holding nothing else: other sealed pages are
        their text, and keep their block, in every step of a turn."""
        page = self.s.pages.get(n) if n != self.s.tail_n else None
        if page is None or (hide_turn and all(t == hide_turn for t, _, _ in page.spans)):
            body = self.body(n, hide_turn)
            if body is None:
                return None
            header = self.header(n)
            block = header + "\n" + body
            return block, self.block_tokens(n, header, block, separator)
        keywords = tuple(self.s.directory.keywords(n)[:4])
        held = self._blocks.get(n)
        if held is not None and held[0] == keywords and held[1] == separator:
            return held[2], held[3]
        header = self.header(n)
        block = header + "\n" + page.text
        cost = self.block_tokens(n, header, block, separator)
        self._blocks[n] = (keywords, separator, block, cost)
        return block, cost

    def page_dates(self, n: int) -> str:
        """The date a page starts on (the open tail's first turn for the tail)."""
        if n == self.s.tail_n:
            pieces = self.s.packer.pieces
            return pieces[0].turn.date if pieces else ""
        return self.s.pages[n].date_first

    def header(self, n: int) -> str:
        """`[p42 · 8 May 2023 · bookmarks: a, b]`, with as many bookmarks as fit the header reserve."""
        date = self.page_dates(n)
        keywords = tuple(self.s.directory.keywords(n)[:4])
        key = (n, date, keywords)
        cached = self._headers.get(n)
        if cached and cached[0] == key:
            return cached[1]
        limit = header_reserve(self.s.page_tokens)
        base = "[" + " · ".join([page_id(n)] + ([date] if date else []))
        if self._parts_exact(date, keywords):
            cut, line = self._fit_by_parts(n, date, keywords, limit)
        else:
            cut, line = self._fit_counted(base, keywords, limit), None
        if cut < 0:
            text = f"[{page_id(n)}]"
        else:
            text = f"{base} · bookmarks: {', '.join(keywords[:cut])}]" if cut else base + "]"
        # the header with its newline, as block_tokens counts it (None: count it there)
        self._headers[n] = (key, text, line)
        return text

    def _fit_by_parts(self, n: int, date: str, keywords: tuple[str, ...], limit: int) -> tuple[int, int]:
        """(how many bookmarks fit the header, -1 for not even its date; the tokens of that header with
        its newline), from the exact counts of its parts (_header_parts): adding a bookmark adds its
        parts' tokens, so the most that fit are found in one pass."""
        opening, close, close_line, comma, marks = self._fixed_parts()
        digits = self._digit_tokens(n)
        head = opening + digits + (self.line_tokens(" · " + date) if date else 0)
        if head + close > limit:
            return -1, opening + digits + close_line
        fitted, cut = head, 0   # the header so far without its "]"
        used = head + marks - comma
        for keyword in keywords:
            used += self._keyword_tokens(keyword) + comma
            if used + close > limit:
                break
            fitted, cut = used, cut + 1
        return cut, fitted + close_line

    def _digit_tokens(self, n: int) -> int:
        """Tokens of a page number's digits, in runs of three (each run a pre-token of its own)."""
        digits, table = str(n), self.s.tokenizer.digit_tokens
        if len(digits) <= 3:
            return table(digits)
        return sum(table(digits[i:i + 3]) for i in range(0, len(digits), 3))

    def _fixed_parts(self) -> tuple[int, int, int, int, int]:
        """The counts of the parts every header has ("[p", "]", "]\n", ",", " · bookmarks:"), once."""
        held = self._fixed
        if held is None:
            part = self.line_tokens
            held = self._fixed = (part("[p"), part("]"), part("]\n"), part(","), part(" · bookmarks:"))
        return held

    def _fit_counted(self, base: str, keywords: tuple[str, ...], limit: int) -> int:
        """How many bookmarks fit the header (-1 for not even its date), by counting whole headers."""
        count = self.s.tokenizer.count
        # estimate from cached per-keyword costs, then verify exactly: one or two counts instead of five
        room = limit - count(base + "]") - 3
        cut, used = 0, 0
        for keyword in keywords:
            used += self._keyword_tokens(keyword) + 1
            if used > room:
                break
            cut += 1

        def render(k: int) -> str:
            return f"{base} · bookmarks: {', '.join(keywords[:k])}]" if k else base + "]"

        for cut in range(cut, -1, -1):  # noqa: B020 - the estimate is cautious: step down until it fits ...
            if count(render(cut)) <= limit:
                break
        else:
            return -1
        while cut < len(keywords) and count(render(cut + 1)) <= limit:
            cut += 1  # ... then up while one more keyword still fits
        return cut

    @staticmethod
    def _parts_exact(date: str, keywords: tuple[str, ...]) -> bool:
        """Can a header with this date and these bookmarks be counted by its parts (_header_parts)?"""
        return (not date or date[-1] in _ALNUM) and all(k and k[-1] in _ALNUM for k in keywords)

    def _header_parts(self, n: int, date: str, keywords: tuple[str, ...], end: str) -> int:
        """Exact tokens of a header ending in `end` ("]" or "]\n") as a sum of cached counts of its parts:
        "[p", the page number's digits in threes, " · " and the date, " · bookmarks:", each bookmark
        after its space, the commas and the end. Each part ends where a pre-token ends in the tiktoken
        encodings pager uses (cl100k, o200k), whatever follows: a run of digits (at most three to a
        pre-token) or a part ending in an ASCII letter or digit (the date, a bookmark) before a space
        or punctuation, and punctuation before a space; so the parts are pre-tokenized alone as they
        are in the whole, and BPE never merges across pre-tokens. The caller checks the date and
        bookmarks end in an ASCII letter or digit (_parts_exact); a property test holds the sum
        against the whole count."""
        part = self.line_tokens   # a header part's count, cached like a map line's
        cost = part("[p") + self._digit_tokens(n) + (part(end) if end else 0)
        if date:
            cost += part(" · " + date)
        if keywords:
            cost += part(" · bookmarks:") + (len(keywords) - 1) * part(",") + sum(map(self._keyword_tokens, keywords))
        return cost

    def block_tokens(self, n: int, header: str, block: str, separator: str) -> int:
        """Tokens of a page's block (header, newline, body) with the separator that follows it.

        For a sealed page it is the sum of two cached counts: the header with its newline, and the
        body with the separator. The sum is exact: the header ends in "]", and in the tiktoken
        encodings pager uses (cl100k, o200k) the pre-token "]\n" ends at the newline unless the
        next character is a newline, "\r" or "/" (o200k's `[\r\n/]*`); a body starting with any
        other non-space character (a speaker's name, a "(date)" marker) starts a pre-token of its
        own, and BPE never merges across pre-tokens. Other bodies are counted whole. So a page's
        body costs the tokenizer once, however often its header changes (bookmarks are added)."""
        if n == self.s.tail_n:   # the open tail: counted whole, the last one kept (every step of a turn shows it)
            held = self._tail_count
            if held is None or held[0] != block or held[1] != separator:
                held = self._tail_count = (block, separator, self.s.tokenizer.count(block + separator))
            return held[2]
        cached = self._block_costs.get(n)
        if cached and cached[0] == header:
            return cached[1]
        body = block[len(header) + 1:]
        if block.startswith(header + "\n") and header.endswith("]") and starts_clean(body):
            costs = self._body_costs.get(n)
            if costs is None or costs[:2] != (separator, len(body)):
                costs = self._body_costs[n] = (separator, len(body), self._body_tokens(n, body, separator))
            line = self._headers.get(n)
            head = line[2] if line and line[1] == header and line[2] is not None else self.s.tokenizer.count(header + "\n")
            cost = head + costs[2]
        else:
            cost = self.s.tokenizer.count(block + separator)
        self._block_costs[n] = (header, cost)
        return cost

    def _body_tokens(self, n: int, body: str, separator: str) -> int:
        """Tokens of a page's body with the separator after it. A sealed page's body was counted
        exactly when it was packed (Page.tokens, by the packer's tokenizer): when that is the one
        the context is counted with, only the body's last words are counted again with the
        separator (Tokenizer.count_extended)."""
        page = self.s.pages.get(n)
        if page is not None and page.text == body and self.s.packer.tokenizer is self.s.tokenizer and page.tokens > 0:
            return self.s.tokenizer.count_extended(body, page.tokens, separator)
        return self.s.tokenizer.count(body + separator)

    def newest_first(self) -> list[int]:
        """The sealed pages' numbers, newest first (the map lists recent pages; pages are never removed,
        so the list changes only when one is added)."""
        held = self._newest
        if held is None or held[0] != len(self.s.pages):
            held = self._newest = (len(self.s.pages), sorted(self.s.pages, reverse=True))
        return held[1]

    def count_map(self, text: str) -> int:
        """Tokens of a memory map; the last one counted is kept (render_map counts it, then assembly)."""
        held = self._map_count
        if held is None or held[0] != text:
            held = self._map_count = (text, self.s.tokenizer.count(text))
        return held[1]

    def map_counted(self, text: str, tokens: int) -> None:
        """Keep a memory map's exact count, made by render_map from its parts, for count_map."""
        self._map_count = (text, tokens)

    def line_tokens(self, line: str) -> int:
        """Tokens of a text counted again and again (a memory-map line, a header's part), cached: the map
        lists the same pages' bookmarks turn after turn, headers repeat their dates and bookmarks."""
        cost = self._line_costs.get(line)
        return cost if cost is not None else self._keep(line, self.s.tokenizer.count(line))

    def known_lines(self) -> dict[str, int]:
        """The texts line_tokens has counted and their counts (read only: a lookup without a call)."""
        return self._line_costs

    def known_shares(self) -> dict[str, int]:
        """The lines line_share has answered and their shares (read only: a lookup without a call)."""
        return self._line_shares

    def head_tokens(self, title: str, separator: str) -> int:
        """What a block's title adds to the shares of its lines, all of which have one, in list_tokens's sum."""
        return self.line_tokens(title + "\n") - _SUMMED[separator]

    def _keep(self, key: str, cost: int) -> int:
        """Cache a text's count (the cache is cleared past 100,000 texts) and return it."""
        if len(self._line_costs) > 100_000:
            self._line_costs.clear()
        self._line_costs[key] = cost
        return cost

    def message_tokens(self, message: str) -> int:
        """Tokens of the current message: sizing the frames and assembly both count it; the last is kept."""
        held = self._message_count
        if held is None or held[0] != message:
            held = self._message_count = (message, self.s.tokenizer.count(message))
        return held[1]

    def list_tokens(self, title: str, lines: list[str], separator: str) -> int:
        """Exact tokens of `"\n".join([title, *lines]) + separator` (a facts slab, the summaries block,
        the memory map) as a sum of cached counts: the title with its newline, each line with its
        newline, the last with the separator. The sum is exact when every line starts clean, with
        neither whitespace nor "/" (a fact or summary line's "-", a map line, a notice): in the
        tiktoken encodings pager uses (cl100k, o200k) no pre-token runs from a newline into such a
        character (a newline only ends a pre-token, or joins whitespace before it, or, in o200k, a
        "/" after it), and BPE never merges across pre-tokens. Any other line makes it count the
        whole text."""
        if not lines:
            return self.line_tokens(title + separator)
        if separator in _SUMMED:   # each line's share known once (line_share): one lookup per line
            shares = self._line_shares
            total = 0
            for line in lines:
                share = shares.get(line)
                if share is None:
                    share = self.line_share(line)
                if not share:
                    break
                total += share
            else:
                return self.line_tokens(title + "\n") + total - _SUMMED[separator]
        if not all(map(starts_clean, lines)):
            return self.s.tokenizer.count("\n".join([title, *lines]) + separator)
        cost = self.line_tokens(title + "\n") + self._with_suffix(lines[-1], separator)
        for line in lines[:-1]:
            cost += self._with_suffix(line, "\n")
        return cost

    def line_share(self, line: str) -> int:
        """What a line adds to a block that list_tokens counts, the same wherever it stands (its tokens and
        one for the newline or separator after it; one fewer when it is last with nothing after it), or 0
        when that does not hold: it does not start clean, or a newline or separator after it is not one
        token of its own. Kept per line, so that a block of lines seen before is summed from one lookup each."""
        share = self._line_shares.get(line)
        if share is None:
            own = self.line_tokens(line)
            regular = (starts_clean(line) and self._with_suffix(line, "\n") == own + 1
                       and self._with_suffix(line, "\n\n") == own + 1)
            if len(self._line_shares) > 100_000:
                self._line_shares.clear()
            share = self._line_shares[line] = own + 1 if regular else 0
        return share

    def count_block_line(self, line: str) -> None:
        """Count a line (a fact's, a summary's) as the blocks holding it will sum it: its share
        (line_share), or, where it has none, the line with a newline and with a separator after it."""
        if not self.line_share(line):
            self._with_suffix(line, "\n")
            self._with_suffix(line, "\n\n")

    def _with_suffix(self, line: str, suffix: str) -> int:
        """Tokens of line + suffix (a newline, a separator), cached like line_tokens; from the line's own
        cached count when there is one (the memory map counts each line to fit it, an excerpt line is
        counted from its parts, excerpt_counted), by Tokenizer.count_extended."""
        key = line + suffix
        cost = self._line_costs.get(key)
        if cost is None:
            own = self._line_costs.get(line)
            cost = self._keep(key, self.s.tokenizer.count_extended(line, own, suffix) if own is not None
                              else self.s.tokenizer.count(key))
        return cost

    def excerpt_counted(self, line: str, n: int, date: str, text: str, own: int) -> None:
        """Keep the count of an excerpt line, `- p42 · 8 May 2023 · text`, made from its parts when its
        text's own count is known (`own`: the piece's count stored with its page, made when the page
        was packed, Page.piece_tokens; -1 if not), so that showing it costs the tokenizer nothing
        for its text. The parts are those of a header (_header_parts: "- p" for "[p", the page
        number's digits in threes, " · " and the date, which must end in an ASCII letter or digit),
        then " ·", then the text after its space (Tokenizer.count_spaced): each part ends where a
        pre-token ends in cl100k and o200k (a "·" ends a punctuation run before a space), so the sum
        is the count of the line; a property test holds it against the whole count."""
        if own < 0 or self.s.packer.tokenizer is not self.s.tokenizer:
            return
        spaced = self.s.tokenizer.count_spaced(text, own)
        if spaced is None:
            return
        held = self._excerpt_head
        if held is None or held[0] != n or held[1] != date:   # a page's pieces come one after another, most often
            if date and date[-1] not in _ALNUM:
                return
            part = self.line_tokens
            held = self._excerpt_head = (n, date, part("- p") + self._digit_tokens(n)
                                         + (part(" · " + date) if date else 0) + part(" ·"))
        self._keep(line, held[2] + spaced)

    def _keyword_tokens(self, keyword: str) -> int:
        cost = self._keyword_costs.get(keyword)
        if cost is None:
            cost = self._keyword_costs[keyword] = self.s.tokenizer.count(" " + keyword)
        return cost

    def snippet(self, hit: Hit, width: int = 160) -> str:
        """The hit's best piece of text, on one line, cut to width characters."""
        if hit.n == self.s.tail_n:
            pieces = self.s.packer.pieces
            text = pieces[-1 - hit.piece].line if pieces and 0 <= -1 - hit.piece < len(pieces) else ""
        else:
            page = self.s.pages[hit.n]
            first = self.s.index.page_pieces[hit.n][0]
            i = hit.piece - first if 0 <= hit.piece - first < len(page.spans) else 0
            text = page.piece_text(i) if page.lines else page.text
        text = " ".join(text.split())
        return text if len(text) <= width else text[: width - 1] + "…"
