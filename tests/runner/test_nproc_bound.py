"""``run_data_parallel`` refuses a process count the machine cannot run before it starts a process (issue 18)."""

from __future__ import annotations

import pytest

from dpcl.errors import InvalidParameterError
from dpcl.runner.distributed import check_nproc, run_data_parallel, usable_cores


@pytest.mark.parametrize("nproc", [10**6, 10**400])
def test_a_huge_nproc_is_refused_up_front_with_the_largest_value(tmp_path, nproc):
    with pytest.raises(InvalidParameterError) as info:
        run_data_parallel(tmp_path / "no-such-config.toml", tmp_path / "out", nproc=nproc)
    message = str(info.value)
    assert message.startswith("nproc must be at most ") and "\n" not in message
    largest = int(message.split("at most ", 1)[1].split(",", 1)[0])
    assert largest >= usable_cores() and "torchrun" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("nproc", [0, -1, 1.5, True, "2"])
def test_nproc_that_is_not_a_positive_integer_is_refused(nproc):
    with pytest.raises(InvalidParameterError, match="nproc must be an integer >= 1"):
        check_nproc(nproc)


def test_one_rank_per_usable_core_is_accepted():
    assert check_nproc(1) == 1
    assert check_nproc(usable_cores()) == usable_cores()
