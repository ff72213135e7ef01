"""vgen's user-facing error: one line that names the problem and the fix."""


class VGenError(ValueError):
    """Bad input or configuration. The CLI prints the message alone (no traceback) and exits with 2."""


class VGenWarning(UserWarning):
    """Something the user should know that does not stop the run (e.g. too few samples for FID). The CLI prints
    each one as one line."""
