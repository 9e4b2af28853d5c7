"""The one exception type a user can cause; the CLI turns it into a single line and exit code 2."""


class UserError(Exception):
    """A problem the user can fix: the message names the problem and the fix, in one line."""

    exit_code = 2
