"""L2DP-ML (Lai et al., Lifelong DP): ``[method] name = "l2dpml"``.

``spec.py``: the torch-free MethodSpec (its ``[method]`` keys and per-task plan), found by the method registry
through dpcl's ``dpcl.methods`` entry point; ``method.py``: ``L2DPMLMethod``, the torch ContinualMethod that
``dpcl run`` trains. Importing this package imports neither.
"""
