"""dpcl: checkable differential privacy for continual learning.

Layers (see DESIGN notes in the README): ``dpcl.accounting`` (mechanisms and
numbers), ``dpcl.guarantees`` (task-wise DP semantics, certificates),
``dpcl.audit`` (empirical lower bounds), ``dpcl.data``, ``dpcl.methods`` (torch),
``dpcl.cli``. The first three never import torch.
"""

__version__ = "0.1.0"
