"""Input validation shared by every mechanism and accountant.

Each checker accepts a scalar or an array, refuses NaN/inf and out-of-range
values with :class:`~dpcl.errors.InvalidParameterError`, and returns the value
as a float (scalar input) or a float64 ``numpy`` array (array input).
"""

from __future__ import annotations

import math
import sys
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


#: Most elements an array parameter may have (800 MB as float64; the checks above read large arrays in chunks). A
#: larger array (such as ``np.broadcast_to(1.0, (10**10,))``, which costs nothing until it is read) is refused
#: before it is read.
MAX_ARRAY_ELEMENTS = 10**8


def describe_number(value: Any) -> str:
    """``repr(value)``, or for an integer too long to show (or to convert to a float) its sign and digit count."""
    if isinstance(value, np.ndarray) and value.dtype == object and value.size == 1:
        value = value.reshape(-1)[0]  # np.atleast_1d of a Python integer beyond int64
    elif isinstance(value, (list, tuple)) and len(value) == 1:
        return f"[{describe_number(value[0])}]"
    if isinstance(value, Integral) and not isinstance(value, bool):
        as_int = int(value)
        if abs(as_int) > 10**20:
            digits = len(str(abs(as_int)))
            return f"{'a negative' if as_int < 0 else 'an'} integer of {digits} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


#: The largest integer a float64 holds (the largest finite float, ~1.8e308).
FLOAT_MAX_INTEGER = int(sys.float_info.max)


def integer_beyond_float(value: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], int] | None:
    """The first integer beyond float range in nested dicts and lists (as read from TOML or JSON) and its path of
    keys and indices, or None. Every number of a config or certificate is used as a float somewhere, where such an
    integer would raise a bare OverflowError; readers refuse it up front, naming the key."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > FLOAT_MAX_INTEGER:
            return path, value
        return None
    for key, item in items:
        found = integer_beyond_float(item, (*path, key))
        if found is not None:
            return found
    return None


def _too_large(name: str, size: int) -> InvalidParameterError:
    return InvalidParameterError(
        f"{name} has {size:,} elements; dpcl accepts at most {MAX_ARRAY_ELEMENTS:,} per array. "
        "Split the computation into smaller arrays, or give equal values once (they broadcast)."
    )


def _as_float_array(name: str, value: Any) -> tuple[np.ndarray, bool]:
    if isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be a number, got a boolean ({value!r}).")
    size = getattr(value, "size", None)
    if isinstance(size, Integral) and size > MAX_ARRAY_ELEMENTS:  # a (broadcast) numpy array: refused before it is read
        raise _too_large(name, int(size))
    try:
        array = np.asarray(value, dtype=np.float64)
    except OverflowError as exc:
        raise InvalidParameterError(
            f"{name} must be a finite number (at most ~1.8e308 in magnitude), got {describe_number(value)}."
        ) from exc
    except MemoryError as exc:
        raise InvalidParameterError(f"{name} is too large to read as numbers; dpcl accepts at most "
                                    f"{MAX_ARRAY_ELEMENTS:,} elements per array.") from exc
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{name} must be a number, got {describe_number(value)}.") from exc
    if array.size > MAX_ARRAY_ELEMENTS:
        raise _too_large(name, int(array.size))
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


#: Largest count accepted where no smaller maximum is given (2^53: every count below it is exact as a float).
MAX_COUNT = 2**53


def check_count(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None, hint: str = "") -> int:
    """An integer count >= ``minimum`` (and <= ``maximum``: steps, repetitions, tasks).

    A count above ``maximum`` is refused with the largest value handled and ``hint``.
    """
    allowed = f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise InvalidParameterError(f"{name} must be {allowed}, got {describe_number(value)}.")
    if isinstance(value, Real) and not isinstance(value, Integral):
        if not math.isfinite(float(value)) or float(value) != int(value):
            raise InvalidParameterError(f"{name} must be {allowed}, got {value!r}.")
    count = int(value)
    if count < minimum:
        raise InvalidParameterError(f"{name} must be {allowed}, got {describe_number(count)}.")
    # every count is used as a float somewhere (an exponent, a product): one beyond float range is refused here
    limit = MAX_COUNT if maximum is None else maximum
    if count > limit:
        got = describe_number(count) if count > 10**20 else f"{count:.3g}"
        raise InvalidParameterError(
            f"{name} must be at most {limit:.3g}, got {got}{'; ' + hint if hint else ''}."
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


def parse_choice(choices: Any, value: Any, refuse: Callable[[str], Exception]) -> Any:
    """``value`` as a member of the string enum ``choices`` (a member is returned as is); anything else raises
    ``refuse(allowed)``, ``allowed`` naming every choice."""
    if isinstance(value, choices):
        return value
    try:
        return choices(str(value))
    except ValueError:
        raise refuse(", ".join(repr(c.value) for c in choices)) from None
