"""Building blocks of L2DP-ML (vectorised over the fixed batches): coefficient sums of the reconstruction and
output polynomials (eq. 11, 12), their Laplace perturbation, and the post-processing retractions."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dpcl.guarantees.lifelong import coefficient_digest

__all__ = ["output_coefficients", "reconstruction_coefficients"]

_DTYPE = torch.float64


# ---------------------------------------------------------------------------
# building blocks (vectorised over batches)
# ---------------------------------------------------------------------------
def _padded(values: torch.Tensor, batches: tuple[np.ndarray, ...]) -> torch.Tensor:
    """Stack batches of rows into ``[n_batches, max_size, ...]`` padded with zeros (zeros add nothing to sums)."""
    size = max(len(b) for b in batches)
    out = values.new_zeros((len(batches), size) + tuple(values.shape[1:]))
    device = values.device
    rows = torch.as_tensor(np.concatenate(batches), dtype=torch.long, device=device)
    batch_of = torch.as_tensor(np.repeat(np.arange(len(batches)), [len(b) for b in batches]), dtype=torch.long,
                               device=device)
    slot = torch.as_tensor(np.concatenate([np.arange(len(b)) for b in batches]), dtype=torch.long, device=device)
    out[batch_of, slot] = values[rows]
    return out


def _symmetric_laplace(
    rng: np.random.Generator, scale: float, n: int, d: int, device: "torch.device | str" = "cpu"
) -> torch.Tensor:
    """``n`` symmetric d x d matrices whose upper triangle (diagonal included) is i.i.d. Laplace(scale), on ``device``.

    Drawn by numpy on the CPU and then moved (an exact float64 copy), so a run with reproducible noise draws the
    same noise whatever device it computes on.
    """
    upper = np.triu(rng.laplace(0.0, scale, size=(n, d, d)))
    return torch.as_tensor(upper + np.transpose(np.triu(upper, 1), (0, 2, 1)), dtype=_DTYPE, device=device)


def reconstruction_coefficients(x: torch.Tensor, batches: tuple[np.ndarray, ...]) -> torch.Tensor:
    """Exact coefficients ``sym(A_B)`` of eq. 11 for every batch: ``[n_batches, d, d]``.

    ``A_sj = sum_r x_rj (1/2 - x_rs)``, so ``sym(A) = (c 1^T + 1 c^T)/4 - X^T X``
    with ``c = sum_r x_r`` (diagonal ``sum u/2 - u^2``, off-diagonal
    ``sum (u + v)/4 - u v``; see :func:`dpcl.guarantees.lifelong.reconstruction_sensitivity`).
    """
    xp = _padded(x, batches)
    c = xp.sum(dim=1)
    second = torch.bmm(xp.transpose(1, 2), xp)
    return (c[:, :, None] + c[:, None, :]) / 4.0 - second


def output_coefficients(
    h: torch.Tensor, y: torch.Tensor, batches: tuple[np.ndarray, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact coefficients of the output polynomial for every batch.

    ``sum_k W_k^T b_k + (1/8) W_k^T Q W_k`` (2nd-order Taylor expansion of the
    logistic loss at 0: ``log(1 + e^{-z}) y + log(1 + e^{z})(1 - y) = log 2 + z (1/2 - y)
    + z^2/8 + O(z^4)``). Returns ``b`` ``[n_batches, p, K]`` and ``Q`` ``[n_batches, p, p]``.
    """
    hp = _padded(h, batches)
    yp = _padded(y, batches)
    mask = _padded(torch.ones(h.shape[0], 1, dtype=h.dtype, device=h.device), batches)
    b = torch.bmm(hp.transpose(1, 2), mask * 0.5 - yp)
    q = torch.bmm(hp.transpose(1, 2), hp)
    return b, q


def _orthonormal_columns(theta: torch.Tensor) -> torch.Tensor:
    """QR retraction onto matrices with orthonormal columns (sign-fixed, so it is a function of ``theta``)."""
    q, r = torch.linalg.qr(theta)
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1.0
    return q * signs


def _psd_plus_ridge(q: torch.Tensor, ridge: torch.Tensor) -> torch.Tensor:
    """Project symmetric matrices to the PSD cone and add ``ridge[b] I`` (post-processing of noisy coefficients)."""
    vals, vecs = torch.linalg.eigh(q)
    vals = vals.clamp(min=0.0) + ridge[:, None]
    return (vecs * vals[:, None, :]) @ vecs.transpose(1, 2)


def _entry_digest(entry: Mapping[str, Any]) -> str:
    """Digest of a memory entry's released coefficients and unit ids (checks that memory stays fixed)."""
    arrays = [np.asarray(entry["units"])] + [
        entry[k].detach().cpu().numpy() for k in ("ae", "b_n", "q_n") if entry[k] is not None
    ]
    return coefficient_digest(*arrays)
