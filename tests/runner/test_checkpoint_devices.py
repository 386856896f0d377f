"""Checkpoints and curator states are portable: a file written on a GPU host loads on a CPU-only one.

``load_checkpoint`` / ``load_curator_state`` must read with ``map_location="cpu"``
(a tensor saved from CUDA would otherwise be restored onto a GPU that may not
exist), and what they return holds CPU tensors only.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dpcl.runner import checkpoints  # noqa: E402


def _spy_torch_load(monkeypatch):
    calls = []
    original = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoints.torch, "load", spy)
    return calls


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def test_checkpoint_and_curator_state_load_onto_the_cpu(tmp_path, monkeypatch):
    state = {"model": {"weight": torch.ones(2, 3)}, "sums": [torch.zeros(4)], "generator_state": torch.Generator().get_state()}
    calls = _spy_torch_load(monkeypatch)
    sha = checkpoints.save_checkpoint(tmp_path / "c.pt", method="naive", task_index=0, state=state)
    payload = checkpoints.load_checkpoint(tmp_path / "c.pt", expected_sha256=sha)
    curator_sha = checkpoints.save_curator_state(tmp_path / "s.pt", method="naive", task_index=0, state=state)
    curator = checkpoints.load_curator_state(tmp_path / "s.pt", expected_sha256=curator_sha, method="naive",
                                             task_index=0)
    assert len(calls) == 2
    assert all(str(call.get("map_location")) == "cpu" and call.get("weights_only") is True for call in calls)
    loaded = list(_tensors(payload["state"])) + list(_tensors(curator["state"]))
    assert loaded and all(t.device.type == "cpu" for t in loaded)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_checkpoint_holding_cuda_tensors_loads_onto_the_cpu(tmp_path):
    sha = checkpoints.save_checkpoint(tmp_path / "c.pt", method="naive", task_index=0,
                                      state={"w": torch.ones(3, device="cuda")})
    payload = checkpoints.load_checkpoint(tmp_path / "c.pt", expected_sha256=sha)
    assert payload["state"]["w"].device.type == "cpu"
