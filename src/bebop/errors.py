"""User-facing errors.

`BebopError` carries a one-line message that names the problem (missing file, wrong shape,
vocab mismatch, ...). The CLI prints it as `error: <message>` and exits non-zero; library
callers can catch it. Anything else escaping is a bug.
"""


class BebopError(Exception):
    """A problem with the user's input or files, explained in one line."""
