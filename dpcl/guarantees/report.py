"""``dpcl report RUN_DIR``: one self-contained HTML page for a privacy reviewer.

The page reads what a run directory holds (``certificates/*.cert.json``; ``metrics.json`` and ``run.json`` where
``dpcl run`` wrote them) and states, at a glance and then in detail:

* every release with its epsilon, delta, privacy unit, neighbouring relation, composition, accountant and
  whether its checkpoint is private;
* epsilon over the stream, the privacy profile delta(epsilon) of the last release, recomputed from its events
  with the accountants its certificate names (:func:`dpcl.guarantees.ledger.compose_stream`, what ``dpcl verify``
  recomputes), and the accuracy matrix as a heat map;
* the assumptions, what covers each checkpoint (the basis of its guarantee, or why it has none, and any scoped
  statement), and the verification and signature results of every certificate, from
  :func:`dpcl.guarantees.certificates.verify_certificate` (``dpcl verify``'s checks).

Figures are PNG images (matplotlib, Agg) embedded as base64 ``data:`` URIs; the page loads nothing from
anywhere (no script, no style sheet, no font, no link to the network). It is written atomically.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpcl._version import __version__
from dpcl.errors import DpclError, InvalidParameterError
from dpcl._io.atomic_io import read_json, write_text_atomic
from dpcl.guarantees.certificate_model import Certificate
from dpcl.guarantees.certificates import read_certificate, verify_certificate
from dpcl.guarantees.ledger import compose_stream
from dpcl.guarantees.signing import signature_state

#: File name of the page when no output path is given (inside the run directory).
REPORT_NAME = "report.html"
#: The deltas at which the privacy profile of the last release is evaluated (plus its stated delta).
PROFILE_DELTAS = (1e-12, 1e-10, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
_CERT_NAME = re.compile(r"^(?P<base>.+?)(?:\.r(?P<rev>\d+))?\.cert\.json$")


@dataclass(frozen=True)
class ReportSummary:
    """What :func:`write_report` wrote: the page, how many certificates it covers, whether all verify, and
    whether the last release is private."""

    path: Path
    certificates: int
    valid: bool
    last_private: bool
    signatures: str


def certificate_paths(run_dir: "str | os.PathLike[str]") -> list[Path]:
    """The certificates of a run directory in release order (task index, then re-release number); refuses
    (:class:`~dpcl.errors.InvalidParameterError`) a path that is not a run directory."""
    root = Path(run_dir)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise InvalidParameterError(
            f"{str(run_dir)!r} {what}; give a run directory (the --out of dpcl run, or the run_dir of a Certifier)."
        )
    found = sorted(p for p in (root / "certificates").glob("*.cert.json") if p.is_file()) if (
        root / "certificates").is_dir() else []
    if not found:
        raise InvalidParameterError(
            f"{str(run_dir)!r} is not a dpcl run directory: it has no certificates/*.cert.json (dpcl run and a "
            "Certifier write one per release there); give the directory of a run that released a checkpoint."
        )

    def key(path: Path) -> tuple[str, int]:
        match = _CERT_NAME.match(path.name)
        return (match.group("base"), int(match.group("rev") or 1)) if match else (path.name, 0)

    return sorted(found, key=key)


def _escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: Any, digits: int = 6) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.{digits}g}" if math.isfinite(value) else str(value)
    return "—" if value is None else str(value)


def _png(fig: Any) -> str:
    """The figure as an ``<img>`` with a base64 PNG ``data:`` URI (no metadata naming any site)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _epsilon_figure(rows: Sequence[Mapping[str, Any]]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=110)
    xs = list(range(1, len(rows) + 1))
    eps = [r["epsilon"] if r["private"] and r["epsilon"] is not None else math.nan for r in rows]
    ax.plot(xs, eps, marker="o", color="tab:blue", label="stated ε of the release (cumulative)")
    for x, r in zip(xs, rows):
        if not r["private"]:
            ax.axvline(x, color="tab:red", alpha=0.3)
            ax.annotate("not private", (x, 0), rotation=90, fontsize=7, color="tab:red",
                        xytext=(3, 4), textcoords="offset points")
    ax.set_xticks(xs)
    ax.set_xticklabels([r["label"] for r in rows], fontsize=7, rotation=30 if len(rows) > 8 else 0)
    ax.set_xlabel("release")
    ax.set_ylabel("ε")
    ax.set_ylim(bottom=0)
    deltas = sorted({r["delta"] for r in rows if r["private"] and r["delta"] is not None})
    ax.set_title("ε over the stream" + (f" (δ = {', '.join(f'{d:g}' for d in deltas)})" if deltas else ""),
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return _png(fig)


def _profile(data: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(epsilon, delta) points of the privacy profile of a private certificate's headline, recomputed from its
    events with the accountant each composition group asked for (as ``dpcl verify`` recomputes it)."""
    certificate = Certificate.from_json(data)
    g = certificate.guarantee
    charges = certificate.charges()
    accountants = [x.asked_accountant for x in g.groups]
    points = []
    for delta in sorted(set(PROFILE_DELTAS) | {float(g.delta)}):
        try:
            epsilon = compose_stream(charges, str(g.across_tasks), delta, group_accountants=accountants).epsilon
        except DpclError:  # an accountant that does not answer at this delta: the point is left out
            continue
        if math.isfinite(epsilon):
            points.append((float(epsilon), delta))
    return points


def _profile_figure(points: Sequence[tuple[float, float]], stated: tuple[float, float], label: str) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=110)
    ax.semilogy([p[0] for p in points], [p[1] for p in points], marker=".", color="tab:purple",
                label="δ(ε), recomputed from the events")
    ax.semilogy([stated[0]], [stated[1]], marker="*", markersize=12, linestyle="none", color="tab:orange",
                label=f"stated (ε, δ) = ({stated[0]:.4g}, {stated[1]:g})")
    ax.set_xlabel("ε")
    ax.set_ylabel("δ")
    ax.set_title(f"privacy profile of {label}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return _png(fig)


def _accuracy_figure(matrix: Sequence[Sequence[Any]]) -> str:
    import numpy as np

    plt = _pyplot()
    values = np.array([[math.nan if v is None else float(v) for v in row] for row in matrix], dtype=np.float64)
    rows, cols = values.shape
    fig, ax = plt.subplots(figsize=(1.2 + 0.75 * cols, 1.0 + 0.6 * rows), dpi=110)
    image = ax.imshow(np.ma.masked_invalid(values), vmin=0.0, vmax=1.0, cmap="viridis")
    for t in range(rows):
        for j in range(cols):
            if math.isfinite(values[t, j]):
                ax.text(j, t, f"{values[t, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if values[t, j] < 0.6 else "black")
    ax.set_xticks(range(cols))
    ax.set_xticklabels([str(j + 1) for j in range(cols)], fontsize=7)
    ax.set_yticks(range(rows))
    ax.set_yticklabels([str(t + 1) for t in range(rows)], fontsize=7)
    ax.set_xlabel("test set of task")
    ax.set_ylabel("after task")
    ax.set_title("accuracy matrix", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return _png(fig)


def _check(report: Any, name: str) -> Any:
    return next((c for c in report.checks if c.name == name), None)


_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
.ok { color: #126b12; font-weight: bold; } .bad { color: #b00020; font-weight: bold; }
.warn { color: #8a5a00; font-weight: bold; }
.glance { border: 2px solid #888; padding: 0.6em 1em; background: #fafafa; }
figure { margin: 0.8em 0; } img { max-width: 100%; }
.small { font-size: 0.85em; color: #555; }
"""


def _signature_state(reports: Sequence[Any], keyed: bool) -> tuple[str, str]:
    """(css class, sentence) for the signatures of all certificates."""
    details = [(_check(r, "signature")) for r in reports]
    if any(c is not None and not c.passed for c in details):
        return "bad", "a signature does not verify against the given public key"
    unsigned = sum(c is not None and signature_state(c.passed, c.detail, keyed) == "not signed" for c in details)
    if unsigned:
        return "warn", f"{unsigned} of {len(reports)} certificate(s) not signed: their issuer is not authenticated"
    if not keyed:
        return "warn", ("signed, but the signatures were not checked: no public key given "
                        "(dpcl report RUN_DIR --public-key KEY.pub checks them)")
    return "ok", "every certificate is signed and its signature verifies against the given public key"


#: The file ``dpcl audit-run`` writes; ``dpcl report`` shows ``RUN_DIR/audit/audit.json`` when it exists.
AUDIT_NAME = "audit.json"


def _audit_section(payload: Any) -> list[str]:
    """The one-run audit beside the certified epsilon (``dpcl audit-run``'s ``audit.json``)."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("tasks"), list):
        raise InvalidParameterError("--audit: the file is not an audit.json written by dpcl audit-run; give that file.")
    verdict = str(payload.get("verdict", ""))
    css = "ok" if verdict == "consistent" else "bad"
    out = [
        "<section id=\"audit\"><h2>One-run empirical audit</h2>",
        f"<p class=\"{css}\">Verdict: <b>{_escape(verdict)}</b>. Empirical lower bound "
        f"{_number(payload.get('empirical_epsilon_lower'))} beside the certified ε {_number(payload.get('certified_epsilon'))} "
        f"(δ = {_number(payload.get('delta'))}), holding with probability {_number(payload.get('confidence'))}.</p>",
        f"<p class=\"small\">The canary run: {_escape(payload.get('release', 'not a release'))}. What was trained: "
        f"{_escape(payload.get('what_is_trained', ''))}. A lower bound below the certified ε is what a correct "
        "implementation gives; it does not show the certified ε is tight.</p>",
        "<table><tr><th>task</th><th>certified ε</th><th>lower bound, white box</th><th>lower bound, black box</th>"
        "<th>canaries</th></tr>",
    ]
    for t in payload["tasks"]:
        if not isinstance(t, Mapping):
            continue
        white, black = t.get("white_box") or {}, t.get("black_box") or {}
        out.append(f"<tr><td>{_escape(t.get('task'))}</td><td>{_number(t.get('certified_epsilon'))}</td>"
                   f"<td>{_number(white.get('epsilon_lower'))}</td><td>{_number(black.get('epsilon_lower'))}</td>"
                   f"<td>{_escape(t.get('canaries'))}</td></tr>")
    out.append("</table></section>")
    return out


def _certificate_row(path: Path, data: Mapping[str, Any], report: Any) -> dict[str, Any]:
    """What the page shows of one certificate, read and verified."""
    g = data["guarantee"]
    private = bool(g.get("private", True))
    release = data.get("release", {}) if isinstance(data.get("release"), Mapping) else {}
    task = release.get("task_index")
    return {
        "label": path.name.removesuffix(".cert.json"),
        "task": task, "private": private, "epsilon": g.get("epsilon") if private else None,
        "delta": g.get("delta") if private else None, "unit": g.get("unit", "—"),
        "adjacency": g.get("adjacency", "—"), "across": g.get("across_tasks", "—"),
        "composition": g.get("composition", ""), "accountant": g.get("accountant", "—"),
        "basis": g.get("basis", ""), "reasons": g.get("reasons", []),
        "checkpoint": (data.get("checkpoint") or {}).get("path", "—"),
        "sha256": (data.get("checkpoint") or {}).get("sha256", "—"),
        "valid": report.valid, "report": report, "data": data, "path": path,
    }


def _glance_section(rows: list[dict[str, Any]], sig_class: str, sig_text: str) -> list[str]:
    last = rows[-1]
    out = ["<section id=\"glance\" class=\"glance\"><h2>At a glance</h2><ul>"]
    add = out.append
    if all(r["valid"] for r in rows):
        add(f"<li class=\"ok\">All {len(rows)} certificate(s) verify: epsilon recomputed from the events, "
            "checkpoint hashes and certificate contents match.</li>")
    else:
        bad = sum(not r["valid"] for r in rows)
        add(f"<li class=\"bad\">{bad} of {len(rows)} certificate(s) do NOT verify (see Verification).</li>")
    if last["private"]:
        add(f"<li>Last release <code>{_escape(last['label'])}</code>: its checkpoint is "
            f"<b>(ε = {_number(last['epsilon'])}, δ = {_number(last['delta'])})-DP</b> for one "
            f"<b>{_escape(last['unit'])}</b> under <b>{_escape(last['adjacency'])}</b>, composed "
            f"<b>{_escape(last['across'])}</b> over the tasks (accountant {_escape(last['accountant'])}).</li>")
    else:
        add(f"<li class=\"bad\">Last release <code>{_escape(last['label'])}</code>: NOT PRIVATE: no epsilon bounds "
            "its checkpoint.</li>")
    not_private = sum(not r["private"] for r in rows)
    if not_private:
        add(f"<li class=\"bad\">{not_private} release(s) NOT PRIVATE.</li>")
    add(f"<li class=\"{sig_class}\">Signatures: {_escape(sig_text)}.</li>")
    add("</ul></section>")
    return out


def _releases_section(rows: list[dict[str, Any]]) -> list[str]:
    out = ["<section id=\"releases\"><h2>Releases</h2><table><tr><th>certificate</th><th>task</th><th>private</th>"
           "<th>ε</th><th>δ</th><th>unit</th><th>adjacency</th><th>composition</th><th>accountant</th>"
           "<th>verifies</th></tr>"]
    add = out.append
    for r in rows:
        verdict = "<span class=\"ok\">valid</span>" if r["valid"] else "<span class=\"bad\">INVALID</span>"
        private = "yes" if r["private"] else "<span class=\"bad\">NOT PRIVATE</span>"
        task = "—" if r["task"] is None else str(int(r["task"]) + 1)
        add(f"<tr><td><code>{_escape(r['label'])}</code></td><td>{task}</td><td>{private}</td>"
            f"<td>{_number(r['epsilon'])}</td><td>{_number(r['delta'])}</td><td>{_escape(r['unit'])}</td>"
            f"<td>{_escape(r['adjacency'])}</td><td>{_escape(r['across'])}</td><td>{_escape(r['accountant'])}</td>"
            f"<td>{verdict}</td></tr>")
    add("</table>")
    compositions = sorted({r["composition"] for r in rows if r["composition"]})
    for sentence in compositions:
        add(f"<p class=\"small\">Composition: {_escape(sentence)}</p>")
    add("</section>")
    return out


def _figures_section(rows: list[dict[str, Any]], metrics: Mapping[str, Any]) -> list[str]:
    last = rows[-1]
    out = ["<section id=\"figures\"><h2>Figures</h2>"]
    add = out.append
    add(f"<figure><img alt=\"epsilon over the stream\" src=\"{_epsilon_figure(rows)}\">"
        "<figcaption class=\"small\">The ε each certificate states for its checkpoint, release by release "
        "(composed over every earlier charge that can read the same unit).</figcaption></figure>")
    if last["private"]:
        points = _profile(last["data"])
        stated = (float(last["epsilon"]), float(last["delta"]))
        add(f"<figure><img alt=\"privacy profile of the last release\" "
            f"src=\"{_profile_figure(points, stated, last['label'])}\">"
            "<figcaption class=\"small\">δ(ε) of the last release, recomputed from the events of its certificate "
            "with the accountants it names: the checkpoint is (ε, δ(ε))-DP at every point of the curve.</figcaption>"
            "</figure><table><tr><th>δ</th>" + "".join(f"<td>{d:g}</td>" for _, d in points)
            + "</tr><tr><th>ε</th>" + "".join(f"<td>{e:.4g}</td>" for e, _ in points) + "</tr></table>")
    else:
        add("<p class=\"bad\">The last release is not private: it has no privacy profile.</p>")
    matrix = metrics.get("accuracy_matrix")
    if isinstance(matrix, list) and matrix and all(isinstance(row, list) for row in matrix):
        add(f"<figure><img alt=\"accuracy matrix\" src=\"{_accuracy_figure(matrix)}\">"
            "<figcaption class=\"small\">Test accuracy on each task's test set (columns) after each task (rows), "
            "from metrics.json.</figcaption></figure>")
    else:
        add("<p>No accuracy matrix: this run directory has no metrics.json (a Certifier run records none).</p>")
    add("</section>")
    return out


def _assumptions_section(rows: list[dict[str, Any]]) -> list[str]:
    last = rows[-1]
    out = ["<section id=\"assumptions\"><h2>Assumptions</h2><p class=\"small\">Every guarantee above holds only if "
           f"these hold (from the certificate of the last release, <code>{_escape(last['label'])}</code>).</p><ol>"]
    add = out.append
    for sentence in last["data"].get("assumptions", []):
        add(f"<li>{_escape(sentence)}</li>")
    add("</ol>")
    others = {tuple(r["data"].get("assumptions", [])) for r in rows[:-1]} - {tuple(last["data"].get("assumptions", []))}
    if others:
        add(f"<p class=\"warn\">{len(others)} earlier certificate(s) state other assumptions; read them there.</p>")
    add("</section>")
    return out


def _coverage_section(rows: list[dict[str, Any]]) -> list[str]:
    out = ["<section id=\"coverage\"><h2>Coverage of each checkpoint</h2><table><tr><th>certificate</th>"
           "<th>checkpoint</th><th>what the guarantee covers</th></tr>"]
    for r in rows:
        if r["private"]:
            covered = _escape(r["basis"]) or "—"
        else:
            covered = "<span class=\"bad\">NOT PRIVATE:</span> " + "; ".join(_escape(x) for x in r["reasons"])
        scoped = r["data"].get("scoped_guarantees") or []
        for s in scoped if isinstance(scoped, list) else []:
            if isinstance(s, Mapping):
                covered += (f"<br><i>scoped statement {_escape(s.get('name', ''))}</i>: ε = {_number(s.get('epsilon'))}"
                            f", δ = {_number(s.get('delta'))}, {_escape(s.get('unit', ''))}: {_escape(s.get('scope', ''))}")
        out.append(f"<tr><td><code>{_escape(r['label'])}</code></td><td><code>{_escape(r['checkpoint'])}</code><br>"
                   f"<span class=\"small\">sha256 {_escape(r['sha256'])}</span></td><td>{covered}</td></tr>")
    out.append("</table></section>")
    return out


def _verification_section(rows: list[dict[str, Any]], keyed: bool) -> list[str]:
    out = ["<section id=\"verification\"><h2>Verification and signatures</h2><p class=\"small\">The checks of "
           "<code>dpcl verify</code>"
           + (" with the given public key" if keyed else " (no public key given: signatures are reported, not checked)")
           + ".</p>"]
    add = out.append
    for r in rows:
        report = r["report"]
        head = "<span class=\"ok\">valid</span>" if report.valid else "<span class=\"bad\">INVALID</span>"
        add(f"<h3><code>{_escape(r['label'])}</code>: {head}</h3><table><tr><th>check</th><th>result</th>"
            "<th>detail</th></tr>")
        for c in report.checks:
            mark = "<span class=\"ok\">pass</span>" if c.passed else "<span class=\"bad\">FAIL</span>"
            if c.name == "signature" and c.passed and not keyed:  # nothing about the issuer was checked
                unsigned = signature_state(c.passed, c.detail, keyed) == "not signed"
                mark = f"<span class=\"warn\">{'not signed' if unsigned else 'not checked'}</span>"
            add(f"<tr><td>{_escape(c.name)}</td><td>{mark}</td><td>{_escape(c.detail)}</td></tr>")
        add("</table>")
    add("</section></body></html>\n")
    return out


def write_report(
    run_dir: "str | os.PathLike[str]", out: "str | os.PathLike[str] | None" = None, *, public_key: Any = None,
    audit: "str | os.PathLike[str] | None" = None,
) -> ReportSummary:
    """Write the HTML page of the run in ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``), atomically.

    ``public_key`` (a PEM path or key object, as for ``dpcl verify --public-key``) has every signature checked.
    ``audit`` is a one-run audit's ``audit.json`` (``dpcl audit-run``; default ``RUN_DIR/audit/audit.json`` when
    it exists), shown beside the certified epsilon.
    Refuses a path that is not a run directory (:func:`certificate_paths`)."""
    root = Path(run_dir)
    paths = certificate_paths(root)
    certificates = [read_certificate(p) for p in paths]
    reports = [verify_certificate(p, public_key=public_key) for p in paths]
    rows = [_certificate_row(path, data, report) for path, data, report in zip(paths, certificates, reports)]
    last = rows[-1]
    metrics = read_json(root / "metrics.json") if (root / "metrics.json").is_file() else {}
    if not isinstance(metrics, Mapping):
        metrics = {}
    keyed = public_key is not None
    sig_class, sig_text = _signature_state(reports, keyed)
    all_valid = all(r["valid"] for r in rows)

    parts: list[str] = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>dpcl privacy report: {_escape(root.resolve().name)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>Privacy report of <code>{_escape(root.resolve().name)}</code></h1>",
        f"<p class=\"small\">Written by dpcl {_escape(__version__)} from {len(rows)} certificate(s) in "
        f"<code>certificates/</code>{' and metrics.json' if metrics else ''}; every number below is read from "
        "them or recomputed from their events.</p>",
    ]
    parts += _glance_section(rows, sig_class, sig_text)
    parts += _releases_section(rows)
    parts += _figures_section(rows, metrics)
    parts += _assumptions_section(rows)
    parts += _coverage_section(rows)
    audit_file = Path(audit) if audit is not None else root / "audit" / AUDIT_NAME
    if audit is not None or audit_file.is_file():
        parts += _audit_section(read_json(audit_file))
    parts += _verification_section(rows, keyed)
    page = "".join(parts)
    target = Path(out) if out is not None else root / REPORT_NAME
    write_text_atomic(target, page)
    return ReportSummary(target, len(rows), all_valid, bool(last["private"]), sig_text)
