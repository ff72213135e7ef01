"""vgen's user-facing error: one line that names the problem and the fix."""


class VGenError(ValueError):
    """Bad input or configuration. The CLI prints the message alone (no traceback) and exits with 2."""
