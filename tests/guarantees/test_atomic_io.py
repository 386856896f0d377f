"""Atomic JSON persistence: round trip, no partial files, strict JSON."""

from __future__ import annotations

import json
import os

import pytest

from dpcl.errors import InvalidParameterError
from dpcl._io.atomic_io import read_json, sha256_file, write_json_atomic


def test_round_trip_and_no_temp_files_left(tmp_path):
    target = tmp_path / "sub" / "ledger.json"
    payload = {"a": 1, "b": [1.5, "x", None], "c": {"d": True}}
    write_json_atomic(target, payload)
    assert read_json(target) == payload
    write_json_atomic(target, {"a": 2})
    assert read_json(target) == {"a": 2}
    assert sorted(os.listdir(target.parent)) == ["ledger.json"]


def test_failed_write_keeps_old_file(tmp_path):
    target = tmp_path / "cert.json"
    write_json_atomic(target, {"ok": 1})
    with pytest.raises(InvalidParameterError, match="non-finite"):
        write_json_atomic(target, {"eps": float("nan")})
    with pytest.raises(InvalidParameterError, match="serialise"):
        write_json_atomic(target, {"obj": object()})
    assert read_json(target) == {"ok": 1}
    assert sorted(os.listdir(tmp_path)) == ["cert.json"]


def test_truncated_file_is_a_decode_error(tmp_path):
    target = tmp_path / "x.json"
    write_json_atomic(target, {"k": list(range(50))})
    text = target.read_text()
    target.write_text(text[: len(text) // 2])
    with pytest.raises(json.JSONDecodeError):
        read_json(target)
    target.write_text('{"eps": NaN}')
    with pytest.raises(ValueError):
        read_json(target)


def test_sha256_matches_hashlib(tmp_path):
    import hashlib

    target = tmp_path / "ckpt.bin"
    data = bytes(range(256)) * 5000
    target.write_bytes(data)
    assert sha256_file(target, chunk_size=4096) == hashlib.sha256(data).hexdigest()
