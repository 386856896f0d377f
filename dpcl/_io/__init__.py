"""File I/O that must not lose data, below every layer: atomic writes and bounded JSON reads
(:mod:`~dpcl._io.atomic_io`), paths that cannot escape their directory (:mod:`~dpcl._io.safe_paths`)
and the lock that keeps two runs off one output directory (:mod:`~dpcl._io.run_lock`).

Imports only the standard library and :mod:`dpcl.errors`; every other dpcl module may import it.
"""
