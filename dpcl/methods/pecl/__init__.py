"""PeCL (Zhan et al.): token-level dynamic DP and privacy-guided memory sculpting on a small causal LM.

Modules: :mod:`.tokenizer` (public byte vocabulary), :mod:`.model` (GPT-2
architecture from a config), :mod:`.sensitivity` (eq. 1-3), :mod:`.tdp`
(eq. 4-5, noise calibrated by :mod:`dpcl.guarantees.per_token`),
:mod:`.sculpting` (eq. 7-13), :mod:`.learner` (PeCL and the baselines SeqFT,
ER, EWC, MTL, with or without DP-SGD), :mod:`.canary` (exposure, Carlini et
al. 2019), :mod:`.experiment` and :mod:`.ablation` (tables), :mod:`.method`
(the ``dpcl run`` adapter). Importing this package imports torch.
"""

from dpcl.methods.pecl.learner import ContinualLM, LearnerConfig, learner_config

__all__ = ["ContinualLM", "LearnerConfig", "learner_config"]
from dpcl.methods.pecl.method import PeCLMethod  # noqa: E402

__all__ += ["PeCLMethod"]
