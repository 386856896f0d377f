"""PEFT Ensemble (Tobaben et al., Alg. 2): ``[method] name = "peft_ensemble"``.

``spec.py``: the torch-free MethodSpec (its ``[method]`` keys and per-task plan), found by the method registry
through dpcl's ``dpcl.methods`` entry point; ``method.py``: ``PeftEnsemble``, the torch ContinualMethod that
``dpcl run`` trains. Importing this package imports neither.
"""
