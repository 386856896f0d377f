"""Paths read from files dpcl did not necessarily write (certificates, run state) stay inside their directory.

A certificate names its checkpoint relative to itself, and ``run.json`` names
checkpoints, certificates and curator files relative to the run directory. A
hostile or careless file could point anywhere: ``../../../etc/shadow`` (hashed
and compared, so its content leaks one bit at a time), a symlink to a device
that never ends, another run's checkpoint. :func:`contained_path` resolves such
a name only when it is relative, stays lexically inside its root, and no
component below the root is a symbolic link; anything else raises
:class:`UnsafePathError` (exit code 2) naming the field and the path.

The standard library has what is needed (``os.path.normpath``, ``os.lstat``);
no package is required.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from dpcl.errors import InvalidParameterError

__all__ = ["UnsafePathError", "contained_path"]


class UnsafePathError(InvalidParameterError):
    """A path read from a file points outside the directory it must stay in, or through a symbolic link."""


def contained_path(root: "str | os.PathLike[str]", name: object, *, what: str) -> Path:
    """``root / name``, refusing a ``name`` that is not a plain relative path inside ``root``.

    ``name`` must be a non-empty string, relative (no leading ``/``, no drive), and after collapsing ``..``
    must stay inside ``root``; no existing component between ``root`` (exclusive) and the file (inclusive) may
    be a symbolic link. ``root`` itself may be reached through links (it is resolved first). ``what`` names the
    field in the error message (e.g. ``"certificate 'x.json' checkpoint path"``).
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise UnsafePathError(f"{what} must be a non-empty relative path, got {name!r}.")
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive:
        raise UnsafePathError(
            f"{what} {name!r} is absolute; dpcl only follows paths relative to {str(root)!r} (the file may have been "
            "edited to point elsewhere)."
        )
    base = Path(root).resolve()
    joined = Path(os.path.normpath(base / name))
    if joined != base and base not in joined.parents:
        raise UnsafePathError(
            f"{what} {name!r} points outside {str(base)!r}; dpcl does not follow paths out of the directory they "
            "belong to (the file may have been edited to point elsewhere)."
        )
    current = base
    for part in joined.relative_to(base).parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            break  # a missing file is reported by the caller, with its own remedy
        except OSError:
            break
        if stat.S_ISLNK(mode):
            raise UnsafePathError(
                f"{what} {name!r} passes through the symbolic link {str(current)!r}; dpcl does not follow links out "
                "of the directory it checks. Copy the real file into place instead of linking it."
            )
    return joined
