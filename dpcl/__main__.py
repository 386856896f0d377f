"""``python -m dpcl``: the same command line as the ``dpcl`` console script."""

from dpcl.cli import entry_point

if __name__ == "__main__":
    entry_point()
