"""The index cache: a session's search index and its pages' columns kept between processes, the
index's arrays mapped from the file rather than copied, and the store read again only from the last
page the cache holds."""

import os
import pickle

import numpy as np
import pyarrow as pa

from pager.caches import SCHEMA_VERSION, read_mapped, write_mapped
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.store import LanceStore

QUERY = "topic7 harbour"


def _config(tmp_path) -> Config:
    return Config(home=tmp_path / "h", page_tokens=64, embedder="hash")


def _session(cfg: Config, turns: int = 400, start: int = 0) -> list[int]:
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        s.append_many([{"speaker": "ann", "text": f"note {i} about topic{i % 13} and the harbour"}
                       for i in range(start, start + turns)])
        return [h.n for h in s.search(QUERY, k=5, record=False)]


def _cache_file(cfg: Config):
    files = list((cfg.home / "cache").glob("*.index"))
    assert len(files) == 1, files
    return files[0]


class _Reads:
    """Each read of the pages table an open makes: its filter and the rows it returned."""

    def __init__(self, monkeypatch) -> None:
        self.rows: list[int] = []
        self.filtered: list[bool] = []
        read = LanceStore._read

        def counted(store, name, user, session, extra, columns, fetch):
            got = read(store, name, user, session, extra, columns, fetch)
            if name == "pages" and isinstance(got, pa.Table):
                self.rows.append(got.num_rows)
                self.filtered.append(extra is not None)
            return got

        monkeypatch.setattr(LanceStore, "_read", counted)


def _stored_pages(cfg: Config) -> list[dict]:
    """Every stored page as the store itself decodes it, for comparison."""
    with Home(cfg, embedder=HashEmbedder(), read_only=True) as home:
        pages, _ = home.store.pages("", "c", with_vectors=False)
        return [p.__dict__ for p in pages]


def test_a_second_open_reads_only_the_pages_the_cache_does_not_hold(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    expected = _session(cfg)
    version, index, columns = read_mapped(_cache_file(cfg))
    assert version == SCHEMA_VERSION and columns is not None and columns.num_rows == len(index.page_pieces)
    reads = _Reads(monkeypatch)
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        assert s.index_saved == len(s.index)   # the index from the cache
        assert reads.filtered == [True] and reads.rows == [1]   # its last page only, compared with the cache's
        assert [h.n for h in s.search(QUERY, k=5, record=False)] == expected
        opened = [p.__dict__ for p in s.pages.values()]
    assert opened == _stored_pages(cfg)


def test_pages_another_process_sealed_after_the_cache_are_read_from_the_store(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    _session(cfg)
    cached = read_mapped(_cache_file(cfg))[2].num_rows
    # a process whose cache file is gone seals more pages: the cache on disk is then the first one's
    kept = _cache_file(cfg).read_bytes()
    _session(cfg, turns=200, start=400)
    planted = _cache_file(cfg).with_suffix(".planted")
    planted.write_bytes(kept)
    os.replace(planted, _cache_file(cfg))
    reads = _Reads(monkeypatch)
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        assert len(s.pages) > cached
        opened = [p.__dict__ for p in s.pages.values()]
    assert opened == _stored_pages(cfg)
    assert reads.rows[0] == len(opened) - cached + 1   # from the cache's last page on, not every page


def test_columns_of_another_schema_version_are_read_again_and_the_index_kept(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    expected = _session(cfg)
    _, index, columns = read_mapped(_cache_file(cfg))
    planted = _cache_file(cfg).with_suffix(".planted")
    write_mapped(planted, (SCHEMA_VERSION - 1, index, columns))
    os.replace(planted, _cache_file(cfg))
    reads = _Reads(monkeypatch)
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        assert reads.filtered == [False]   # every page read
        assert len(s.index) == len(index) and [h.n for h in s.search(QUERY, k=5, record=False)] == expected
    assert read_mapped(_cache_file(cfg))[0] == SCHEMA_VERSION   # written again at the close, with the columns


def test_a_cache_cut_short_is_ignored_and_the_index_rebuilt(tmp_path):
    cfg = _config(tmp_path)
    expected = _session(cfg)
    whole = _cache_file(cfg).read_bytes()
    planted = _cache_file(cfg).with_suffix(".planted")
    planted.write_bytes(whole[:len(whole) // 2])
    os.replace(planted, _cache_file(cfg))
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        assert s.index_saved == -1   # rebuilt from the store
        assert [h.n for h in s.search(QUERY, k=5, record=False)] == expected


def test_an_open_session_keeps_its_mapped_index_when_another_process_replaces_the_file(tmp_path):
    cfg = _config(tmp_path)
    _session(cfg)
    with Home(cfg, embedder=HashEmbedder(), read_only=True) as reader:
        s = reader.open("c", read_only=True)
        mapped = s.index.vectors()
        assert not mapped.flags.owndata   # read in place from the cache file
        held = mapped.copy()
        _session(cfg, turns=300, start=400)   # another home seals more pages and replaces the cache file
        assert np.array_equal(mapped, held)   # the file this session mapped is still the one it reads
        assert s.search(QUERY, k=5, record=False)


def test_a_plain_pickle_cache_is_read_and_written_again_mapped(tmp_path):
    cfg = _config(tmp_path)
    expected = _session(cfg)
    _, index, _ = read_mapped(_cache_file(cfg))
    planted = _cache_file(cfg).with_suffix(".planted")
    planted.write_bytes(pickle.dumps(index, protocol=5))   # an index pickled whole, as an earlier pager cached it
    os.replace(planted, _cache_file(cfg))
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        assert len(s.index) == len(index) and s.index_saved == -1   # used, and owed a cache with its columns
        assert [h.n for h in s.search(QUERY, k=5, record=False)] == expected
    version, _, columns = read_mapped(_cache_file(cfg))
    assert version == SCHEMA_VERSION and columns.num_rows == len(index.page_pieces)
