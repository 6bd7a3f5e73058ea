"""Errors that mean "the user asked for something wrong", not "the code is broken".

`launch.py` prints these as one line (what, where, what to do) instead of a traceback.
"""


class UserError(Exception):
    """Base class: bad input, config or data that the user can fix."""


class DataError(UserError):
    """Missing, corrupt or out-of-range data. The message names the file (and line)."""


class ConfigError(UserError):
    """An unknown or invalid config field or value."""


class WorkdirBusy(UserError):
    """Another run holds the workdir's lock (launch.py exits with EXIT_WORKDIR_BUSY)."""


class CheckpointError(UserError):
    """Checkpoints that cannot be read or written (unreadable, inconsistent, disk full).
    The message names the folder and what to do."""
