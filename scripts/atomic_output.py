"""The scripts' one atomic writer (compare_logs.py, roofline_plot.py): an output appears whole or not at
all, so a sweep or a plot interrupted half-way never leaves a truncated CSV or PNG behind."""

import os
import tempfile


def write_atomically(path, suffix, error, write):
    """Writes `path` through a temp file in its directory renamed into place; `write(binary file)`.
    A failure to write raises `error("cannot write PATH: why")` (the caller's one-line error class)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".pl_output.", suffix=suffix, dir=directory)
    except OSError as e:
        raise error(f"cannot write {path}: {e.strerror or e}")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have made
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise error(f"cannot write {path}: {e.strerror or e}")
        raise
