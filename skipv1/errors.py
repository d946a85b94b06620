"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""


class SkipV1Error(Exception):
    """Bad input or usage: the message names the problem and what to do about it."""

    exit_code = 2
