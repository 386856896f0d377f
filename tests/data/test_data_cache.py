"""Feature cache: content keys, atomic writes, stale or damaged entries are never read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpcl.data.cache import cached_array_path, content_key, default_cache_dir, load_cached_array, save_cached_array


def test_content_key_is_injective_on_boundaries() -> None:
    assert content_key("ab", "c") != content_key("a", "bc")
    assert content_key("m", ["x", "y"]) != content_key("m", ["xy"])
    assert content_key("m", ["x", "y"]) != content_key("m", ["y", "x"])
    assert content_key("m", ["x", "y"]) == content_key("m", ("x", "y"))
    assert len(content_key("m")) == 64


def test_default_cache_dir_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DPCL_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    assert cached_array_path(None, "features", "k") == tmp_path / "c" / "features" / "k.npy"
    monkeypatch.delenv("DPCL_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "dpcl"


def test_round_trip_and_refusals(tmp_path: Path) -> None:
    path = cached_array_path(tmp_path, "features", "abc")
    array = np.random.default_rng(0).random((5, 3)).astype(np.float32)
    save_cached_array(path, array)
    assert [p.name for p in path.parent.iterdir()] == ["abc.npy"]  # no temp file left behind
    assert np.array_equal(load_cached_array(path, expected_rows=5), array)
    assert load_cached_array(path, expected_rows=4) is None  # wrong length: not this entry
    assert load_cached_array(tmp_path / "missing.npy", expected_rows=5) is None
    path.write_bytes(path.read_bytes()[:40])  # truncated
    assert load_cached_array(path, expected_rows=5) is None
    path.write_bytes(b"garbage")
    assert load_cached_array(path, expected_rows=5) is None
    save_cached_array(path, np.full((5, 3), np.nan))
    assert load_cached_array(path, expected_rows=5) is None  # non-finite features are never served
