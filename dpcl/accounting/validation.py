"""Input validation shared by every mechanism and accountant.

Each checker accepts a scalar or an array, refuses NaN/inf and out-of-range
values with :class:`~dpcl.errors.InvalidParameterError`, and returns the value
as a float (scalar input) or a float64 ``numpy`` array (array input).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Callable, Sequence

import numpy as np

from dpcl.errors import InvalidParameterError


#: Large arrays are checked in chunks of this many elements, so a check's temporary
#: masks stay small (a mask of the whole array is formed only to report an error).
_CHUNK = 1 << 20


def _any(array: np.ndarray, bad: Callable[[np.ndarray], np.ndarray]) -> bool:
    """``np.any(bad(array))`` without a mask of the whole array when it is large and contiguous."""
    if array.size <= _CHUNK or not array.flags.c_contiguous:
        return bool(np.any(bad(array)))
    flat = array.reshape(-1)
    return any(bool(np.any(bad(flat[i : i + _CHUNK]))) for i in range(0, flat.size, _CHUNK))


def _not_finite(a: np.ndarray) -> np.ndarray:
    return ~np.isfinite(a)


def _as_float_array(name: str, value: Any) -> tuple[np.ndarray, bool]:
    if isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be a number, got a boolean ({value!r}).")
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: an int beyond float64
        raise InvalidParameterError(f"{name} must be a number, got {value!r}.") from exc
    if array.size == 0:
        raise InvalidParameterError(f"{name} is empty; give at least one value.")
    if _any(array, _not_finite):
        bad = float(array[~np.isfinite(array)].ravel()[0])
        where = "" if array.ndim == 0 else f" (element {int(np.flatnonzero(~np.isfinite(array))[0])} of the flattened array)"
        raise InvalidParameterError(f"{name} must be finite, got {bad!r}{where}.")
    return array, array.ndim == 0


def _ret(array: np.ndarray, scalar: bool) -> float | np.ndarray:
    return float(array) if scalar else array


def _describe(array: np.ndarray, mask: np.ndarray) -> str:
    value = repr(float(array[mask].ravel()[0]))
    if array.ndim == 0:
        return value
    return f"{value} (element {int(np.flatnonzero(mask)[0])} of the flattened array)"


def broadcast_together(names: Sequence[str], *arrays: Any) -> tuple[list[np.ndarray], bool]:
    """Broadcast already-checked parameters against each other (numpy rules).

    Returns float64 arrays of the common shape and whether every input was a
    scalar; shapes that do not broadcast raise :class:`InvalidParameterError`
    naming the parameters and their shapes.
    """
    scalar = all(np.ndim(a) == 0 for a in arrays)
    try:
        out = np.broadcast_arrays(*arrays)
    except ValueError:
        shapes = ", ".join(f"{n} {np.shape(a)}" for n, a in zip(names, arrays))
        raise InvalidParameterError(
            f"{', '.join(names)} must have shapes that broadcast against each other; got {shapes}."
        ) from None
    return [np.array(a, dtype=np.float64) for a in out], scalar


def check_positive(name: str, value: Any) -> float | np.ndarray:
    """Finite and > 0 (epsilon, sigma, sensitivity, scale)."""
    array, scalar = _as_float_array(name, value)
    if _any(array, lambda a: a <= 0):
        raise InvalidParameterError(f"{name} must be > 0 and finite, got {_describe(array, array <= 0)}.")
    return _ret(array, scalar)


def check_nonnegative(name: str, value: Any) -> float | np.ndarray:
    """Finite and >= 0."""
    array, scalar = _as_float_array(name, value)
    if _any(array, lambda a: a < 0):
        raise InvalidParameterError(f"{name} must be >= 0 and finite, got {_describe(array, array < 0)}.")
    return _ret(array, scalar)


def check_delta(name: str, value: Any, *, allow_zero: bool = False) -> float | np.ndarray:
    """delta in (0, 1) (or [0, 1) with ``allow_zero``)."""
    array, scalar = _as_float_array(name, value)

    def outside(a: np.ndarray) -> np.ndarray:
        return (a < 0) | (a >= 1) | ((a == 0) & (not allow_zero))

    if _any(array, outside):
        allowed = "[0, 1)" if allow_zero else "(0, 1)"
        raise InvalidParameterError(f"{name} must lie in {allowed}, got {_describe(array, outside(array))}.")
    return _ret(array, scalar)


def check_sample_rate(name: str, value: Any) -> float:
    """Poisson sampling rate q in (0, 1]."""
    array, scalar = _as_float_array(name, value)
    if not scalar:
        raise InvalidParameterError(f"{name} must be a single number, got an array.")
    q = float(array)
    if not 0 < q <= 1:
        raise InvalidParameterError(f"{name} must lie in (0, 1], got {q!r}.")
    return q


def check_count(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None, hint: str = "") -> int:
    """An integer count >= ``minimum`` (and <= ``maximum``: steps, repetitions, tasks).

    A count above ``maximum`` is refused with the largest value handled and ``hint``.
    """
    allowed = f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise InvalidParameterError(f"{name} must be {allowed}, got {value!r}.")
    if isinstance(value, Real) and not isinstance(value, Integral):
        if not math.isfinite(float(value)) or float(value) != int(value):
            raise InvalidParameterError(f"{name} must be {allowed}, got {value!r}.")
    count = int(value)
    if count < minimum:
        raise InvalidParameterError(f"{name} must be {allowed}, got {count}.")
    if maximum is not None and count > maximum:
        raise InvalidParameterError(
            f"{name} must be at most {maximum:.3g}, got {count:.3g}{'; ' + hint if hint else ''}."
        )
    return count


def check_range_scalar(name: str, value: Any, low: float, high: float, hint: str = "") -> float:
    """One finite number in [low, high]; outside it the message names the limits and ``hint``."""
    array, scalar = _as_float_array(name, value)
    if not scalar:
        raise InvalidParameterError(f"{name} must be a single number in [{low:g}, {high:g}], got an array.")
    x = float(array)
    if not low <= x <= high:
        raise InvalidParameterError(
            f"{name} must lie in [{low:g}, {high:g}], got {x!r}{'; ' + hint if hint else ''}."
        )
    return x


def check_positive_scalar(name: str, value: Any) -> float:
    """One finite number > 0 (an array is refused)."""
    array, scalar = _as_float_array(name, value)
    if not scalar:
        raise InvalidParameterError(f"{name} must be a single number > 0, got an array.")
    return float(check_positive(name, array))


def check_nonnegative_scalar(name: str, value: Any) -> float:
    """One finite number >= 0 (an array is refused)."""
    array, scalar = _as_float_array(name, value)
    if not scalar:
        raise InvalidParameterError(f"{name} must be a single number >= 0, got an array.")
    return float(check_nonnegative(name, array))


def check_delta_scalar(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """One delta in (0, 1) (or [0, 1) with ``allow_zero``); an array is refused."""
    array, scalar = _as_float_array(name, value)
    if not scalar:
        allowed = "[0, 1)" if allow_zero else "(0, 1)"
        raise InvalidParameterError(f"{name} must be a single number in {allowed}, got an array.")
    return float(check_delta(name, array, allow_zero=allow_zero))
