"""PeCL (Zhan et al.): token-level dynamic DP and privacy-guided memory sculpting on a small causal LM.

``[method] name = "pecl"``. Modules: :mod:`.spec` (the torch-free MethodSpec, found by the method registry
through dpcl's ``dpcl.methods`` entry point), :mod:`.tokenizer` (public byte vocabulary), :mod:`.model` (GPT-2
architecture from a config), :mod:`.sensitivity` (eq. 1-3), :mod:`.tdp` (eq. 4-5, noise calibrated by
:mod:`dpcl.guarantees.per_token`), :mod:`.sculpting` (eq. 7-13), :mod:`.learner` (PeCL and the baselines
SeqFT, ER, EWC, O-LoRA, GEM, MTL, with or without DP-SGD), :mod:`.canary` (exposure, Carlini et al. 2019),
:mod:`.texts` (the fortunes text stream and public corpus) and :mod:`.method` (the ``dpcl run`` adapter).
Importing this package imports no torch; its training modules do. The like-for-like and ablation tables are
``benchmarks/pecl_experiment.py`` and ``benchmarks/pecl_ablation.py``.
"""
