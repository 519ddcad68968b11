"""HyFDCA server: checks of the clients' replies before any value is used.

Untrusted replies: every reply is checked before any value is used
(:mod:`hybridfl.runtime.validate`): ``client_seconds`` and ``he_seconds`` finite and non-negative;
``ip``, ``dalpha``, ``norms`` and ``gram`` exactly one ciphertext per segment (batch) of that
client, each of its segment's length; a primal ``share`` a finite float array of exactly the
client's feature count ``(d_k,)``; a hello's ``ids`` and ``blocks`` lists of strings without
repeats, the blocks known. In a round a reply that fails is logged as a warning (one line naming
the client and the field) and treated as **missing**, and so are that client's later replies in
the round, exactly as a client that fails at that point (nothing of it is added, its dual changes
are not committed, it counts as failed); during setup a bad reply stops the run
(:class:`~hybridfl.runtime.validate.PayloadError`, a :class:`~hybridfl.errors.ProtocolError`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridfl.algorithms.hyfdca.idlists import unpack_ids
from hybridfl.runtime import validate
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError


class ReplyChecksMixin:
    """Reply checks of :class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer` (uses its ``he``,
    ``feat``, ``client_segs`` and ``seg_n``)."""

    def check_ciphertexts(self, r: Message, key: str, sizes: Sequence[int]) -> list[bytes]:
        """The ciphertext list ``r.payload[key]``: exactly ``len(sizes)`` non-empty ciphertexts,
        the ``j``-th holding ``sizes[j]`` values (its public header).

        Raises:
            PayloadError: another count, an empty item, another length, or a body that does not
                parse (:meth:`hybridfl.privacy.he.HEBackend.check`).
        """
        cts = validate.blobs(r, key, len(sizes))
        for j, (c, n) in enumerate(zip(cts, sizes)):
            if len(c) < 4 or self.he.length(c) != int(n):
                raise PayloadError(r, key, f"holding a ciphertext of another length than item {j}")
            try:
                self.he.check(c)  # parse before use: a garbage body must not reach he.add
            except ValueError as e:
                raise PayloadError(r, key, f"holding item {j}, which does not parse ({e})") from None
        return cts

    def seg_sizes(self, cid: str, segs: Sequence[int] | None = None) -> list[int]:
        """The sample counts of ``cid``'s segments (or of the global segments ``segs``)."""
        return [self.seg_n[g] for g in (self.client_segs[cid] if segs is None else segs)]

    def _check_share(self, r: Message) -> None:
        validate.array(r, "share", (len(self.feat[r.sender]),))
        if self.sa_width == 2:  # step_average: the position share too
            validate.array(r, "position_share", (len(self.feat[r.sender]),))

    def _check_ip(self, r: Message) -> None:
        self.check_ciphertexts(r, "ip", self.seg_sizes(r.sender))

    def _check_dalpha(self, r: Message) -> None:
        self.check_ciphertexts(r, "dalpha", self.seg_sizes(r.sender))


def check_hello(r: Message) -> None:
    """A hello reply: ``ids`` (:func:`~.idlists.pack_ids`'s bytes) and ``blocks`` (a list of
    strings), each without repeats (the blocks' names are checked against the schema by
    :meth:`HyFDCAServer.setup`)."""
    unpack_ids(r, "ids")
    validate.strings(r, "blocks")
