"""Naive fine-tuning (Tobaben et al., Alg. A2): ``[method] name = "naive"``.

``spec.py``: the torch-free MethodSpec (its ``[method]`` keys and per-task plan), found by the method registry
through dpcl's ``dpcl.methods`` entry point; ``method.py``: ``NaiveFineTuning``, the torch ContinualMethod that
``dpcl run`` trains. Importing this package imports neither.
"""
