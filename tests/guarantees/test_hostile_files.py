"""Hostile files: `dpcl verify` and `dpcl audit` refuse them with exit 2 and one line, within bounded memory.

Huge and deeply nested JSON and TOML, duplicate keys, certificates whose checkpoint path leaves the run
directory or passes through a symbolic link, and TOML configs with an unexpected type at every level.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dpcl
import dpcl.data
from dpcl.cli import main
from dpcl._io.atomic_io import (
    MAX_JSON_BYTES,
    FileTooLargeError,
    JsonLimitError,
    read_json,
)
from dpcl.guarantees.certificates import verify_certificate
from dpcl.guarantees.config import MAX_CONFIG_BYTES
from dpcl._io.safe_paths import UnsafePathError

CONFIGS = os.path.join(os.path.dirname(dpcl.__file__), "configs")

pytestmark = pytest.mark.usefixtures("reference_accountant")


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_refusal(code, out, err, needle):
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and needle in err, err
    assert out == "" or set(json.loads(out)) == {"error", "exit_code"}


# -- JSON ------------------------------------------------------------------------------------------


def test_read_json_refuses_a_file_larger_than_the_limit_before_reading_it(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as handle:  # sparse: no disk space, and never read
        handle.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(FileTooLargeError, match=f"at most {MAX_JSON_BYTES} bytes"):
        read_json(path)


@pytest.mark.parametrize("depth", [65, 1_000, 200_000])
def test_read_json_refuses_deep_nesting(tmp_path, depth):
    path = tmp_path / "deep.json"
    path.write_text("[" * depth + "]" * depth)
    with pytest.raises(JsonLimitError, match="nested deeper than 64"):
        read_json(path)
    path.write_text('{"a":' * depth + "1" + "}" * depth)
    with pytest.raises(JsonLimitError, match="nested deeper than 64"):
        read_json(path)


def test_read_json_accepts_64_levels_and_refuses_duplicate_keys(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text("[" * 64 + "]" * 64)
    assert read_json(path) is not None
    path.write_text('{"a": {"epsilon": 1, "epsilon": 9}}')
    with pytest.raises(JsonLimitError, match="'epsilon' appears twice"):
        read_json(path)


@pytest.mark.parametrize("kind", ["huge", "deep", "duplicate_key", "not_utf8"])
def test_verify_refuses_hostile_json_in_one_line(certificate, capsys, kind):
    if kind == "huge":
        with open(certificate, "r+b") as handle:
            handle.truncate(MAX_JSON_BYTES + 10)
        needle = "bytes"
    elif kind == "deep":
        data = json.loads(certificate.read_text())
        data["extra"] = json.loads("[" * 500 + "]" * 500)
        certificate.write_text(json.dumps(data))
        needle = "nested deeper"
    elif kind == "duplicate_key":
        certificate.write_text(certificate.read_text().replace('"format":', '"format": "x", "format":', 1))
        needle = "appears twice"
    else:
        certificate.write_bytes(b"\xff\xfe" + certificate.read_bytes())
        needle = "not valid JSON"
    for extra in ((), ("--json",)):
        _one_line_refusal(*_cli(capsys, "verify", str(certificate), *extra), needle)


# -- checkpoint paths ------------------------------------------------------------------------------


def _point_checkpoint_at(certificate, path_text):
    data = json.loads(certificate.read_text())
    data["checkpoint"]["path"] = path_text
    certificate.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("path_text", "needle"),
    [("../../outside.bin", "points outside"), ("/etc/passwd", "is absolute"), ("../../../../../../etc/passwd",
                                                                                  "points outside"),
     ("", "non-empty relative path")],
)
def test_checkpoint_path_outside_the_run_directory_is_refused(certificate, tmp_path, capsys, path_text, needle):
    (tmp_path / "outside.bin").write_bytes(b"someone else's file")
    _point_checkpoint_at(certificate, path_text)
    if path_text:
        with pytest.raises(UnsafePathError, match=needle):
            verify_certificate(certificate)
    code, out, err = _cli(capsys, "verify", str(certificate))
    if path_text:
        _one_line_refusal(code, out, err, needle)
    else:  # an empty path names no checkpoint file: nothing is hashed, nothing outside is read
        assert code in (0, 3) and "Traceback" not in err


@pytest.mark.parametrize("link", ["file", "directory"])
def test_checkpoint_reached_through_a_symlink_is_refused(certificate, tmp_path, capsys, link):
    real = certificate.parent.parent / "checkpoints" / "task001.pt"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "task001.pt").write_bytes(real.read_bytes())
    if link == "file":
        real.unlink()
        real.symlink_to(elsewhere / "task001.pt")
    else:
        real.unlink()
        real.parent.rmdir()
        real.parent.symlink_to(elsewhere, target_is_directory=True)
    _one_line_refusal(*_cli(capsys, "verify", str(certificate)), "symbolic link")


def test_checkpoint_inside_the_run_directory_still_verifies(certificate, capsys):
    code, _, err = _cli(capsys, "verify", str(certificate))
    assert code == 0, err


@pytest.mark.parametrize("value", [[], 7, "x", None, {"path": 3, "sha256": "0"}])
def test_checkpoint_field_of_another_type_is_not_a_traceback(certificate, capsys, value):
    data = json.loads(certificate.read_text())
    data["checkpoint"] = value
    certificate.write_text(json.dumps(data))
    code, out, err = _cli(capsys, "verify", str(certificate))
    assert code in (2, 3) and "Traceback" not in err and err.count("\n") == 1


# -- TOML ------------------------------------------------------------------------------------------

COSINE = open(os.path.join(CONFIGS, "cosine.toml"), encoding="utf-8").read()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (COSINE + "\n[privacy]\nepsilon = 2.0\n", "not valid TOML"),  # duplicate table
        (COSINE.replace("delta = 1e-5", "delta = 1e-5\ndelta = 0.5"), "not valid TOML"),  # duplicate key
        ("a = " + "[" * 5_000 + "]" * 5_000, "deeper than 16"),
        ("a = " + "{b = " * 2_000 + "1" + "}" * 2_000, "deeper than 16"),
        ("a" + ".a" * 5_000 + " = 1", "deeper than 16"),
    ],
    ids=["duplicate_table", "duplicate_key", "deep_array", "deep_inline_table", "deep_dotted_key"],
)
def test_audit_refuses_hostile_toml(tmp_path, capsys, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    _one_line_refusal(*_cli(capsys, "audit", str(path)), needle)


def test_audit_refuses_a_huge_config_before_parsing(tmp_path, capsys):
    path = tmp_path / "c.toml"
    with open(path, "wb") as handle:
        handle.write(COSINE.encode())
        handle.truncate(MAX_CONFIG_BYTES + 1)
    _one_line_refusal(*_cli(capsys, "audit", str(path)), "bytes")


def _paths(value, prefix=()):
    """Every key path of a parsed TOML document (tables and their keys, array items)."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, prefix + (index,))


def _replace(document, path, new):
    if not path:
        return new
    head, *rest = path
    copy = dict(document) if isinstance(document, dict) else list(document)
    copy[head] = _replace(document[head], rest, new)
    return copy


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(text, text)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return value.isoformat()


def _dump(document: dict) -> str:
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in document.items() if not isinstance(v, dict)]
    for name, table in document.items():
        if isinstance(table, dict):
            lines.append(f"[{json.dumps(name)}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


_SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, -1, 2**62, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["cosine", "digits", "prior", "data", "auto", "pld", ""]),
    st.datetimes().map(lambda d: d.replace(microsecond=0)),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=8)

_BASE = tomllib.loads(COSINE)
_KEY_PATHS = [p for p in _paths(_BASE)]


@given(where=st.sampled_from(_KEY_PATHS), value=_VALUES)
def test_config_with_an_unexpected_type_anywhere_is_refused_in_one_line(tmp_path_factory, where, value):
    """Replace any table, key or array item of a bundled config by a value of any type: audit answers or refuses
    with one line (exit 2, or 3 for a privacy violation), never a traceback."""
    from dpcl.guarantees.config import load_config

    directory = tmp_path_factory.mktemp("toml")
    document = _replace(_BASE, where, value)
    if not isinstance(document, dict):
        document = {"privacy": document}
    path = directory / "c.toml"
    try:
        path.write_text(_dump(document))
        tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, ValueError, TypeError, AttributeError):
        return  # not expressible in TOML (e.g. a table where a key must be): nothing to test
    try:
        load_config(path, data_stream_keys=dpcl.data.STREAM_KEYS)
    except dpcl.errors.InvalidParameterError:
        pass
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["audit", str(path), "--json"])
    assert code in (0, 2, 3), err.getvalue()
    assert err.getvalue().count("\n") <= 1 and "Traceback" not in err.getvalue()
    json.loads(out.getvalue())
