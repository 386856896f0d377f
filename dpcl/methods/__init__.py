"""Continual-learning training methods (torch, opacus), certified by the guarantees layer.

The interface is :class:`dpcl.methods.base.ContinualMethod`; methods are looked
up by ``[method] name`` with :func:`dpcl.methods.base.method_class`. Importing
this package does not import torch: each method module does, when it is used.

Methods (Tobaben et al., paper 001): ``cosine`` (DP Cosine Classifier, Alg. 1),
``peft_ensemble`` (PEFT Ensemble, Alg. 2), ``naive`` (Alg. A2), ``non_cl``
(Alg. A3); and ``l2dpml`` (Lai et al.), ``pecl`` (Zhan et al.).
"""

from dpcl.methods.base import (
    METHOD_CLASSES,
    ContinualMethod,
    MethodSetup,
    ProgressCallback,
    TrainingData,
    method_class,
)

__all__ = [
    "METHOD_CLASSES",
    "ContinualMethod",
    "MethodSetup",
    "ProgressCallback",
    "TrainingData",
    "method_class",
]
