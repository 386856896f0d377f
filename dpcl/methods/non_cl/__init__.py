"""Non-continual training (Tobaben et al., Alg. A3): ``[method] name = "non_cl"``.

``spec.py``: the torch-free MethodSpec (its ``[method]`` keys and per-task plan), found by the method registry
through dpcl's ``dpcl.methods`` entry point; ``method.py``: ``NonContinualTraining``, the torch ContinualMethod that
``dpcl run`` trains. Importing this package imports neither.
"""
