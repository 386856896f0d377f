"""Per-item progress for long loops (scripts, benchmarks): a tqdm bar on a terminal, plain lines elsewhere.

``for item in progress(items, desc="runs"):`` shows a tqdm bar when ``file`` (stderr by
default) is a terminal; otherwise (a log file, a pipe, CI) it prints one line per finished
item, ``runs: 3/12 done (41 s)``, so logs get no carriage-return clutter. The count is of
real items, so ``total`` is the length of ``items`` unless given.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Iterable, Iterator, TypeVar

__all__ = ["progress"]

T = TypeVar("T")


def progress(items: Iterable[T], *, desc: str, total: int | None = None, unit: str = "run",
             file: IO[str] | None = None) -> Iterator[T]:
    """Yield ``items``, reporting each one done (tqdm on a terminal, a plain line otherwise)."""
    stream = sys.stderr if file is None else file
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        from tqdm.auto import tqdm  # noqa: PLC0415

        yield from tqdm(items, desc=desc, total=total, unit=unit, file=stream)
        return
    start = time.perf_counter()
    of = f"/{total}" if total is not None else ""
    for done, item in enumerate(items, start=1):
        yield item
        print(f"{desc}: {done}{of} done ({time.perf_counter() - start:.0f} s)", file=stream, flush=True)
