"""Continual-learning training methods (torch, opacus), certified by the guarantees layer.

The interface is :class:`dpcl.methods.base.ContinualMethod`; methods are looked
up by ``[method] name`` with :func:`dpcl.methods.base.method_class`. Importing
this package does not import torch: each method module does, when it is used.

Every built-in method is a package ``dpcl.methods.<name>`` holding its torch-free
spec (``spec.py``, registered through dpcl's ``dpcl.methods`` entry points) and
its class (``method.py``): ``cosine`` (DP Cosine Classifier, Alg. 1 of Tobaben et
al.), ``peft_ensemble`` (PEFT Ensemble, Alg. 2), ``naive`` (Alg. A2), ``non_cl``
(Alg. A3), ``agem`` (DP-SGD A-GEM), ``l2dpml`` (Lai et al.), ``pecl`` (Zhan et
al.). Every DP-SGD method trains on :mod:`dpcl.methods.dpsgd_engine`.
"""

from dpcl.methods.base import (
    METHOD_CLASSES,
    ContinualMethod,
    MethodSetup,
    ProgressCallback,
    TrainingData,
    TrainingTask,
    method_class,
)

__all__ = [
    "METHOD_CLASSES",
    "ContinualMethod",
    "MethodSetup",
    "ProgressCallback",
    "TrainingData",
    "TrainingTask",
    "method_class",
]
