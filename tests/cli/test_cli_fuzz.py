"""Property-based fuzz test of the command line: any argument gets an answer or a one-line refusal, in bounded
memory and time.

Every example runs ``dpcl.cli.main`` in a child process (``fuzz_worker.py``) whose address space is limited
to :data:`MEMORY_LIMIT` bytes (``resource.setrlimit`` in ``preexec_fn``); one child serves many examples, so
the interpreter starts once. For every command, over numbers from the whole float range (NaN, infinities,
subnormals, ±0, the largest doubles), integers far beyond 64 bits and arbitrary strings, plus plausible values
so that valid inputs are reached too, it asserts:

* the exit code is 0, 2 or 3, and the command returned (no traceback, no crash of the child);
* the memory limit was never hit (no ``MemoryError``, no death of the child) and the example finished within
  :data:`TIME_LIMIT` seconds;
* on exit 2 stdout is empty, or under ``--json`` exactly ``{"error", "exit_code"}``: no number is printed
  unless the command succeeded; stderr is one line;
* on exit 0 under ``--json`` stdout is one JSON object with no NaN.

Fast mode (CI) runs :data:`FAST_EXAMPLES` examples in all (:data:`EXAMPLES` per command group), derandomised and
unshrunk; ``DPCL_THOROUGH=1`` runs :data:`THOROUGH_EXAMPLES` fresh random examples and shrinks a failure.
"""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

THOROUGH = os.environ.get("DPCL_THOROUGH") == "1"
MEMORY_LIMIT = 2 * 1024**3
TIME_LIMIT = 60.0
#: Examples per command group: (fast, thorough). The DP-SGD and config groups reach accountants whose valid
#: answers take seconds each, so they get fewer.
EXAMPLES = {
    "gaussian": (100, 3_000),
    "dpsgd": (20, 500),
    "mechanism": (30, 1_000),
    "sigma_files": (30, 1_000),
    "configs": (40, 500),
    "certificates": (30, 1_000),
}
FAST_EXAMPLES = sum(fast for fast, _ in EXAMPLES.values())
THOROUGH_EXAMPLES = sum(thorough for _, thorough in EXAMPLES.values())

WORKER = Path(__file__).with_name("fuzz_worker.py")


def fuzz_settings(group: str) -> settings:
    fast, thorough = EXAMPLES[group]
    return settings(
        max_examples=thorough if THOROUGH else fast,
        deadline=None,
        derandomize=not THOROUGH,  # CI sees the same examples every time
        suppress_health_check=list(HealthCheck),
        database=None,
        # a failing example can take the whole time limit: CI reports it unshrunk, thorough mode shrinks it
        phases=tuple(Phase) if THOROUGH else (Phase.explicit, Phase.reuse, Phase.generate),
    )


def _limit_memory() -> None:  # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


class Worker:
    """A child process running ``fuzz_worker.py`` under the memory limit; restarted after it dies."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def _start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "PYTHONFAULTHANDLER": "1"}
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, env=env, preexec_fn=_limit_memory,
        )
        assert json.loads(self._read_line(120.0) or "{}").get("ready"), self._dead_message()

    def _read_line(self, timeout: float) -> str | None:
        assert self.process is not None and self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        return self.process.stdout.readline() if ready else None

    def _dead_message(self) -> str:
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        tail = self.process.stderr.read()[-3000:] if self.process.stderr else ""
        self.process = None
        return tail

    def run(self, argv: list[str]) -> dict:
        if self.process is None or self.process.poll() is not None:
            self._start()
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(argv) + "\n")
        self.process.stdin.flush()
        line = self._read_line(TIME_LIMIT)
        if line is None:
            self._dead_message()
            raise AssertionError(f"dpcl {' '.join(argv)} did not answer within {TIME_LIMIT:g} s")
        if not line:
            tail = self._dead_message()
            raise AssertionError(
                f"dpcl {' '.join(argv)} killed the process (memory limit {MEMORY_LIMIT >> 30} GiB or a crash): {tail}"
            )
        return json.loads(line)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


SLOWEST: list[tuple[float, str]] = []


def check(result: dict, as_json: bool) -> None:
    if os.environ.get("DPCL_FUZZ_TIMINGS"):
        SLOWEST.append((result["seconds"], f"exit {result['code']}: dpcl {' '.join(result['argv'])}"[:300]))
        SLOWEST.sort(reverse=True)
        del SLOWEST[10:]
        Path(os.environ["DPCL_FUZZ_TIMINGS"]).write_text("\n".join(f"{t:.2f}s {a}" for t, a in SLOWEST))
    argv, code, out, err = result["argv"], result["code"], result["stdout"], result["stderr"]
    where = f"dpcl {' '.join(argv)}"
    assert result["status"] != "memory", f"{where}: MemoryError under the {MEMORY_LIMIT >> 30} GiB limit"
    assert result["status"] != "traceback" and "Traceback" not in err, f"{where}:\n{err}"
    assert code in (0, 2, 3), f"{where}: exit {code}\n{err}"
    assert result["seconds"] < TIME_LIMIT, f"{where}: {result['seconds']:.1f} s"
    if code == 0:
        if as_json:
            payload = json.loads(out)
            assert isinstance(payload, dict)
            assert "NaN" not in out and '"nan"' not in out.lower(), f"{where}: NaN printed\n{out}"
    else:
        assert err.strip() and err.strip().count("\n") == 0 or code == 3, f"{where}: stderr is not one line\n{err}"
        if code == 2:
            if as_json:
                assert set(json.loads(out)) == {"error", "exit_code"}, f"{where}: exit 2 printed\n{out}"
            else:
                assert out == "", f"{where}: exit 2 printed\n{out}"


# -- values -------------------------------------------------------------------------------------------

SPECIAL = st.sampled_from([
    "nan", "-nan", "inf", "-inf", "Infinity", "0", "-0", "0.0", "5e-324", "2.2250738585072014e-308", "1e-320",
    "1e-300", "1e-16", "0.5", "1", "1.0", "2", "10", "1e4", "1e9", "1e15", "1e18", "1e300", "1.7976931348623157e308",
    "1e309", str(2**63), str(2**64 + 1), "1" + "0" * 400, "0x10", "1_000", " 1 ", "", "abc", "1e", "--1", "½",
])
FLOAT = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True).map(repr)
INTEGER = st.integers(min_value=-(10**40), max_value=10**40).map(str)
TEXT = st.text(max_size=16)
ANY = st.one_of(SPECIAL, FLOAT, INTEGER, TEXT)


def plausible(low: float, high: float) -> st.SearchStrategy[str]:
    """Values in a range where a command can answer, so valid inputs are reached too."""
    return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False).map(repr)


def value(low: float, high: float) -> st.SearchStrategy[str]:
    return st.one_of(ANY, plausible(low, high), plausible(low, high))


POSITIVE = value(1e-3, 1e3)
DELTA = value(1e-12, 0.5)
RATE = value(1e-6, 1.0)
STEPS = st.one_of(ANY, st.integers(min_value=1, max_value=10**12).map(str), st.sampled_from(["1", "100", "1e4"]))
ACCOUNTANT = st.sampled_from(["prv", "pld", "rdp", "auto", "exact", ""])


def options(required: dict, optional: dict | None = None) -> st.SearchStrategy[list[str]]:
    """``--name=value`` tokens (``=`` so that values starting with '-' stay values); a required option is left out
    now and then (a usage error), an optional one given or not."""
    parts = [st.one_of(st.just(None), s, s, s, s, s, s, s).map(lambda v, n=n: None if v is None else f"{n}={v}")
             for n, s in required.items()]
    parts += [st.one_of(st.just(None), s).map(lambda v, n=n: None if v is None else f"{n}={v}")
              for n, s in (optional or {}).items()]
    return st.tuples(*parts).map(lambda tokens: [t for t in tokens if t is not None])


GAUSSIAN_COMMANDS = st.one_of(
    st.tuples(st.just(["calibrate", "gaussian"]), options({"--epsilon": POSITIVE, "--delta": DELTA},
                                                          {"--sensitivity": POSITIVE})),
    st.tuples(st.just(["epsilon", "gaussian"]), options({"--sigma": POSITIVE, "--delta": DELTA},
                                                        {"--sensitivity": POSITIVE})),
)
DPSGD_COMMANDS = st.one_of(
    st.tuples(st.just(["calibrate", "dpsgd"]), options(
        {"--epsilon": POSITIVE, "--delta": DELTA, "--sample-rate": RATE, "--steps": STEPS},
        {"--accountant": ACCOUNTANT})),
    st.tuples(st.just(["epsilon", "dpsgd"]), options(
        {"--noise-multiplier": POSITIVE, "--delta": DELTA, "--sample-rate": RATE, "--steps": STEPS},
        {"--accountant": ACCOUNTANT})),
)
MECHANISM_COMMANDS = st.one_of(*[
    st.tuples(st.just(["audit-mechanism", name]), options(
        {noise: POSITIVE, "--claimed-epsilon": POSITIVE, "--delta": value(0.0, 0.5)},
        {"--sensitivity": POSITIVE, "--trials": st.one_of(ANY, st.integers(4, 10**5).map(str)),
         "--seed": st.one_of(ANY, st.integers(0, 2**70).map(str)), "--confidence": value(0.5, 0.999)}))
    for name, noise in (("gaussian", "--sigma"), ("laplace", "--scale"))
])


def _run_command(worker, command, tokens, as_json):
    argv = [*command, *tokens] + (["--json", "--quiet"] if as_json and command[0] == "audit-mechanism" else
                                  ["--json"] if as_json else (["--quiet"] if command[0] == "audit-mechanism" else []))
    check(worker.run(argv), as_json)


@fuzz_settings("gaussian")
@given(case=GAUSSIAN_COMMANDS, as_json=st.booleans())
def test_gaussian_commands(worker, case, as_json):
    _run_command(worker, *case, as_json)


@fuzz_settings("dpsgd")
@given(case=DPSGD_COMMANDS, as_json=st.booleans())
def test_dpsgd_commands(worker, case, as_json):
    _run_command(worker, *case, as_json)


@fuzz_settings("mechanism")
@given(case=MECHANISM_COMMANDS, as_json=st.booleans())
def test_audit_mechanism(worker, case, as_json):
    _run_command(worker, *case, as_json)


# -- files: sigma files, configs, certificates ---------------------------------------------------------

SIGMA_LINES = st.lists(st.one_of(ANY, plausible(0.1, 100.0), st.sampled_from(["# comment", "", "  "])),
                       min_size=0, max_size=12)
LONG_SIGMA_FILES = st.sampled_from([("1.0\n", 10**6), ("0.5\n", 5 * 10**6), ("x" * 10**6 + "\n1\n", 1),
                                    ("\n", 2 * 10**6), ("#" + "c" * 100 + "\n", 10**5)])


@fuzz_settings("sigma_files")
@given(lines=st.one_of(SIGMA_LINES, SIGMA_LINES, LONG_SIGMA_FILES, st.sampled_from(["npy_small", "npy_large"])),
       rest=options({"--delta": DELTA}, {"--sensitivity": POSITIVE}), as_json=st.booleans())
def test_compose_gaussians_sigma_files(worker, tmp_path_factory, lines, rest, as_json):
    directory = tmp_path_factory.mktemp("sigmas")
    if lines == "npy_small":
        path = directory / "s.npy"
        np.save(path, np.array([1.0, 0.0, np.nan, 5e-324, 1e308]))
    elif lines == "npy_large":
        path = directory / "s.npy"
        np.save(path, np.full(4 * 10**6, 2.0))
    else:
        path = directory / "s.txt"
        text = lines[0] * lines[1] if isinstance(lines, tuple) else "\n".join(lines)
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    argv = ["epsilon", "compose-gaussians", f"--sigmas={path}", *rest] + (["--json"] if as_json else [])
    check(worker.run(argv), as_json)


METHOD_NAMES = st.sampled_from(["cosine", "peft_ensemble", "naive", "non_cl"])
TOML_NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(
        repr(x), repr(x))),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["0", "1", "64", "1000", "1e-300", "1e300", str(2**63), '"1"', "true", "[]", "{}"]),
)


def toml_value(low: float, high: float, integer: bool = False) -> st.SearchStrategy[str]:
    good = st.integers(int(low), int(high)).map(str) if integer else plausible(low, high)
    return st.one_of(TOML_NUMBER, good, good)


@fuzz_settings("configs")
@given(
    method=METHOD_NAMES,
    epsilon=toml_value(0.1, 10), delta=toml_value(1e-9, 1e-3),
    n_tasks=st.one_of(st.integers(0, 12), st.sampled_from([200, 10**4, 10**5])),
    size=toml_value(0, 5000, integer=True),
    epochs=toml_value(1, 5, integer=True), batch_size=toml_value(1, 512, integer=True),
    max_grad_norm=toml_value(0.1, 10),
    across=st.sampled_from(["auto", "parallel", "sequential"]), disjoint=st.booleans(),
    accountant=st.sampled_from(["auto", "rdp", "pld", "prv"]),
    total=st.one_of(st.none(), toml_value(0.1, 100)),
    as_json=st.booleans(),
)
def test_audit_configs_with_extreme_numbers(worker, tmp_path_factory, method, epsilon, delta, n_tasks, size, epochs,
                                             batch_size, max_grad_norm, across, disjoint, accountant, total, as_json):
    """Huge task counts, task sizes, batch sizes and epochs in a config: an answer or a refusal naming the key."""
    sizes = "[" + ", ".join([size] * n_tasks) + "]"
    method_keys = "" if method == "cosine" else (
        f"epochs = {epochs}\nbatch_size = {batch_size}\nmax_grad_norm = {max_grad_norm}\n")
    text = (
        f"[privacy]\nepsilon = {epsilon}\ndelta = {delta}\naccountant = \"{accountant}\"\n"
        f"across_tasks = \"{across}\"\n" + (f"total_epsilon = {total}\n" if total is not None else "")
        + f"\n[stream]\ndataset = \"custom\"\ntask_sizes = {sizes}\nlabel_space = \"prior_const\"\n"
        f"prior_labels = [0, 1]\ndisjoint_units = {'true' if disjoint else 'false'}\n"
        f"\n[method]\nname = \"{method}\"\n{method_keys}"
    )
    path = tmp_path_factory.mktemp("config") / "c.toml"
    path.write_text(text)
    check(worker.run(["audit", str(path)] + (["--json"] if as_json else [])), as_json)


@pytest.fixture(scope="module")
def certificate_template(tmp_path_factory):
    """A run directory with one valid certificate: a Gaussian release and 1000 DP-SGD steps, accounted with RDP."""
    from dpcl.accounting.events import GaussianEvent, PoissonSampledGaussianEvent, RepeatedEvent
    from dpcl.guarantees.atomic_io import sha256_file
    from dpcl.guarantees.certificates import certificate_from_ledger, write_certificate
    from dpcl.guarantees.ledger import TaskLedger
    from dpcl.guarantees.method_schema import ReleaseCoverage

    covered = ReleaseCoverage.post_processing("The checkpoint is a post-processing of the charged noisy releases.")
    run = tmp_path_factory.mktemp("certificate")
    ckpt = run / "checkpoints" / "task002.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"weights")
    ledger = TaskLedger(delta=1e-5, across_tasks="sequential", accountant="rdp")
    ledger.charge(0, GaussianEvent(sigma=4.0))
    ledger.charge(1, RepeatedEvent(PoissonSampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01), count=1000))
    ledger.release(1, checkpoint_sha256=sha256_file(ckpt))
    cert = certificate_from_ledger(ledger, release=covered, method="naive", label_space="prior_const",
                                   assumptions=["Public labels."], checkpoint=ckpt)
    path = run / "certificates" / "task002.cert.json"
    write_certificate(path, cert)
    return path


CERTIFICATE_FIELDS = [
    ("events", 0, "events", 0, "sigma"), ("events", 1, "events", 0, "count"),
    ("events", 1, "events", 0, "event", "noise_multiplier"), ("events", 1, "events", 0, "event", "sample_rate"),
    ("guarantee", "epsilon"), ("guarantee", "delta"), ("guarantee", "groups", 0, "epsilon"),
    ("events", 1, "tasks"), ("checkpoint", "path"),
]
JSON_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([0, 1, 10**6, 10**9, 10**12, 10**18, 2**63, 5e-324, 1e-300, 1e300, True, None, "1", [], {}]),
    st.text(max_size=8),
)


@fuzz_settings("certificates")
@given(where=st.sampled_from(CERTIFICATE_FIELDS), new=JSON_VALUES, as_json=st.booleans())
def test_verify_certificates_with_extreme_numbers(worker, certificate_template, tmp_path_factory, where, new, as_json):
    """A certificate whose numbers were replaced (and its content hash recomputed, so every check runs): verify
    answers valid / not valid or refuses the file, in bounded time and memory."""
    import hashlib
    import shutil

    run = tmp_path_factory.mktemp("verify")
    shutil.copytree(certificate_template.parent.parent, run, dirs_exist_ok=True)
    path = run / "certificates" / certificate_template.name
    data = json.loads(path.read_text())
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = new
    body = {k: v for k, v in data.items() if k not in ("sha256", "signature")}
    data["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    path.write_text(json.dumps(data))
    check(worker.run(["verify", str(path)] + (["--json"] if as_json else [])), as_json)


def test_docs_state_the_number_of_fuzz_examples():
    text = (Path(__file__).resolve().parents[2] / "docs" / "guarantees.md").read_text(encoding="utf-8")
    assert f"{FAST_EXAMPLES} examples in CI, {THOROUGH_EXAMPLES:,} with `DPCL_THOROUGH=1`" in text
