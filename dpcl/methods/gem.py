"""Gradient Episodic Memory's projections: GEM (Lopez-Paz & Ranzato 2017, eq. 10-11) and A-GEM
(Chaudhry et al. 2019, *Efficient Lifelong Learning with A-GEM*, eq. 11).

GEM keeps a small episodic memory of every earlier task. Before each update
it compares the proposed gradient ``g`` with the memories' gradients ``G``
(one row per earlier task). When some ``<g, g_k> < 0`` the update would raise
an earlier task's loss (to first order), and GEM replaces ``g`` by the closest
vector that does not (eq. 10):

    minimise_z  1/2 ||g - z||^2   subject to   G z >= 0.

GEM solves the dual (eq. 11) with ``v >= 0`` (one variable per earlier task):

    minimise_v  1/2 v^T G G^T v + g^T G^T v   subject to   v >= 0,   z = G^T v + g.

Up to the constant ``1/2 ||g||^2`` that dual is ``1/2 ||G^T v + g||^2``, a
non-negative least-squares problem: ``scipy.optimize.nnls(G^T, -g)`` solves it
exactly (Lawson-Hanson active set), so no QP package is needed (the original
implementation calls ``quadprog`` on the same dual; scipy is already a
dependency of dpcl). The projection's inputs are gradients: under DP-SGD both
``g`` and every row of ``G`` must already be released (noisy) gradients, and
the projection is then post-processing (see :mod:`dpcl.methods.pecl.learner`).

A-GEM relaxes GEM's one constraint per earlier task into one constraint on the
*average* episodic-memory loss: with ``g_ref`` the gradient on a batch drawn from
the memory of all earlier tasks, it keeps ``g`` when ``g^T g_ref >= 0`` and
otherwise projects onto the half-space's boundary in closed form (eq. 11):

    g~ = g - (g^T g_ref / g_ref^T g_ref) g_ref.
"""

from __future__ import annotations

import torch

from dpcl.errors import InvalidParameterError

__all__ = ["agem_project", "gem_project", "violates_memories"]


def violates_memories(gradient: torch.Tensor, memory_gradients: torch.Tensor) -> bool:
    """Whether ``gradient`` has a negative inner product with a memory gradient (GEM's test before eq. 10)."""
    if memory_gradients.numel() == 0:
        return False
    return bool((memory_gradients @ gradient < 0).any())


def gem_project(gradient: torch.Tensor, memory_gradients: torch.Tensor) -> torch.Tensor:
    """GEM's projected gradient (eq. 10-11): ``g`` itself when no constraint is violated, else ``G^T v + g``.

    ``gradient`` is a flat ``[p]`` tensor, ``memory_gradients`` a ``[t, p]``
    tensor (one row per earlier task). The result satisfies ``G z >= 0`` up to
    the solver's tolerance (GEM's margin ``gamma`` is 0: eq. 10 as stated).
    """
    if gradient.ndim != 1 or memory_gradients.ndim != 2 or memory_gradients.shape[1] != gradient.shape[0]:
        raise InvalidParameterError(
            f"gem_project needs a flat gradient [p] and memory gradients [t, p], got {tuple(gradient.shape)} and "
            f"{tuple(memory_gradients.shape)}."
        )
    if not violates_memories(gradient, memory_gradients):
        return gradient
    from scipy.optimize import nnls

    g = gradient.detach().double().cpu().numpy()
    memories = memory_gradients.detach().double().cpu().numpy()
    v, _ = nnls(memories.T, -g)  # argmin_{v >= 0} ||G^T v + g||: GEM's dual (eq. 11)
    projected = memories.T @ v + g
    return torch.as_tensor(projected, dtype=gradient.dtype, device=gradient.device)


def agem_project(g: torch.Tensor, g_ref: torch.Tensor) -> torch.Tensor:
    """A-GEM projection (Chaudhry et al. 2019, eq. 11): remove the part of ``g`` that increases the memory loss.

    ``g~ = g - (g^T g_ref / g_ref^T g_ref) g_ref`` when ``g^T g_ref < 0``, else ``g`` (also when ``g_ref = 0``).
    Then ``g~^T g_ref = 0``: to first order the step leaves the memory loss unchanged.
    """
    dot = torch.sum(g * g_ref)
    norm2 = torch.sum(g_ref * g_ref)
    if dot >= 0 or norm2 <= 0:
        return g
    return g - (dot / norm2) * g_ref
