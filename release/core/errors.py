"""The one exception root of the tool, and the gate failure beneath it."""


class ReleaseError(Exception):
    """Root of every error the tool reports to a user.

    The message is one line that names the file, field or tensor at fault and says how to fix it;
    the CLI prints it and exits with ``exit_code`` (2: bad input).
    """

    exit_code = 2


class GateError(ReleaseError):
    """A build that failed verification or a gate: the input is valid, the result is not acceptable."""

    exit_code = 1
