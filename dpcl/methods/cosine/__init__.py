"""The DP Cosine Classifier (Tobaben et al., Alg. 1): ``[method] name = "cosine"``.

``spec.py``: the torch-free MethodSpec (its ``[method]`` keys and per-task plan), found by the method registry
through dpcl's ``dpcl.methods`` entry point; ``method.py``: ``CosineClassifier``, the torch ContinualMethod that
``dpcl run`` trains. Importing this package imports neither.
"""
