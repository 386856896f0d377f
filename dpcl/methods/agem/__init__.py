"""DP-SGD A-GEM (Chaudhry et al. 2019; Lai et al., Sec. 6): ``[method] name = "agem"``.

``spec.py``: the torch-free MethodSpec (its ``[method]`` keys and per-task plan), found by the method registry
through dpcl's ``dpcl.methods`` entry point; ``method.py``: ``AGemFineTuning``, the torch ContinualMethod that
``dpcl run`` trains. Importing this package imports neither.
"""
