"""``dpcl verify CERT.json [CERT.json ...] [--checkpoint PATH] [--json]``: check privacy certificates.

Recomputes epsilon from the certificate's events (with the accountant it names,
within the stated relative tolerance) -- the headline's when the checkpoint is
private, and every scoped statement's -- and re-hashes the checkpoint (named in the
certificate relative to itself; ``--checkpoint`` overrides). Exit 0 when every
check passes, also for a valid certificate whose checkpoint is NOT private
(``private: false`` in ``--json``, a ``NOT PRIVATE`` line in the table); 3 when a
check fails (the failed checks are named) or when the file is the legacy
statement of non-privacy that ``[run] private = false`` runs wrote before
certificate version 2 (``taskNNN.nonprivate-cert.json``); 2 when the
certificate is malformed or when the certificate or checkpoint file is missing
(nothing could be checked: the message says which file, and ``--checkpoint``
points at another copy of the checkpoint).

Several certificates (e.g. ``dpcl verify RUN/certificates/*.json``), or a run
directory (``dpcl verify RUN``: every ``RUN/certificates/*.json``; the curator
files next to them, ``ledger.json`` and ``run.json``, are not certificates and
are not read), are checked one after the other: every input file is checked
first (exit 2 before any verdict), then each certificate is verified, and the
exit code is 3 when any of them fails. The output starts with one line per
certificate (task, epsilon, delta, unit, private, signature, verdict) and a
summary; ``--details`` adds every check of every certificate. ``--json`` prints
the full reports (one object, or ``certificates`` for several);
``--checkpoint`` needs exactly one certificate.

Signatures: a certificate without one reads ``not signed``; one that is signed
but not checked (no ``--public-key``) is a warning that says to pass
``--public-key`` (a forger can keep an old signature next to edited content and
a recomputed hash: only the key tells). ``--require-signature`` exits 3 when a
certificate is not signed.

``--cross-check`` also recomputes every stated epsilon independently with
dp-accounting (:mod:`dpcl.guarantees.cross_check`, CLI part in
:mod:`dpcl.cli.verify_cross_check`) and exits 3 when a stated epsilon is below
it by more than the discretisation error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dpcl.cli.output import add_json_flag, emit
from dpcl.cli.verify_cross_check import add_cross_check_flag, run_cross_checks
from dpcl.errors import InvalidParameterError, MalformedCertificateError, VerificationError

if TYPE_CHECKING:  # imported where used: every command's module is imported to build the parser (start-up time)
    from dpcl.guarantees.certificates import VerificationReport


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="verify a privacy certificate against its events and checkpoint",
        description=(
            "Recompute epsilon from each certificate's events and check its checkpoint's SHA-256. "
            "Exit 0: every certificate valid (a valid certificate may state that its checkpoint is NOT private: "
            "the output says so); 3: a check failed, or the file is a legacy non-private statement "
            "(taskNNN.nonprivate-cert.json); 2: malformed certificate, or the certificate or checkpoint file is missing."
        ),
    )
    parser.add_argument(
        "certificates", metavar="CERT.json|RUN_DIR", nargs="+",
        help="certificate(s) written by dpcl run or a Certifier (e.g. RUN/certificates/*.json), or run directories "
        "(every RUN/certificates/*.json)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        default=None,
        help="checkpoint file to check (default: the file the certificate names, relative to the certificate)",
    )
    add_cross_check_flag(parser)
    parser.add_argument(
        "--public-key",
        metavar="PUB",
        default=None,
        help="the issuer's Ed25519 public key (KEY.pub from dpcl keygen): a certificate without a valid signature by "
        "it fails (exit 3). Without it a signature is reported (not signed / signed, NOT CHECKED), not checked",
    )
    parser.add_argument("--require-signature", action="store_true",
                        help="exit 3 when a certificate is not signed (with --public-key the signature is also checked)")
    parser.add_argument("--details", action="store_true",
                        help="after the one-line summaries, every check of every certificate")
    add_json_flag(parser)
    parser.set_defaults(handler=run_verify, time_hint=(
        "recomputing these certificates' epsilon is too expensive here; verify fewer certificates at a time or on a "
        "faster machine"))


def check_input_files(certificate: str, checkpoint: str | None) -> None:
    """Refuse (exit 2) a certificate path that is not a file, and a checkpoint that is missing.

    Without the checkpoint nothing about the release can be checked, so a missing file is an input
    error naming the file, not a verification verdict. A checkpoint that exists but differs from the
    one certified is a failed check (exit 3), reported by :func:`verify_certificate`.
    """
    path = Path(certificate)
    if path.name in NOT_CERTIFICATES and path.is_file():
        raise MalformedCertificateError(
            f"{certificate!r} is the run's {path.name}, not a certificate; give the run directory "
            f"({str(path.parent)!r}) or its certificates/*.json."
        )
    if path.is_dir():
        raise MalformedCertificateError(
            f"certificate {certificate!r} is a directory without certificates; give certificate files or a run "
            "directory (one with certificates/)."
        )
    if checkpoint is not None:
        if not Path(checkpoint).is_file():
            what = "is a directory" if Path(checkpoint).is_dir() else "does not exist"
            raise InvalidParameterError(f"--checkpoint {checkpoint!r} {what}; give the checkpoint file to check.")
        return
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.certificates import certified_checkpoint_path, read_certificate

    named = read_certificate(path).get("checkpoint")
    if isinstance(named, dict) and isinstance(named.get("path"), str) and named["path"]:
        resolved = certified_checkpoint_path(path, named["path"])  # stays inside the run directory, no symlink
        if not resolved.is_file():
            raise InvalidParameterError(
                f"the checkpoint this certificate names, {named['path']!r} (relative to the certificate: "
                f"{str(resolved)!r}), does not exist; give its location with --checkpoint PATH."
            )


#: Files of a run directory that are not certificates (curator-side or evaluations): never read as certificates.
NOT_CERTIFICATES = frozenset({"ledger.json", "run.json", "metrics.json"})


def expand_inputs(paths: list[str]) -> list[str]:
    """The certificate files to verify: files as given; a run directory gives its ``certificates/*.json``, a
    certificates folder its ``*.json`` (never ``ledger.json``, ``run.json`` or ``metrics.json``)."""
    files: list[str] = []
    for given in paths:
        path = Path(given)
        if not path.is_dir():
            files.append(given)
            continue
        folder = path / "certificates" if (path / "certificates").is_dir() else path
        found = sorted(str(f) for f in folder.glob("*.json") if f.name not in NOT_CERTIFICATES and f.is_file())
        if not found:
            raise MalformedCertificateError(
                f"{given!r} is a directory without certificates (looked for {str(folder / '*.json')!r}); give "
                "certificate files or a run directory."
            )
        files += found
    return files


def signature_state(report: VerificationReport, keyed: bool) -> str:
    """The signature column: ``not signed``, ``signed, NOT CHECKED`` (no key), ``verified``, ``INVALID``,
    ``malformed``."""
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.signing import signature_state as state

    check = next((c for c in report.checks if c.name == "signature"), None)
    return "n/a" if check is None else state(check.passed, check.detail, keyed)


def _summary_rows(paths: list[str], reports: list[VerificationReport], keyed: bool,
                  require_signature: bool) -> list[dict[str, str]]:
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.certificates import read_certificate

    rows = []
    for path, report in zip(paths, reports):
        data = read_certificate(path)
        release = data.get("release") if isinstance(data.get("release"), dict) else {}
        task = release.get("task_index")
        guarantee = data.get("guarantee") if isinstance(data.get("guarantee"), dict) else {}
        signature = signature_state(report, keyed)
        verdict = "valid" if report.valid else "INVALID"
        if report.valid and require_signature and signature == "not signed":
            verdict = "NOT SIGNED"
        rows.append({
            "task": str(task + 1) if isinstance(task, int) and not isinstance(task, bool) else "?",
            "epsilon": f"{report.stated_epsilon:.4g}" if report.private and report.stated_epsilon is not None else "-",
            "delta": f"{report.delta:g}" if report.private and report.delta is not None else "-",
            "unit": str(guarantee.get("unit") or "-") if report.private else "-",
            "private": "yes" if report.private else "NO",
            "signature": signature,
            "verdict": verdict,
            "certificate": path,
        })
    return rows


def print_summary(rows: list[dict[str, str]], reports: list[VerificationReport]) -> None:
    """One line per certificate, then one summary line (and the NOT PRIVATE line, when there is one)."""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())
    bad = sum(not r.valid for r in reports)
    unsigned = sum(row["verdict"] == "NOT SIGNED" for row in rows)
    not_private = sum(r.valid and not r.private for r in reports)
    n = len(reports)
    head = f"{n} certificate{'s' if n != 1 else ''}: "
    if unsigned and not bad:
        head += f"every check passes, but {unsigned} {'are' if unsigned != 1 else 'is'} not signed (--require-signature)"
    elif not bad:
        head += "all valid" if n > 1 else "valid"
    else:
        head += f"{bad} do not verify" if n > 1 else "does not verify"
    print(head + (" (every check: --details)" if not bad else " (failed checks below; every check: --details)"))
    if not_private:
        print(f"NOT PRIVATE: {not_private} certificate{'s' if not_private != 1 else ''} verify and state that their "
              "checkpoints have no differential-privacy guarantee (their reasons: --details)")


def _table(report: VerificationReport) -> dict[str, object]:
    payload: dict[str, object] = {"verdict": "valid" if report.valid else "INVALID"}
    if report.private:
        payload.update(
            {
                "checkpoint privacy": "private",
                "stated epsilon": report.stated_epsilon,
                "recomputed epsilon": report.recomputed_epsilon if report.recomputed_epsilon is not None else "n/a",
                "delta": report.delta,
                "relative tolerance": report.relative_tolerance,
            }
        )
    else:
        payload["checkpoint privacy"] = "NOT PRIVATE: no epsilon bounds the released checkpoint"
        payload["reasons"] = "\n".join(f"- {r}" for r in report.reasons)
    for scoped in report.scoped:
        again = "n/a" if scoped.recomputed_epsilon is None else repr(scoped.recomputed_epsilon)
        payload[f"scoped {scoped.name}"] = (
            f"stated epsilon {scoped.stated_epsilon!r}, recomputed {again}, delta {scoped.delta:g}, "
            f"{scoped.adjacency} / {scoped.unit}: {scoped.scope}"
        )
    for check in report.checks:
        if check.name == "signature" and check.passed and check.detail == "unsigned":
            payload["check signature"] = "not signed"
        elif check.name == "signature" and check.passed and check.detail.endswith("(not checked)"):
            payload["check signature"] = f"WARNING: {check.detail}; pass --public-key KEY.pub to check it"
        else:
            payload[f"check {check.name}"] = f"{'pass' if check.passed else 'FAIL'}: {check.detail}"
    # the table is rendered by rich: "[run]", "[privacy]"... are text, not markup
    from rich.markup import escape

    return {escape(key): escape(value) if isinstance(value, str) else value for key, value in payload.items()}


def run_verify(args: argparse.Namespace) -> int:
    paths = expand_inputs(list(args.certificates))
    if args.checkpoint is not None and len(paths) > 1:
        raise InvalidParameterError(
            f"--checkpoint names the checkpoint of one certificate, but {len(paths)} certificates were given; "
            "give one CERT.json with --checkpoint."
        )
    for path in paths:  # every input first: nothing is reported when a file is missing or malformed
        check_input_files(path, args.checkpoint)
    public_key = None
    if getattr(args, "public_key", None) is not None:
        # lazy import: keeps CLI start-up fast (only this command needs it)
        from dpcl.guarantees.signing import load_public_key

        public_key = load_public_key(args.public_key)
    # lazy import: keeps CLI start-up fast (only this command needs it)
    from dpcl.guarantees.certificates import verify_certificate

    reports = [verify_certificate(path, checkpoint=args.checkpoint, public_key=public_key) for path in paths]
    keyed = public_key is not None
    require = bool(getattr(args, "require_signature", False))
    rows = _summary_rows(paths, reports, keyed, require)
    dicts = [r.to_dict() for r in reports]
    for d, row in zip(dicts, rows):
        d["signature"] = row["signature"]
    if getattr(args, "json", False):
        cross, cross_code = run_cross_checks(args, paths)
        for d, c in zip(dicts, cross or ()):
            d["cross_check"] = c
        if len(reports) == 1:
            emit(args, "dpcl verify", dicts[0])
        else:
            emit(args, "dpcl verify", {"valid": all(r.valid for r in reports), "certificates": dicts})
    else:
        print_summary(rows, reports)
        if getattr(args, "details", False):
            for path, report in zip(paths, reports):
                emit(args, f"dpcl verify {path}", _table(report))
        cross, cross_code = run_cross_checks(args, paths)
    unchecked = sum(row["signature"] == "signed, NOT CHECKED" for row in rows)
    if unchecked:
        sys.stderr.write(
            f"dpcl verify: warning: {unchecked} signature{'s were' if unchecked != 1 else ' was'} not checked (no "
            "public key given): a signature proves who issued a certificate only when checked; pass --public-key "
            "KEY.pub.\n"
        )
    for path, report in zip(paths, reports):
        if not report.valid:
            failed = ", ".join(c.name for c in report.failed)
            details = "; ".join(f"{c.name}: {' '.join(c.detail.split())}" for c in report.failed)
            sys.stderr.write(f"dpcl verify: certificate {path} does not verify; failed check(s): {failed} ({details})\n")
    unsigned = [row["certificate"] for row in rows if row["verdict"] == "NOT SIGNED"]
    if unsigned:
        sys.stderr.write(f"dpcl verify: --require-signature: {len(unsigned)} certificate(s) not signed: "
                         f"{', '.join(unsigned[:3])}{' ...' if len(unsigned) > 3 else ''}\n")
    ok = all(r.valid for r in reports) and not unsigned
    return max(0 if ok else VerificationError.exit_code, cross_code)
