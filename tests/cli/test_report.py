"""`dpcl report RUN_DIR` on a real (small) run: the page's structure, that it loads nothing, and that a real browser
renders its figures."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
from run_helpers import write_config  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SECTIONS = {"glance", "releases", "figures", "assumptions", "coverage", "verification"}
#: Debian's headless Chromium (package chromium-headless-shell) or the full browser (package chromium).
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")


def dpcl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcl", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A two-task cosine run on digits (seconds)."""
    root = tmp_path_factory.mktemp("report")
    config = write_config(root, "cosine", tasks="[[0, 1], [2, 3]]")
    done = dpcl("run", str(config), "--out", str(root / "run"), "--quiet", "--json")
    assert done.returncode == 0, done.stderr
    return root / "run"


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sections: set[str] = set()
        self.images: list[dict[str, str]] = []
        self.tags: set[str] = set()
        self.attributes: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        self.attributes += [str(v) for v in attrs.values() if v is not None]
        if tag == "section" and attrs.get("id"):
            self.sections.add(attrs["id"])
        if tag == "img":
            self.images.append(attrs)

    def handle_data(self, data):
        self.text.append(data)


def _parse(path: Path) -> tuple[str, _Page]:
    page = path.read_text(encoding="utf-8")
    parser = _Page()
    parser.feed(page)
    return page, parser


def test_report_page_states_every_release_embeds_its_figures_and_loads_nothing(run_dir, tmp_path) -> None:
    out = tmp_path / "page.html"
    done = dpcl("report", str(run_dir), "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["report"] == str(out) and summary["certificates"] == 2 and summary["all valid"]
    page, parsed = _parse(out)
    assert SECTIONS <= parsed.sections
    # three figures (epsilon over the stream, privacy profile, accuracy heat map), each a PNG inside the page
    assert len(parsed.images) == 3
    for image in parsed.images:
        assert image["src"].startswith("data:image/png;base64,") and image.get("alt")
        assert base64.b64decode(image["src"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing to fetch: no script, style sheet, frame or link; no URL anywhere in the page
    assert not parsed.tags & {"script", "link", "iframe", "object", "embed", "a"}
    assert "http://" not in page and "https://" not in page and "//" not in " ".join(
        a for a in parsed.attributes if not a.startswith("data:"))
    text = " ".join(parsed.text)
    certificate = json.loads((run_dir / "certificates" / "task002.cert.json").read_text())
    g = certificate["guarantee"]
    assert f"{g['epsilon']:.6g}" in text and g["unit"] in text and g["adjacency"] in text
    assert "All 2 certificate(s) verify" in text and "2 of 2 certificate(s) not signed" in text
    assert "not signed" in text.split("Verification and signatures", 1)[1]  # an unsigned certificate is no pass
    for sentence in certificate["assumptions"]:
        assert sentence in text
    assert certificate["guarantee"]["basis"] in text


def test_report_of_a_tampered_certificate_is_written_and_exits_3(run_dir, tmp_path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    path = copy / "certificates" / "task002.cert.json"
    data = json.loads(path.read_text())
    data["guarantee"]["epsilon"] = data["guarantee"]["epsilon"] / 2
    path.write_text(json.dumps(data))
    done = dpcl("report", str(copy))
    assert done.returncode == 3, done.stdout + done.stderr
    _, parsed = _parse(copy / "report.html")
    text = " ".join(parsed.text)
    assert "1 of 2 certificate(s) do NOT verify" in text and "INVALID" in text and "FAIL" in text


@pytest.mark.parametrize("what", ["missing", "not a run"])
def test_report_refuses_a_path_that_is_not_a_run_directory(tmp_path, what) -> None:
    target = tmp_path / "nothing" if what == "missing" else tmp_path
    done = dpcl("report", str(target))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert ("does not exist" if what == "missing" else "not a dpcl run directory") in done.stderr
    assert not (tmp_path / "report.html").exists()


def _browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def test_a_real_browser_renders_the_report_and_its_figures(run_dir, tmp_path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium binary (Debian package chromium-headless-shell; scripts/setup.sh --test installs it)")
    page = tmp_path / "report.html"
    assert dpcl("report", str(run_dir), "--out", str(page)).returncode == 0
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000",
             f"--user-data-dir={tmp_path / 'profile'}"]
    # 1. the page as a reviewer sees it: a screenshot that is not blank and holds the figures' colours
    shot = tmp_path / "report.png"
    done = subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1280,3200", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert shot.is_file(), done.stderr
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))[..., :3]
    assert pixels.shape[0] >= 3000 and pixels.shape[1] >= 1200
    not_white = np.any(pixels < 0.95, axis=-1).mean()
    coloured = (pixels.max(axis=-1) - pixels.min(axis=-1) > 0.3).mean()  # plot lines and the heat map
    assert not_white > 0.03 and coloured > 0.005
    # 2. every image decoded: a copy of the page whose script writes each image's natural size into the DOM
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", (
        "<script>window.addEventListener('load', () => { const images = Array.from(document.images);"
        " const out = document.createElement('pre'); out.id = 'render-check';"
        " out.textContent = 'images=' + images.length + ' rendered=' + images.filter("
        "i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0).length"
        " + ' widths=' + images.map(i => i.naturalWidth).join(','); document.body.appendChild(out); });</script>"
        "</body>")), encoding="utf-8")
    dom = subprocess.run([browser, *flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    line = next(part for part in dom.split("<pre id=\"render-check\">")[1:]).split("</pre>")[0]
    counts = dict(item.split("=") for item in line.split())
    assert counts["images"] == "3" and counts["rendered"] == "3", line
    assert all(int(w) >= 200 for w in counts["widths"].split(","))


def test_report_of_a_release_that_is_not_private_says_so_and_has_no_profile(tmp_path) -> None:
    # a Certifier-style directory (certificates only, no metrics.json) whose checkpoint has no DP guarantee
    from dpcl.cli import main
    from dpcl._io.atomic_io import sha256_file
    from dpcl.guarantees.certificates import non_private_certificate, write_certificate

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "certificates").mkdir()
    checkpoint = tmp_path / "checkpoints" / "task001.pt"
    checkpoint.write_bytes(b"weights")
    write_certificate(tmp_path / "certificates" / "task001.cert.json", non_private_certificate(
        release_task=0, method="own loop", label_space="data", assumptions=["The data are what they are."],
        reasons=["The model was trained without noise."], checkpoint=checkpoint,
        checkpoint_sha256=sha256_file(checkpoint)))
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "page.html")]) == 0
    _, parsed = _parse(tmp_path / "page.html")
    text = " ".join(parsed.text)
    assert "NOT PRIVATE" in text and "The model was trained without noise." in text and "no privacy profile" in text
    assert "no metrics.json" in text and len(parsed.images) == 1  # epsilon over the stream only


def test_report_checks_signatures_with_the_public_key_and_says_when_it_could_not(run_dir, tmp_path) -> None:
    from dpcl.cli import main

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    assert main(["keygen", "--out", str(tmp_path / "key")]) == 0
    assert main(["sign", *map(str, sorted((copy / "certificates").glob("*.json"))), "--key", str(tmp_path / "key")]) == 0
    assert main(["report", str(copy), "--public-key", str(tmp_path / "key.pub")]) == 0
    text = " ".join(_parse(copy / "report.html")[1].text)
    assert "every certificate is signed and its signature verifies against the given public key" in text
    assert main(["report", str(copy)]) == 0
    text = " ".join(_parse(copy / "report.html")[1].text)
    assert "signatures were not checked: no public key given" in text and "not checked" in text.split(
        "Verification and signatures", 1)[1]


def test_report_shows_a_one_run_audit_beside_the_certified_epsilon(run_dir, tmp_path) -> None:
    audit = {
        "verdict": "consistent", "empirical_epsilon_lower": 0.25, "certified_epsilon": 1.0, "delta": 1e-5,
        "confidence": 0.95, "what_is_trained": "dpcl's DP-SGD step", "tasks": [
            {"task": 0, "certified_epsilon": 1.0, "canaries": 500,
             "white_box": {"epsilon_lower": 0.25}, "black_box": {"epsilon_lower": 0.125}},
        ],
    }
    audit_file = tmp_path / "audit.json"
    audit_file.write_text(json.dumps(audit))
    out = tmp_path / "page.html"
    done = dpcl("report", str(run_dir), "--out", str(out), "--audit", str(audit_file))
    assert done.returncode == 0, done.stderr
    _, parsed = _parse(out)
    assert "audit" in parsed.sections
    text = " ".join(parsed.text)
    assert "One-run empirical audit" in text and "not a release" in text and "0.125" in text
    audit_file.write_text("[]")
    done = dpcl("report", str(run_dir), "--out", str(tmp_path / "p2.html"), "--audit", str(audit_file))
    assert done.returncode == 2 and "audit.json" in done.stderr and "Traceback" not in done.stderr
