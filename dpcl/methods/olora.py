"""O-LoRA's orthogonality loss (Wang et al. 2023, *Orthogonal Subspace Learning for Language Model Continual
Learning*, Sec. 3.2-3.3).

O-LoRA learns task ``t`` in a fresh LoRA adapter ``Delta W_t = B_t A_t`` while
the adapters of earlier tasks stay frozen and are summed with it. The update
of a LoRA layer lies in the subspace spanned by ``A_t``'s rows (peft's
``lora_A`` weight is ``[r, d_in]``; the paper writes its transpose, a
``d_in x r`` matrix whose columns span it). To keep the new task's updates out
of the earlier tasks' subspaces it adds, per adapted layer,

    L_orth(A_i, A_t) = sum_{j,k} (A_i A_t^T)[j, k]^2        for every earlier task i,

weighted by ``lambda_1`` (``olora_lambda``) to the task loss. The loss depends
on parameters only: under DP-SGD its gradient is added after the noise
(post-processing of the released adapters), like PeCL's memory regulariser.
The paper's ``lambda_2`` L2 term on the new adapter is 0 here (its released
scripts also use 0). peft has no O-LoRA; the loss is three tensor operations.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dpcl.errors import InvalidParameterError

__all__ = ["orthogonality_loss"]


def orthogonality_loss(new: Sequence[torch.Tensor], earlier: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
    """``sum_i sum_layers ||A_i A_t^T||_F^2``: ``new`` holds the new adapter's ``lora_A`` weights (one per adapted
    layer, ``[r, d_in]``), ``earlier`` one such list per earlier task (same layers, same order)."""
    total = torch.zeros((), device=new[0].device if new else None)
    for old in earlier:
        if len(old) != len(new):
            raise InvalidParameterError(f"an earlier adapter has {len(old)} LoRA layers, the new one {len(new)}.")
        for a_old, a_new in zip(old, new):
            total = total + (a_old.detach() @ a_new.transpose(0, 1)).pow(2).sum()
    return total
