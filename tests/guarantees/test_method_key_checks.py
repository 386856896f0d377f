"""Method-key errors read as one sentence for every method spec."""

from __future__ import annotations

import pytest

from dpcl.errors import ConfigError
from dpcl.guarantees.config import parse_config

BASE = {
    "privacy": {"epsilon": 1.0, "delta": 1e-5},
    "stream": {
        "dataset": "digits",
        "tasks": [[0, 1], [2, 3]],
        "label_space": "prior_const",
        "prior_labels": [[0, 1], [2, 3]],
        "disjoint_units": True,
    },
}


@pytest.mark.parametrize(
    "method, expected",
    [
        ({"name": "pecl", "alpha": 2.0}, r"\[method\] alpha must be a number in \[0, 1\] for method 'pecl'; got 2.0"),
        ({"name": "l2dpml", "epsilon1_fraction": 1.5}, r"epsilon1_fraction must be a number in \(0, 1\)"),
        ({"name": "naive", "epochs": 0}, r"\[method\] epochs must be an integer >= 1 for method 'naive'; got 0"),
        ({"name": "pecl", "calibration": "classic"}, r"calibration must be one of 'analytic', 'paper'"),
    ],
)
def test_bad_method_key_gives_one_clear_sentence(method, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        parse_config({**BASE, "method": method})
    assert "must be must" not in str(info.value)
