"""One frozen set of settings, built once (CLI flags, then environment, then defaults).

No other module reads the environment; everything that varies is passed down from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from collections.abc import Mapping
from pathlib import Path

from .errors import ConfigError

POLICIES = ("clock", "lru", "lfu", "scored")

# Environment variable → field, for the settings a user may set outside the CLI.
ENV = {
    "PAGER_HOME": "home",
    "PAGER_DB": "db",
    "PAGER_SESSION": "session",
    "PAGER_USER": "user",
    "PAGER_MODEL": "model",
    "PAGER_BUDGET": "budget",
    "PAGER_POLICY": "policy",
    "PAGER_PAGE_TOKENS": "page_tokens",
    "PAGER_EMBEDDER": "embedder",
    "PAGER_BOOKMARK_MODEL": "bookmark_model",
    "PAGER_MEMORY_MODEL": "memory_model",
    "PAGER_BOOKMARK_BATCH": "bookmark_batch",
    "PAGER_RERANKER": "reranker",
    "PAGER_RECENCY_WEIGHT": "recency_weight",
    "PAGER_LIVE_SUMMARIES": "live_summaries",
    "PAGER_FILL": "fill",
    "PAGER_S3_ENDPOINT": "s3_endpoint",
    "PAGER_S3_REGION": "s3_region",
    "PAGER_S3_ALLOW_HTTP": "s3_allow_http",
    "PAGER_DYNAMODB_ENDPOINT": "dynamodb_endpoint",
    "PAGER_LEASE_S": "lease_s",
    "PAGER_LEASE_WAIT_S": "lease_wait_s",
    "PAGER_LEASE_IDLE_S": "lease_idle_s",
    "PAGER_PAGING": "paging",
    "PAGER_API_BASE": "api_base",
}

PAGING = ("auto", "tools", "automatic")
# the variables litellm itself reads for an openai/… model's server: the same URL, so the paging default sees it
OPENAI_BASE_ENV = ("OPENAI_API_BASE", "OPENAI_BASE_URL")

# The usual AWS variables → LanceDB storage option, read here so no other module reads the
# environment; PAGER_S3_* settings win over them. (LanceDB's object store reads AWS_* itself too.)
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "aws_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
    "AWS_SESSION_TOKEN": "aws_session_token",
    "AWS_ENDPOINT_URL": "endpoint",
    "AWS_ENDPOINT_URL_S3": "endpoint",
    "AWS_DEFAULT_REGION": "region",
    "AWS_REGION": "region",
    "AWS_ALLOW_HTTP": "allow_http",
}


# Tokens a chat needs besides its two pages (the open tail and one page of memory to answer from):
# the short system prompt, a memory map and a message (pager.agent.minimum_budget computes it from
# the prompt files; a test holds the two equal).
CHAT_FLOOR = 178
# the largest context window a model has (10M tokens): a budget past it fits no model, and each frame
# of it is a slot in memory (a budget of 10^11 asked for 20 GB before the chat could lower it)
MOST_BUDGET = 10_000_000


@dataclass(frozen=True)
class Config:
    home: Path = field(default_factory=lambda: Path.home() / ".pager")  # journal, traces, default db
    db: str = ""                 # LanceDB URI; empty means <home>/db (may be s3://…)
    session: str = "default"     # namespace of one conversation
    user: str = ""               # namespace of one person across sessions
    model: str = ""              # litellm model string; empty means the offline memory shell
    budget: int = 8192           # tokens of the whole prompt the model sees
    page_tokens: int = 128       # tokens per page and per frame, header included (chosen by measurement)
    policy: str = ""             # eviction policy: clock, lru, lfu, scored; empty: the session's own, else clock
    map_tokens: int = 0          # memory-map reserve; 0 means budget/32 clamped to [48, 384]
    output_tokens: int = 1024    # reserved for the model's reply, outside the budget
    pressure: float = 0.85       # frames-in-use share above which the model is warned
    autopage_share: float = 0.9  # share of frames automatic paging may fill; the rest keeps recent pages
    autopage_min_score: float = 0.2  # fused relevance a page needs to fault in on its own
    state_share: float = 0.15    # share of the memory budget the working state may take (it comes before pages)
    fact_share: float = 0.5      # the most of the frames fact slabs may take; how many they take is decided per message
    summary_share: float = 0.1   # share of the frames episode summaries may take when the session has them
    excerpt_slabs: int = 0       # frames of excerpts (a turn no fact tells, of a page found but not held) with facts; 0: off
    fill: bool = True            # the tokens the frames leave over show more facts, then whole turns of pages on disk
    fact_dates: bool = True      # a fact dated inside a date the message names ranks as a page there does (search's date signal)
    reranker: str = ""           # litellm rerank model reordering the search's best pieces and facts (pager/rerank.py); empty: none
    rerank_pieces: int = 100     # the page search's best pieces the reranker reorders; 0: none
    rerank_facts: int = 60       # the best-ranked facts the reranker reorders; 0: none
    live_summaries: bool = True  # chat, the agent loop and serve summarize each episode as it closes (and the rolling one)
    readahead: int = 1           # neighbours faulted with a page on each side, when they fit
    recency_weight: float = 0.0  # weight of page recency in search (half as recent every 50 pages); 0: off
    supersede: bool = True       # a page saying a value changed ranks above the page it updates (search.Index.supersedes)
    supersede_tail: bool = True  # the open page too, when one of its lines says so (search.Index.over_tail)
    words_first: bool = True     # a page's automatic keywords are its words, numbers after them, at most two (bookmarks.extract)
    weak_similarity: float = 0.4  # a search hit holding no word of the query and nearer than this by meaning only is weak; 0: none
    max_steps: int = 8           # model calls per user message before the loop stops
    paging: str = "auto"         # tools (the model pages through tools too), automatic (pager alone), auto: by the model
    api_base: str = ""           # the model server's URL (a local llama.cpp or vLLM server); empty: the provider's own
    flush_turns: int = 1024      # journal records buffered before a batched store write
    compact_every: int = 16      # batched store writes between compactions
    keep_versions_s: float = 60.0  # age of old LanceDB versions that compaction removes
    embedder: str = "wordllama"  # wordllama, minilm (a sentence encoder, its optional package), hash, or a litellm embedding model
    bookmark_model: str = ""     # litellm model that writes bookmarks of sealed pages; empty: offline extraction only
    bookmark_batch: int = 8      # sealed pages per bookmark-writer call (and per memory-model call)
    memory_model: str = ""       # litellm model that writes bookmarks, facts and state of sealed pages, one call a batch
    tokenizer: str = ""          # tiktoken encoding; empty means chosen from the model
    s3_endpoint: str = ""        # S3-compatible endpoint URL (MinIO, R2, a local server); empty: AWS
    s3_region: str = ""          # S3 region; most S3-compatible servers want one (us-east-1)
    s3_allow_http: str = ""      # "true" lets the store talk plain http (a local S3 server)
    dynamodb_endpoint: str = ""  # DynamoDB's URL for an s3+ddb:// store not on AWS (a local server); empty: AWS
    aws: tuple = field(default=(), repr=False)  # (storage option, value) pairs from AWS_*; kept out of repr
    lease_s: float = 30.0        # a session's write lease lapses this long after its holder was last seen
    lease_wait_s: float = 0.0    # how long a writer waits for another host's lease; 0 refuses at once
    lease_idle_s: float = 60.0   # a lease not used to write for this long is given up (after a flush); 0: kept until close

    def __post_init__(self) -> None:
        for name in ("session", "user", "db", "model"):   # Config(session=123) failed later, as an AttributeError
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ConfigError(f"{name} must be text, not {type(value).__name__} {str(value)[:40]}; "
                                  f"give it as a string, e.g. {name}={str(value)[:40]!r}")
        if not isinstance(self.home, (str, os.PathLike)):
            raise ConfigError(f"home must be a folder path (a string or a Path), not {type(self.home).__name__} "
                              f"{str(self.home)[:40]}")
        if not str(self.home).strip():   # Path("") is the current folder: never what `--home ""` meant
            raise ConfigError("the home is empty; give a folder with --home (or PAGER_HOME), or leave it unset for ~/.pager")
        object.__setattr__(self, "home", Path(self.home).expanduser())
        if self.page_tokens < 48:
            raise ConfigError(f"page_tokens {self.page_tokens} is too small for a page header; use 48 or more")
        if self.policy and self.policy not in POLICIES:
            raise ConfigError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.budget < 2 * self.page_tokens + CHAT_FLOOR:
            fits = (self.budget - CHAT_FLOOR) // 2
            smaller = (f"lower --page-tokens where the command has it (or PAGER_PAGE_TOKENS) to at most {fits}, or "
                       if fits >= 48 else "")
            raise ConfigError(
                f"budget {self.budget} cannot hold a prompt, a memory map, the open page and one page of memory "
                f"({self.page_tokens} tokens each) and a message; {smaller}raise the budget (--budget where the "
                f"command has it, or PAGER_BUDGET) to at least {2 * self.page_tokens + CHAT_FLOOR}"
            )
        if self.budget > MOST_BUDGET:
            raise ConfigError(f"budget {self.budget} is larger than any model's context window; use at most "
                              f"{MOST_BUDGET} (--budget where the command has it, or PAGER_BUDGET): a chat lowers "
                              "a budget to fit its model by itself")
        for name in ("rerank_pieces", "rerank_facts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} {getattr(self, name)} is negative; give how many candidates to reorder, "
                                  "or 0 for none")
        if not 0 < self.autopage_share <= 1:
            raise ConfigError("autopage_share must be in (0, 1]")
        if not 0 <= self.fact_share < 1:
            raise ConfigError(f"fact_share {self.fact_share} must be in [0, 1)")
        if self.excerpt_slabs < 0:
            raise ConfigError(f"excerpt_slabs {self.excerpt_slabs} must be 0 or more")
        if not 0 <= self.summary_share < 1:
            raise ConfigError(f"summary_share {self.summary_share} must be in [0, 1)")
        if not 0 <= self.state_share < 1:
            raise ConfigError(f"state_share {self.state_share} must be in [0, 1)")
        if self.recency_weight < 0:
            raise ConfigError(f"recency_weight {self.recency_weight} must be 0 or more")
        if not 0 <= self.weak_similarity < 1:
            raise ConfigError(f"weak_similarity {self.weak_similarity} must be in [0, 1)")
        if self.lease_s <= 0 or self.lease_wait_s < 0 or self.lease_idle_s < 0:
            raise ConfigError(f"lease_s {self.lease_s} must be above 0, lease_wait_s {self.lease_wait_s} and "
                              f"lease_idle_s {self.lease_idle_s} 0 or more")
        if self.memory_model and self.bookmark_model and self.memory_model != self.bookmark_model:
            raise ConfigError("the memory model writes the bookmarks too, in the same call; give --memory-model "
                              "(PAGER_MEMORY_MODEL) alone, or drop it for --bookmark-model")
        if self.paging not in PAGING:
            raise ConfigError(f"unknown paging {self.paging!r}; choose tools (the model pages through tools), "
                              "automatic (pager pages alone, for small or slow models) or auto (decided by the model)")
        if self.bookmark_batch < 1:
            raise ConfigError(f"bookmark_batch {self.bookmark_batch} must be 1 or more")
        if self.db and "://" in self.db and not self.db.startswith("file://"):
            self._check_object_store()

    def _check_object_store(self) -> None:
        """Settings LanceDB would only trip over on its first request (a Rust panic, a parse error naming
        its own source file), refused here naming the setting."""
        scheme, _, rest = self.db.partition("://")
        if not rest.split("/")[0].split("?")[0]:
            raise ConfigError(f"--db {self.db!r} names no bucket; give {scheme}://BUCKET/PREFIX (or PAGER_DB)")
        aws = dict(self.aws)
        endpoint, allow = self.s3_endpoint or aws.get("endpoint", ""), self.s3_allow_http or aws.get("allow_http", "")
        where = "PAGER_S3_ENDPOINT" if self.s3_endpoint else "AWS_ENDPOINT_URL"
        if endpoint and not endpoint.lower().startswith(("http://", "https://")):
            raise ConfigError(f"{where}={endpoint!r} is not a URL; give the scheme too, e.g. {where}=http://{endpoint} "
                              f"(or https://)")
        flag = "PAGER_S3_ALLOW_HTTP" if self.s3_allow_http else "AWS_ALLOW_HTTP"
        if allow and allow.strip().lower() not in ("true", "false"):
            raise ConfigError(f"{flag}={allow!r} is not true or false; set {flag}=true to allow plain http")
        if endpoint.lower().startswith("http://") and allow.strip().lower() == "false":
            raise ConfigError(f"{flag}=false refuses plain http, and {where} is {endpoint}; set {flag}=true "
                              f"(or unset it: an http:// endpoint allows http), or give an https:// endpoint")

    @property
    def writer_model(self) -> str:
        """The model that names sealed pages: the memory model if set, else the bookmark model; "" for none."""
        return self.memory_model or self.bookmark_model

    @property
    def db_uri(self) -> str:
        return self.db or str(self.home / "db")

    @property
    def storage_options(self) -> dict[str, str]:
        """LanceDB `storage_options` for an object-store --db: AWS_* variables, then PAGER_S3_* settings
        (and PAGER_DYNAMODB_ENDPOINT for s3+ddb://, whose commits go through a DynamoDB table)."""
        options = dict(self.aws)
        for key, value in (("endpoint", self.s3_endpoint), ("region", self.s3_region),
                           ("allow_http", self.s3_allow_http)):
            if value:
                options[key] = value
        if self.dynamodb_endpoint and self.db_uri.startswith("s3+ddb://"):
            options["dynamodb_endpoint"] = self.dynamodb_endpoint  # LanceDB's DynamoDB commit store
        if options.get("endpoint", "").startswith("http://") and "allow_http" not in options:
            options["allow_http"] = "true"  # an http:// endpoint says so already
        return options

    @property
    def map_reserve(self) -> int:
        return self.map_tokens or max(48, min(384, self.budget // 32))

    @property
    def encoding(self) -> str:
        from .tokens import encoding_for_model

        return self.tokenizer or encoding_for_model(self.model)

    def with_(self, **changes) -> "Config":
        return replace(self, **changes)

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **flags) -> "Config":
        """Flags that are not None win over the environment, which wins over the defaults."""
        source = os.environ if env is None else env
        types = {f.name: str(f.type) for f in fields(cls)}   # annotations are strings here ("int")
        values: dict = {}
        for var, name in ENV.items():
            if source.get(var):
                values[name] = _coerce(name, types[name], source[var], var)
        aws = {option: source[var] for var, option in AWS_ENV.items() if source.get(var)}
        if aws:
            values["aws"] = tuple(sorted(aws.items()))
        values.update({k: v for k, v in flags.items() if v is not None})
        if not values.get("api_base") and any(str(values.get(k, "")).startswith("openai/")
                                              for k in ("model", "memory_model", "bookmark_model")):
            values["api_base"] = next((source[v] for v in OPENAI_BASE_ENV if source.get(v)), "")
        return cls(**values)


def _coerce(name: str, type_name: str, raw: str, source: str):
    if type_name == "bool":
        if raw.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if raw.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{source}={raw!r} is not on or off; set {source}=1 or {source}=0")
    try:
        if type_name == "int":
            return int(raw)
        if type_name == "float" and float(raw) == float(raw):   # NaN passes every "must be above" check unseen
            return float(raw)
        if type_name == "float":
            raise ValueError(raw)
    except ValueError:
        raise ConfigError(f"{source}={raw!r} is not a number; fix or unset {source}") from None
    return raw


MAX_NAME = 200   # a session name's length, so that every session can be reached at /sessions/{name}


def name_problem(name: str) -> str:
    """Why a new session may not have this name ("" if it may): at most MAX_NAME printable characters,
    no "/" (a session is one path segment of `pager serve`'s /sessions/{name})."""
    if not name.strip():
        return "must be a non-empty session name"
    if len(name) > MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"must be at most {MAX_NAME} printable characters"
    if name in (".", ".."):
        return "is a path step, not a name (/sessions/. cannot be reached); pick a name with a letter"
    if "/" in name:
        return (f'must not contain "/" (a session is one path segment of /sessions/{{name}}); use another '
                f"character, e.g. {name.replace('/', '-')!r}")
    return ""

