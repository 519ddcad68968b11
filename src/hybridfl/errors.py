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


class UnknownBlockError(PartitionError):
    """A client reported (or a partition names) a feature block that is not in the federation's schema."""

    def __init__(self, client_id: str, block: str, where: str = "the schema"):
        super().__init__(f"client {client_id!r} holds unknown block {block!r}, which is not in {where}.")
        self.client_id = client_id
        self.block = block


class ProtocolError(HybridFLError):
    """A message broke an algorithm's protocol: it arrived out of order or contradicts what is known."""


class EncryptionPolicyError(HybridFLError):
    """A client refused a run weaker than its own encryption policy: a run config asking for no or
    another encryption scheme than its key pair's (a downgrade), or a key below the minimum size."""


class PredictionError(HybridFLError):
    """A federated prediction that cannot go on (a missing or malformed reply, bad input)."""


class TrainingDiverged(HybridFLError):
    """Training produced non-finite model values (NaN or infinity); the server refused them before use."""


class MessageError(HybridFLError):
    """Bytes that are not a well-formed hybridfl message (truncated, inconsistent or hostile): one
    sentence naming what is wrong, never the data itself."""
