"""Parse numeric command-line values into validated numbers.

argparse's ``type=float`` accepts ``nan``, ``inf`` and ``1e999`` and reports
other problems in its own words. The accounting commands instead read every
number as text and parse it here, so that each bad value -- ``abc``, ``nan``,
``inf``, ``-1``, ``0`` -- raises :class:`~dpcl.errors.InvalidParameterError`
whose message names the option (``--epsilon``) and what it allows. The
dispatcher in :mod:`dpcl.cli` turns that error into one line on stderr and exit
code 2.

The ``--sigmas`` file reader lives here too: one sigma per line (blank lines
and lines starting with ``#`` are ignored) or a NumPy ``.npy`` array. So does
:func:`computed`, the last check on a number before a command prints it: NaN
is never printed.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from dpcl.accounting.events import MAX_SAMPLED_STEPS, MIN_SAMPLE_RATE, NOISE_MULTIPLIER_RANGE, STEPS_HINT
from dpcl.errors import InvalidParameterError


def _finite_float(option: str, text: str, allowed: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise InvalidParameterError(f"{option} must be {allowed}, got {text!r} (not a number).") from None
    if not math.isfinite(value):
        raise InvalidParameterError(f"{option} must be {allowed}, got {text!r}.")
    return value


def parse_positive(option: str, text: str) -> float:
    """A finite number > 0 (epsilon, sigma, sensitivity, noise multiplier)."""
    allowed = "a finite number > 0"
    value = _finite_float(option, text, allowed)
    if value <= 0:
        raise InvalidParameterError(f"{option} must be {allowed}, got {text!r}.")
    return value


def parse_delta(option: str, text: str, *, allow_zero: bool = False) -> float:
    """delta strictly inside (0, 1), or in [0, 1) with ``allow_zero`` (a pure-DP claim)."""
    allowed = "a number in [0, 1)" if allow_zero else "a number in the open interval (0, 1)"
    value = _finite_float(option, text, allowed)
    if not (0.0 <= value < 1.0 if allow_zero else 0.0 < value < 1.0):
        raise InvalidParameterError(f"{option} must be {allowed}, got {text!r}.")
    return value


def parse_sample_rate(option: str, text: str) -> float:
    """Poisson sampling rate q in (0, 1]."""
    allowed = "a number in (0, 1]"
    value = _finite_float(option, text, allowed)
    if not 0.0 < value <= 1.0:
        raise InvalidParameterError(f"{option} must be {allowed}, got {text!r}.")
    return value


def parse_count(option: str, text: str, minimum: int = 1, maximum: int | None = None, hint: str = "") -> int:
    """An integer >= ``minimum`` (and <= ``maximum``); ``10000`` and ``1e4`` are accepted, ``2.5`` is not.

    Above ``maximum`` the message gives the largest value handled and ``hint``.
    """
    allowed = f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    stripped = str(text).strip()
    try:
        value = int(stripped)
    except ValueError:
        as_float = _finite_float(option, stripped, allowed)
        if as_float != math.floor(as_float):
            raise InvalidParameterError(f"{option} must be {allowed}, got {text!r}.") from None
        value = int(as_float)
    if value < minimum:
        raise InvalidParameterError(f"{option} must be {allowed}, got {text!r}.")
    if maximum is not None and value > maximum:
        largest = f"{maximum:.0e}" if maximum >= 10**6 else str(maximum)
        raise InvalidParameterError(
            f"{option} must be at most {largest}, got {text!r}{'; ' + hint if hint else ''}."
        )
    return value


def parse_range(option: str, text: str, low: float, high: float, hint: str = "") -> float:
    """A finite number in [low, high]; outside it the message gives the limits and ``hint``."""
    allowed = f"a number in [{low:g}, {high:g}]"
    value = _finite_float(option, text, allowed)
    if not low <= value <= high:
        raise InvalidParameterError(f"{option} must be {allowed}, got {text!r}{'; ' + hint if hint else ''}.")
    return value


def read_sigmas(option: str, path: str | Path) -> np.ndarray:
    """Read noise scales from ``path``: a ``.npy`` array or a text file with one sigma per line.

    Text files: blank lines and lines whose first non-space character is ``#``
    are ignored; every other line must hold exactly one finite number > 0, and
    the first line that does not is named by its (1-based) line number.
    ``.npy`` files (any shape, flattened) must hold finite numbers > 0; the
    first bad entry is named by its flat index. An empty, missing or unreadable
    file raises :class:`InvalidParameterError`.
    """
    path = Path(path)
    if path.suffix.lower() == ".npy":
        return _read_npy(option, path)
    return _read_text(option, path)


#: Largest ``--sigmas`` inputs read (memory stays far below 2 GB): a text file of 16 MiB holds about 1.5 million
#: sigmas; a .npy file of at most 256 MiB and 1e7 entries (80 MB as float64). More belongs in several files.
MAX_SIGMAS_TEXT_BYTES = 16 * 1024 * 1024
MAX_SIGMA_NPY_BYTES = 256 * 1024 * 1024
MAX_SIGMAS_ENTRIES = 10**7


def _check_size(option: str, path: Path, limit: int, hint: str) -> None:
    try:
        size = path.stat().st_size
    except OSError:
        return  # reported by the reader with its own message
    if size > limit:
        raise InvalidParameterError(
            f"{option}: {str(path)!r} is {size} bytes; dpcl reads sigma files of at most {limit} bytes "
            f"({limit / 2**20:.3g} MiB); {hint}"
        )


def _read_npy(option: str, path: Path) -> np.ndarray:
    _check_size(option, path, MAX_SIGMA_NPY_BYTES, "split the sigmas into several compositions.")
    try:
        header = np.load(path, mmap_mode="r", allow_pickle=False)
        entries = int(getattr(header, "size", 0))
        del header
    except (OSError, ValueError, EOFError):
        entries = 0  # reported by the full read below
    if entries > MAX_SIGMAS_ENTRIES:
        raise InvalidParameterError(
            f"{option}: {str(path)!r} holds {entries:.3g} sigmas; at most {MAX_SIGMAS_ENTRIES:.0e} are read. "
            "Group equal sigmas (their composition is exact: mu^2 adds) or split the file."
        )
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidParameterError(f"{option}: cannot read {str(path)!r} as a .npy array ({exc}).") from None
    if not isinstance(array, np.ndarray) or not (
        np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    ):
        raise InvalidParameterError(
            f"{option}: {str(path)!r} must hold a numeric array of sigmas, got dtype {getattr(array, 'dtype', '?')}."
        )
    sigmas = np.asarray(array, dtype=np.float64).ravel()
    if sigmas.size == 0:
        raise InvalidParameterError(f"{option}: {str(path)!r} is empty; give at least one sigma > 0.")
    bad = ~(np.isfinite(sigmas) & (sigmas > 0))
    if np.any(bad):
        index = int(np.flatnonzero(bad)[0])
        raise InvalidParameterError(
            f"{option}: {str(path)!r} entry {index} must be a finite number > 0, got {float(sigmas[index])!r}."
        )
    return sigmas


def _read_text(option: str, path: Path) -> np.ndarray:
    _check_size(option, path, MAX_SIGMAS_TEXT_BYTES,
                f"save the sigmas as a .npy array (numpy.save; up to {MAX_SIGMAS_ENTRIES:.0e} entries) instead.")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidParameterError(f"{option}: cannot read {str(path)!r} ({exc.strerror or exc}).") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameterError(
            f"{option}: {str(path)!r} is not UTF-8 text; give one sigma per line or a .npy array."
        ) from None
    # variable-width strings: a fixed-width array would take (longest line) x (lines) x 4 bytes
    stripped = np.strings.strip(np.array(text.splitlines() or [""], dtype=np.dtypes.StringDType()))
    keep = (np.strings.str_len(stripped) > 0) & ~np.strings.startswith(stripped, "#")
    values_text = stripped[keep]
    line_numbers = np.flatnonzero(keep) + 1
    if values_text.size == 0:
        raise InvalidParameterError(f"{option}: {str(path)!r} holds no sigma; give one sigma > 0 per line.")
    try:
        sigmas = values_text.astype(np.float64)
    except ValueError:
        # Error path only: find the first line that is not a number.
        for text_value, line in zip(values_text.tolist(), line_numbers.tolist()):
            try:
                float(text_value)
            except ValueError:
                raise InvalidParameterError(
                    f"{option}: {str(path)!r} line {line} is not a number: {text_value[:40]!r}; "
                    "give one sigma > 0 per line."
                ) from None
        raise  # pragma: no cover - numpy and float() disagree on a number
    bad = ~(np.isfinite(sigmas) & (sigmas > 0))
    if np.any(bad):
        index = int(np.flatnonzero(bad)[0])
        raise InvalidParameterError(
            f"{option}: {str(path)!r} line {int(line_numbers[index])} must be a finite number > 0, "
            f"got {str(values_text[index])!r}."
        )
    return sigmas


def computed(name: str, value: float, inputs: str, *, allow_inf: bool = False) -> float:
    """Return ``value`` as a float if it is a number a command may print, else raise InvalidParameterError.

    NaN is never printed. ``+inf`` is printed only where it is a true upper
    bound (``allow_inf``: an epsilon so large it overflows a float). ``inputs``
    names the options that led there, so the message says what to change.
    """
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise InvalidParameterError(
            f"{name} cannot be computed in floating point for {inputs}; these values are outside the "
            "numerically supported range, choose less extreme ones."
        )
    return value


def parse_dpsgd_inputs(args: argparse.Namespace) -> tuple[float, int]:
    """``--sample-rate`` and ``--steps`` of a DP-SGD command, within what the accountants handle."""
    sample_rate = parse_sample_rate("--sample-rate", args.sample_rate)
    if sample_rate < MIN_SAMPLE_RATE:
        raise InvalidParameterError(
            f"--sample-rate must be at least {MIN_SAMPLE_RATE:g}, got {args.sample_rate!r}; a smaller rate is "
            f"bounded by the same accounting at {MIN_SAMPLE_RATE:g} (less sampling can only help), so use that."
        )
    steps = parse_count("--steps", args.steps, maximum=MAX_SAMPLED_STEPS, hint=STEPS_HINT)
    return sample_rate, steps


def parse_noise_multiplier(option: str, text: str) -> float:
    """A DP-SGD noise multiplier within what the accountants handle (:data:`NOISE_MULTIPLIER_RANGE`)."""
    low, high = NOISE_MULTIPLIER_RANGE
    value = parse_positive(option, text)
    if value < low:
        raise InvalidParameterError(
            f"{option} must be at least {low:g}, got {text!r}; below it every step alone has epsilon > 1e5, "
            "which no accountant bounds reliably in floating point: add noise."
        )
    if value > high:
        raise InvalidParameterError(
            f"{option} must be at most {high:g}, got {text!r}; above it a step's privacy loss is below float "
            f"resolution (epsilon ~0): use {high:g}, whose epsilon bounds yours."
        )
    return value

