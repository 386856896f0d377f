"""A self-convolution of a PMF by real FFT whose every point is an upper bound of the exact value.

dp-accounting composes a PLD with itself ``n`` times by raising the FFT of its PMF to the power ``n`` and
inverting it. In floating point that leaves a noise of rounding on every point of the result, of the order of the
unit roundoff times the largest point, amplified up to ``n`` times by the power; where epsilon is read at a small
delta the composed masses are of that order, and an epsilon computed from them can fall below the exact value
of the same pessimistic discretisation. :func:`bounded_self_convolve` returns instead, at every point, a number
that is provably at least the exact ``n``-fold linear self-convolution there:

* **Rigorous error bound of one FFT power.** For an input ``x >= 0`` of length ``L`` (the FFT length) with
  ``||x||_1 = s``, the computed spectrum ``X~`` differs from the exact DFT ``X`` by at most
  ``a = ((1 + eta)^D - 1) s`` in every entry: each output of a radix-2 FFT is the root of a tree of ``log2 L``
  butterfly levels whose weights have modulus 1, and a butterfly computed in floating point adds a relative
  error of at most ``eta = mu + gamma_4 (sqrt(2) + mu)`` (``mu``: the error of the twiddle factors); the normwise
  form of this induction is Higham (2002), *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §24.1,
  Thm 24.2. ``D`` counts a radix-3 stage as 2 levels and a radix-5 stage as 4 (scipy's lengths are 2^a 3^b 5^c),
  and ``eta`` is taken as 8 u (u = 2^-53; Higham's is ~6.7 u for mu = u). The power is taken by binary
  exponentiation, each complex product with relative error at most sqrt(5) u (Brent, Percival & Zimmermann
  2007), so ``fl(z^n) = z^n (1 + b)`` with ``|b| <= (1 + sqrt(5) u)^(n-1) - 1``. With
  ``|z^n - w^n| <= n |z - w| max(|z|, |w|)^(n-1)`` and ``|X_k| <= |X~_k| + a``, the inverse real FFT
  (``1/L`` times a sum over the spectrum, bounded in the same way) gives every point of the cyclic convolution
  within ``E = (1/L) sum_k w_k [n a r_k^(n-1) + (b + a' (1 + b)) r_k^n]`` of its exact value, with
  ``r_k = |X~_k| + a``, ``a' = (1 + eta)^D - 1`` and ``w_k`` the multiplicity of the rfft entry k in the
  full spectrum (1 or 2); a further factor :data:`SAFETY` is applied to ``E``. ``E`` is evaluated from the
  computed spectrum itself, before the power.
* **Exponential tilting.** ``E`` is uniform over the points, so it bounds the large points of the result
  tightly and the tails, orders of magnitude smaller, loosely. The composition commutes with the tilt
  ``p_i -> p_i e^(theta i)`` (Keich 2005, *sFFT*, J. Comput. Biol. 12(4), who bounds FFT round-off the same way
  and tilts to compute tail p-values accurately): the ``n``-fold convolution of the tilted PMF, times
  ``e^(n C - theta j)``, is the exact one at j. Tilts centred further and further up the upper tail make
  every point there accurate to the same relative precision as the bulk; each point keeps the smallest of its
  bounds. The computed tilted weights carry their own rounding, bounded per entry and accounted as a factor
  ``(1 - k u)^-n`` on the result.

Every bound also holds for the cyclic convolution's aliasing (each aliased term is nonnegative, so the
cyclic value bounds the linear one from above). Why hand-written: no library offers an FFT convolution with
a bound on its result; dp-accounting's own composition (used by dpcl below 1e6 points) carries none.
"""

from __future__ import annotations

import math

import numpy as np

#: The unit roundoff of float64.
UNIT_ROUNDOFF = 2.0 ** -53
#: Relative error of one FFT butterfly level (Higham's eta = mu + gamma_4 (sqrt 2 + mu) is ~6.7 u for mu = u).
BUTTERFLY_ETA = 8.0 * UNIT_ROUNDOFF
#: Relative error of one complex product (Brent, Percival & Zimmermann 2007: sqrt(5) u without FMA, 2 u with it).
COMPLEX_PRODUCT_ERROR = math.sqrt(5.0) * UNIT_ROUNDOFF
#: Margin on every error bound (for the radix-4 and real-FFT passes of scipy's pocketfft, whose operation counts
#: per level differ from the textbook radix-2 butterfly the bound is stated for).
SAFETY = 4.0
#: A point counts as accurate in one FFT where the bound exceeds the computed value there by at most this,
#: relative; tilts are added past the accurate range, at most :data:`MAX_TILTS` up the upper tail and as many down
#: the lower one.
TILT_TOLERANCE = 1e-6
MAX_TILTS = 6
#: A direction's tilts stop once the bounds beyond their accurate range sum to at most this (those bounds stay
#: valid, only looser than the tilted ones would be).
NEGLIGIBLE_MASS = 1e-30
#: Spectrum entries processed per chunk (bounds the temporaries of the power and of the error sums).
_CHUNK = 1 << 16


def _fft_levels(length: int) -> int:
    """D: butterfly levels of an FFT of ``length`` = 2^a 3^b 5^c (7 and 11 weighted 6 and 10), radix r as r - 1."""
    levels, rest = 0, int(length)
    for radix in (2, 3, 5, 7, 11):
        while rest % radix == 0:
            rest //= radix
            levels += radix - 1
    if rest != 1:
        levels += rest - 1  # any other factor: a direct DFT of that size
    return levels


def _power_with_bound(spectrum: np.ndarray, count: int, length: int, mass: float) -> float:
    """Raise ``spectrum`` (the rfft of a nonnegative input of 1-norm at most ``mass`` and FFT length ``length``) to
    ``count`` in place, by binary exponentiation; return ``E``, the bound on the error of every point of its
    inverse rfft (see the module docstring), the margin :data:`SAFETY` included."""
    levels = _fft_levels(length)
    a_rel = math.expm1(levels * math.log1p(BUTTERFLY_ETA))
    a = a_rel * mass
    b = math.expm1((count - 1) * math.log1p(COMPLEX_PRODUCT_ERROR))
    half = spectrum.size
    total = 0.0
    for start in range(0, half, _CHUNK):
        chunk = spectrum[start : start + _CHUNK]
        r = np.abs(chunk) + a  # bounds |X~_k| and the exact |X_k|
        with np.errstate(divide="ignore", under="ignore"):
            log_r = np.log(r)
            weights = np.full(chunk.size, 2.0)
            if start == 0:
                weights[0] = 1.0
            if start + chunk.size == half and length % 2 == 0:
                weights[-1] = 1.0
            r_n1 = np.exp((count - 1) * log_r)
            r_n = np.exp(count * log_r)
        total += float(np.sum(weights * (count * a * r_n1 + (b + a_rel * (1.0 + b)) * r_n)))
        # binary exponentiation of the chunk, in place
        base = chunk.copy()
        acc = None
        n = count
        with np.errstate(under="ignore", invalid="ignore"):
            while True:
                if n & 1:
                    acc = base.copy() if acc is None else np.multiply(acc, base, out=acc)
                n >>= 1
                if not n:
                    break
                np.multiply(base, base, out=base)
        chunk[...] = acc
    # products that underflow to subnormal numbers lose their relative precision: at most 2^-1000 absolutely per
    # entry of the powered spectrum (~2 log2(count) roundings of 2^-1075 each, none amplified: |z| <= 1 + a)
    underflow = 2.0 ** -1000 * 2 * half
    return SAFETY * (total / length + underflow / length)


def _window(cyclic: np.ndarray, lower: int, output_len: int) -> np.ndarray:
    """The window [lower, lower + output_len) of the cyclic array (``np.roll(cyclic, -lower)[:output_len]``)."""
    length = cyclic.size
    start = lower % length
    if start + output_len <= length:
        return np.array(cyclic[start : start + output_len])
    return np.concatenate((cyclic[start:], cyclic[: output_len - (length - start)]))


def cyclic_power_window(
    weights: np.ndarray, count: int, lower: int, output_len: int, length: int
) -> tuple[np.ndarray, float]:
    """The window [lower, lower + output_len) of ``weights`` (nonnegative) convolved with itself ``count`` times
    cyclically with period ``length``, computed by real FFT, and the bound ``E`` on the error of every point."""
    from scipy import fft

    mass = float(np.sum(weights)) * (1.0 + 2.0 * weights.size * UNIT_ROUNDOFF)  # summation error bound gamma_m
    spectrum = fft.rfft(weights, length)
    bound = _power_with_bound(spectrum, count, length, mass)
    cyclic = fft.irfft(spectrum, length)
    del spectrum
    return _window(cyclic, lower, output_len), bound


def _tilted(probs: np.ndarray, theta: float) -> tuple[np.ndarray, float, float]:
    """``probs_i e^(theta (i - i0) - C)`` with C making it sum to ~1; returns it, C' = C + theta i0 (so the
    weights are ``probs_i e^(theta i - C')``), and k: every computed weight is at least (1 - k u) times its exact
    value."""
    index = np.arange(probs.size, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_p = np.log(probs)
    exponents = theta * index + log_p
    top = float(np.max(exponents[np.isfinite(exponents)]))
    log_mass = top + math.log(float(np.sum(np.exp(exponents - top))))
    arguments = theta * index - log_mass  # the tilt factor's exponent, computed once per entry
    tilt = np.exp(arguments)
    weights = probs * tilt
    # the exponent theta * i - C carries at most ~2 u (|theta i| + |C|) of absolute error, exp one ulp, the
    # product one rounding: a relative error at most k u
    largest = abs(theta) * float(index[-1]) + abs(log_mass)
    k = 2.0 * (2.0 * largest + 3.0) + 2.0
    return weights, log_mass, k


def _tilt_for_mean(probs: np.ndarray, count: int, target: float) -> float:
    """The theta whose tilted PMF, convolved ``count`` times, has mean index ``target`` (bisection)."""
    index = np.arange(probs.size, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_p = np.log(probs)
    finite = np.isfinite(log_p)
    index, log_p = index[finite], log_p[finite]

    def mean(theta: float) -> float:
        e = theta * index + log_p
        w = np.exp(e - np.max(e))
        return count * float(np.dot(w, index) / np.sum(w))

    step = 1.0 / max(probs.size, 1)
    if mean(0.0) <= target:
        lo, hi = 0.0, step
        while mean(hi) < target and hi < 1e3:
            lo, hi = hi, hi * 2.0
    else:
        lo, hi = -step, 0.0
        while mean(lo) > target and lo > -1e3:
            lo, hi = lo * 2.0, lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if mean(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def bounded_self_convolve(probs: np.ndarray, count: int, lower: int, output_len: int, length: int) -> np.ndarray:
    """An upper bound, at every point, of the ``count``-fold linear self-convolution of ``probs`` (nonnegative) on
    the indices [lower, lower + output_len), from real FFTs of period ``length`` (see the module docstring).

    The untilted FFT bounds every point; tilts up the upper tail are added while the top of the window is bounded
    more than :data:`TILT_TOLERANCE` above its computed value (at most :data:`MAX_TILTS`), each centred where the
    previous one stops being that accurate; each point keeps its smallest bound."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.size == 0 or np.any(probs < 0) or not np.all(np.isfinite(probs)):
        raise ValueError("a PMF to self-convolve must be finite and nonnegative")
    window, bound = cyclic_power_window(probs, count, lower, output_len, length)
    first, last = _accurate_range(window, bound)
    if last >= 0:  # the untilted result's mean index, where its bulk is
        centre = float(np.dot(np.arange(output_len, dtype=np.float64), np.maximum(window, 0.0)) / np.sum(np.maximum(window, 0.0)))
    upper = window
    upper += bound
    np.maximum(upper, 0.0, out=upper)
    if last < 0:
        return upper
    block = [first, last]  # the accurate range reached contiguously from the untilted one
    for direction in (1, -1):  # up the upper tail, then down the lower one
        side = 1 if direction > 0 else 0
        step = 0.8 * max(centre - first if direction > 0 else last - centre, 1.0)  # the next tilt's distance past it
        for _ in range(MAX_TILTS):
            edge = block[side]
            rest = upper[edge + 1 :] if direction > 0 else upper[:edge]
            if rest.size == 0 or float(np.sum(rest)) <= NEGLIGIBLE_MASS or step < 1.0:
                break
            end = output_len - 1.0 if direction > 0 else 0.0
            target = edge + direction * min(step, 0.5 * abs(end - edge))  # at most halfway to the window's end
            theta = _tilt_for_mean(probs, count, lower + target)
            if not theta * direction > 0:
                break
            weights, log_mass, k = _tilted(probs, theta)
            window, bound = cyclic_power_window(weights, count, lower, output_len, length)
            del weights
            _keep_smaller(upper, window, bound, theta, log_mass, k, count, lower)
            new_first, new_last = _accurate_range(window, bound)
            del window
            if new_last >= 0 and new_first <= block[1] + 1 and new_last >= block[0] - 1:
                # contiguous: the block grows; the next tilt overlaps this one's range on its near side
                block = [min(block[0], new_first), max(block[1], new_last)]
                step = 0.8 * max(target - new_first if direction > 0 else new_last - target, 1.0)
            else:  # a gap (or nothing accurate): a tilt halfway between
                step = 0.5 * abs(target - edge)
    return upper


def _accurate_range(window: np.ndarray, bound: float) -> tuple[int, int]:
    """The first and last index where ``bound`` is at most :data:`TILT_TOLERANCE` of the computed value; -1, -1 if
    none."""
    accurate = np.greater_equal(window, bound / TILT_TOLERANCE)
    if not accurate.any():
        return -1, -1
    return int(np.argmax(accurate)), int(accurate.size - 1 - np.argmax(accurate[::-1]))


def _keep_smaller(
    upper: np.ndarray, window: np.ndarray, bound: float, theta: float, log_mass: float, k: float, count: int,
    lower: int,
) -> None:
    """upper = min(upper, the bound from one tilt): ``(window + bound) e^(n C' - theta j) (1 - k u)^-n``, its
    exponent and products rounded upwards by their error bounds; in chunks."""
    u = UNIT_ROUNDOFF
    scale = -count * math.log1p(-k * u) + 8.0 * u  # (1 - k u)^-n and the roundings of exp and the two products
    for start in range(0, upper.size, _CHUNK * 16):
        stop = min(start + _CHUNK * 16, upper.size)
        j = lower + np.arange(start, stop, dtype=np.float64)
        exponent = count * log_mass - theta * j
        exponent += 4.0 * u * (abs(count * log_mass) + abs(theta) * np.abs(j)) + scale
        with np.errstate(over="ignore", invalid="ignore"):
            candidate = (np.maximum(window[start:stop], 0.0) + bound) * np.exp(exponent)
        candidate += 2.0 ** -996  # where the product underflows to a subnormal number, its relative error is unbounded
        np.minimum(upper[start:stop], candidate, out=upper[start:stop], where=np.isfinite(candidate))
