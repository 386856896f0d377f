"""The certified run behind `dpcl demo`: bundled config, certificates that verify, accuracy far above chance."""

from __future__ import annotations

import io
import json
import tomllib

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from rich.console import Console  # noqa: E402

from dpcl.guarantees.certificates import verify_certificate  # noqa: E402
from dpcl.runner.demo import DEMO_CONFIG, certified_demo_run, print_demo_run  # noqa: E402


def test_demo_config_is_the_split_digits_cosine_run_of_the_quality_bar():
    config = tomllib.loads(DEMO_CONFIG)
    assert config["method"]["name"] == "cosine"
    assert config["stream"]["label_space"] == "prior_const" and len(config["stream"]["tasks"]) == 5
    assert config["privacy"]["delta"] == 1e-5 and config["privacy"]["epsilon"] == 1.0


def test_demo_run_certifies_every_release_and_prints_where_they_are(tmp_path):
    demo = certified_demo_run(tmp_path / "demo")
    assert len(demo["releases"]) == 5 and demo["verification"]["valid"]
    assert all(verify_certificate(r["certificate"]).valid for r in demo["releases"])
    assert demo["final_epsilon"] == pytest.approx(1.0, rel=1e-6)
    assert demo["average_accuracy"] > 0.6  # 10 classes, chance 0.1
    json.dumps(demo)  # JSON-able
    buffer = io.StringIO()
    print_demo_run(Console(file=buffer, width=140), demo)
    text = buffer.getvalue()
    assert "cumulative ε" in text and demo["certificates"] in text and "valid" in text
    # the config written next to the run is the bundled one, runnable with `dpcl run`
    assert (tmp_path / "demo" / "demo.toml").read_text() == DEMO_CONFIG


def test_dpcl_demo_prints_the_certified_run_then_the_walkthrough(tmp_path, capsys):
    from dpcl.cli import main

    code = main(["demo", "--out", str(tmp_path / "demo")])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    for text in ("certified continual-learning run", "cumulative ε", "Verified the last certificate", "valid",
                 str(tmp_path / "demo" / "run" / "certificates"), "Calibrating a Gaussian"):
        assert text in out, text
    assert out.index("cumulative ε") < out.index("Calibrating a Gaussian")


def test_dpcl_demo_json_adds_the_run_to_the_walkthrough(tmp_path, capsys):
    from dpcl.cli import main

    code = main(["demo", "--out", str(tmp_path / "demo"), "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"gaussian_calibration", "dpsgd", "token_calibration", "run"} <= set(payload)
    assert payload["run"]["verification"]["valid"] and len(payload["run"]["releases"]) == 5


def test_demo_output_files_are_readable(tmp_path):
    """accuracy.png is a real plot (decodes, its size, not blank) and metrics.json agrees with the releases."""
    import numpy as np
    from PIL import Image

    demo = certified_demo_run(tmp_path / "demo")
    run = tmp_path / "demo" / "run"
    with Image.open(run / "accuracy.png") as image:
        assert image.format == "PNG" and image.size == (912, 480)  # 7.6 x 4.0 inches at 120 dpi
        pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20  # lines, markers, text: not an empty canvas
    metrics = json.loads((run / "metrics.json").read_text())
    matrix = np.array([[np.nan if v is None else v for v in row] for row in metrics["accuracy_matrix"]])
    assert matrix.shape == (5, 5) and np.all(np.isnan(matrix[np.triu_indices(5, k=1)]))
    last = [r["accuracy_on_task"] for r in demo["releases"]]
    assert np.allclose(np.diag(matrix), last)
    assert metrics["average_accuracy"] == pytest.approx(np.mean(matrix[4]))  # AA_5, eq. A38
    assert metrics["cumulative_epsilon"] == pytest.approx([1.0] * 5, rel=1e-6)
    assert sorted(p.name for p in (run / "certificates").iterdir()) == [f"task00{i}.cert.json" for i in range(1, 6)]
