"""User-facing errors.

Every problem a user can cause (bad config, missing data, unknown block, NaN in a table, ...) is
raised as :class:`HybridFLError` with one sentence that says what is wrong and where. The CLI
prints that sentence and exits with status 2, without a traceback.
"""


class HybridFLError(Exception):
    """A problem with the user's input, stated in one sentence (what and where)."""


class DataError(HybridFLError):
    """A dataset or data file is missing, malformed or inconsistent."""


class PartitionError(HybridFLError):
    """A partition does not fit its dataset (unknown block, unknown or duplicate sample IDs, ...)."""


class ConfigError(HybridFLError):
    """A configuration file is missing, unreadable or invalid."""
