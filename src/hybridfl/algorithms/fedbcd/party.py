"""FedBCD's client side: :class:`FedBCDParty`, the steps of one party (passive or label party).

See :mod:`hybridfl.algorithms.fedbcd` for the protocol and its messages.

Every coordinator message is checked before use (:mod:`hybridfl.runtime.validate`): the PSI blobs
of the alignment (:mod:`hybridfl.privacy.psi` checks them; a bad one is refused naming the field),
batch positions
are distinct integers in ``[0, n_aligned)``, ``grad`` is a finite float array ``(B, r_k)``, ``curv``
(``local_gradient: taylor``) a finite float array ``(B, r_k)`` >= 0, ``h.<j>`` float arrays
``(B, r_j)`` (``r_j`` the width the label party's top model takes from party ``j``), ``lr`` finite > 0, ``local_steps`` an integer >= 1 (>= 0 for the label party),
``mu`` and ``l2`` finite >= 0, ``optimizer`` (if present) ``sgd`` or ``adam``; a bad message is refused with a
:class:`~hybridfl.runtime.validate.PayloadError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from hybridfl.algorithms.fedbcd.kinds import (
    ALIGN,
    EVALUATE,
    FORWARD,
    LABEL,
    LABEL_PARTY_SETUP,
    PARTY_STEP,
    PROPERTIES,
    PSI_REQUEST,
    PSI_RESULT,
    PSI_SERVE,
    SETUP_KINDS,
    UNDO,
)
from hybridfl.algorithms.fedbcd.protocol import party_protocol
from hybridfl.algorithms.fedbcd.steps import PartyStepsMixin
from hybridfl.errors import ProtocolError
from hybridfl.privacy import psi
from hybridfl.privacy.roster import RUN_BYTES, PeerAuth, digest
from hybridfl.runtime.handlers import Handler, handler
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError, array, integer, only_keys

ALIGN_CONTEXT = b"hybridfl/fedbcd/align/v1"
"""Domain separation of the key a passive party and the label party agree on for the order tags."""


def _bytes(msg: Message, key: str, size: int | None = None) -> bytes:
    """The byte string ``msg.payload[key]`` (of exactly ``size`` bytes if given).

    Raises:
        PayloadError: missing, not bytes, or another size.
    """
    if key not in msg.payload:
        raise PayloadError(msg, key, "missing")
    v = msg.payload[key]
    if not isinstance(v, (bytes, bytearray)):
        raise PayloadError(msg, key, f"of type {type(v).__name__}, not bytes")
    if size is not None and len(v) != size:
        raise PayloadError(msg, key, f"of {len(v)} bytes, expected {size}")
    return bytes(v)


def _refuse(msg: Message, key: str, e: psi.PSIError) -> PayloadError:
    """A :class:`PayloadError` naming ``key`` for a PSI blob the library wrapper refused."""
    return PayloadError(msg, key, f"that was refused ({str(e).rstrip('.')})")


class FedBCDParty(PartyStepsMixin):
    """Party-side steps of FedSGD / FedBCD for one party.

    Args:
        party_id: the party's name (its client ID in the transport).
        ids: ``(N_k,)`` its sample IDs.
        x: ``(N_k, *input_shape)`` float32: its blocks for those samples (one block as is, several
            blocks flattened and concatenated, see :func:`~hybridfl.algorithms.fedbcd.inputs.party_input`).
        bottom: its bottom model, ``(batch, *input_shape) -> (batch, r_k)``.
        blocks: names of its blocks (reported to the coordinator).
        labels: ``(N_k,)`` labels in {0, 1} (label party only).
        top: the top model (label party only): list of ``(batch, r_j)`` in party order -> ``(batch,)`` logits.
        party_order: all party IDs in the order the top model takes them (label party only).
        test_x: ``(n_test, *input_shape)`` float32: its blocks of the test samples (evaluation), or
            ``None`` (the party then cannot take part in an evaluation).
        test_y: ``(n_test,)`` test labels in {0, 1} (label party only).
        device: where the models and the tensors made from the party's data live (a
            :class:`torch.device` or its name; see :mod:`hybridfl.models.device`). Messages always
            carry NumPy arrays on the host.
        in_dims: (label party) the width ``r_j`` of ``H_j`` its top model takes from every party
            (from the public layout, :func:`~hybridfl.algorithms.fedbcd.spec.build_client`); every
            ``h.<j>`` must have exactly that width. ``None``: only ``(B, *)`` is checked.
        peer_auth: its credential and the federation's roster
            (:class:`~hybridfl.privacy.roster.PeerAuth`): the label party signs its PSI request,
            a passive party answers only a request the roster's label party signed (and signs its
            answer); ``None``: nothing signed or checked.

    State (plain arrays, see :meth:`get_state`): model parameters, the aligned positions, the
    current batch, (label party) the last ``H_j`` received for it, and (``optimizer: adam``) the
    Adam moments and step count of its parameters; plus a snapshot of that
    state (without the aligned positions) taken at the party's first message of each round, which
    ``undo`` restores when the coordinator skips the round (:mod:`hybridfl.algorithms.fedbcd`,
    "A missing party").

    Raises:
        ValueError: ``labels`` without ``top`` and ``party_order``.
    """

    def __init__(
        self,
        party_id: str,
        ids: np.ndarray,
        x: np.ndarray,
        bottom: nn.Module,
        blocks: Sequence[str] = (),
        labels: np.ndarray | None = None,
        top: nn.Module | None = None,
        party_order: Sequence[str] | None = None,
        test_x: np.ndarray | None = None,
        test_y: np.ndarray | None = None,
        device: torch.device | str = "cpu",
        in_dims: Mapping[str, int] | None = None,
        peer_auth: PeerAuth | None = None,
    ):
        self.party_id = party_id
        self.peer_auth = peer_auth
        # its own view of the protocol (fail closed); the label party's label messages per round: one per party
        self.protocol = party_protocol(party_id, labels is not None, len(party_order or ()))
        self._psi_served = False  # passive party: it answers one PSI request per run
        self.device = torch.device(device)
        self.ids = np.asarray(ids).astype(str)
        self.x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)
        self.bottom = bottom.to(self.device)
        self.blocks = list(blocks)
        self.is_label = labels is not None
        if self.is_label:
            if top is None or party_order is None:
                raise ValueError(f"label party {party_id!r} needs a top model and the party order")
            self.y = torch.from_numpy(np.asarray(labels, dtype=np.float32)).to(self.device)
            self.top = top.to(self.device)
            self.party_order = list(party_order)
        self.test_x = None if test_x is None else np.ascontiguousarray(test_x, dtype=np.float32)
        self.test_y = None if (test_y is None or not self.is_label) else np.asarray(test_y)
        self.rows: np.ndarray | None = None  # aligned position -> own row
        self.batch: np.ndarray | None = None  # aligned positions of the current batch
        self.others: dict[str, torch.Tensor] = {}  # label party: H_j of the current batch
        self._snap: dict[str, np.ndarray] | None = None  # state at the first message of round _snap_round
        self._snap_round: int | None = None
        self._snap_lost = False  # loaded from a state_dict without the snapshot
        self._align: dict[str, bytes] = {}  # secret keys kept between two setup messages (PSI, X25519, tag key)
        self._adam: torch.optim.Adam | None = None  # optimizer "adam": created at the first Adam step
        with torch.no_grad():
            self.out_dim = int(self.bottom(self.x[:1]).shape[1])
        # label party: party -> the width of H_j its top model takes (None: not known, only (B, *) checked)
        self.in_dims = {str(j): int(w) for j, w in in_dims.items()} if in_dims is not None else None

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        """A float32 tensor on the party's device from a (checked) array of a message."""
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(self.device)

    @staticmethod
    def _numpy(t: torch.Tensor) -> np.ndarray:
        """A tensor as a float32 NumPy array on the host (for a message)."""
        return t.detach().cpu().numpy().astype(np.float32)

    @property
    def n_test(self) -> int:
        """The number of test samples the party holds (0 without a test set)."""
        return 0 if self.test_x is None else int(self.test_x.shape[0])

    # ------------------------------------------------------------------ protocol
    def handle(self, msg: Message) -> Message:
        """Answer one coordinator message (kinds ``fedbcd.properties``, ``.psi_request``,
        ``.psi_serve``, ``.psi_result``, ``.align``, ``.forward``, ``.label``, ``.party_step``,
        ``.undo``, ``.evaluate``; see :mod:`hybridfl.algorithms.fedbcd`).

        The first message of each round ``>= 1`` (evaluation excluded) snapshots the party's state
        for ``undo``; an ``undo`` entry in a payload is applied before anything else.

        The message must be one the protocol puts here (:mod:`.protocol`: setup order, round
        numbers that never go back, each request answered once); any refusal stops the party for
        the run (fail closed: every later message is refused with one sentence naming the first).

        Raises:
            ProtocolError: an unknown kind, a message out of place (the protocol's order, training
                before ``align``, a step without a current batch, an evaluation without a test
                set, an alignment message for the other role), or any message after a refusal.
            PayloadError: a malformed message (the PSI blobs included).
        """
        return self.protocol.answer(msg, lambda: self._answer(msg))

    def _answer(self, msg: Message) -> Message:
        """:meth:`handle` inside the fail-closed rule: the kind, the role, the place in the
        protocol (:mod:`.protocol`), then the step."""
        step = handler(self.handlers(), msg, f"FedBCD party {self.party_id!r}")
        if msg.kind in SETUP_KINDS and msg.kind != PROPERTIES:
            self._check_alignment_step(msg)
        self.protocol.admit(msg)
        if msg.kind == EVALUATE:  # after a round, outside it: no snapshot, no undo
            return step(msg)
        if msg.round >= 1:
            if "undo" in msg.payload:
                self.undo(integer(msg, "undo", low=1, high=msg.round))
            if msg.kind != UNDO and self._snap_round != msg.round:
                self._snap, self._snap_round = self._core_state(), msg.round
        return step(msg)

    def failed_state(self) -> dict[str, np.ndarray]:
        """The state entries to keep after a refused message (only the fail-closed stop; Flower's
        node saves them although the message failed: :func:`hybridfl.runtime.flower.node.client_step`)."""
        return self.protocol.array_state()

    def handlers(self) -> dict[str, Handler]:
        """Message kind -> the step that answers it (:mod:`.kinds`)."""
        return {
            PROPERTIES: self.properties,
            PSI_REQUEST: self.psi_request,
            PSI_SERVE: self.psi_serve,
            PSI_RESULT: self.psi_result,
            ALIGN: self.align,
            FORWARD: self.forward_step,
            PARTY_STEP: self.party_step,
            LABEL: self.label_step,
            UNDO: self.undo_step,
            EVALUATE: self.evaluate,
        }

    def _check_alignment_step(self, msg: Message) -> None:
        """An alignment message comes in the setup (round 0) and to the role that answers it.

        Raises:
            ProtocolError: another round, or a step of the other role.
        """
        if msg.round != 0:
            raise ProtocolError(
                f"FedBCD party {self.party_id!r} got {msg.kind!r} in round {msg.round}, not in the setup."
            )
        if (msg.kind in LABEL_PARTY_SETUP) != self.is_label:
            role = "passive parties" if self.is_label else "the label party"
            raise ProtocolError(f"FedBCD party {self.party_id!r} got {msg.kind!r}, which only {role} answer.")

    def properties(self, msg: Message) -> Message:
        """``fedbcd.properties``: reply ``blocks``, ``out_dim`` ``r_k``, ``has_labels`` and ``n_test``.

        Raises:
            PayloadError: the message carries a payload (it has none).
        """
        only_keys(msg, ())
        return msg.reply(blocks=self.blocks, out_dim=self.out_dim, has_labels=self.is_label, n_test=self.n_test)

    def forward_step(self, msg: Message) -> Message:
        """``fedbcd.forward``: take the checked ``batch`` ``(B,)`` as the current batch; reply its
        ``h`` ``(B, r_k)`` (:meth:`forward`).

        Raises:
            ProtocolError: before ``align``.
            PayloadError: a bad ``batch`` (:meth:`check_batch`).
        """
        batch = self.check_batch(msg, "batch")
        self.batch = batch
        return msg.reply(h=self.forward(self.batch))

    def undo_step(self, msg: Message) -> Message:
        """``fedbcd.undo`` (a round >= 1): :meth:`undo` round ``round`` (at most the message's);
        reply ``undone``.

        Raises:
            ProtocolError: in the setup (round 0), or the party cannot undo (:meth:`undo`).
            PayloadError: ``round`` not an integer in ``[1, msg.round]``.
        """
        if msg.round < 1:
            raise ProtocolError(f"FedBCD party {self.party_id!r} got {msg.kind!r} in the setup, outside the rounds.")
        r = integer(msg, "round", low=1, high=msg.round)
        self.undo(r)
        return msg.reply(undone=r)

    def check_batch(self, msg: Message, key: str) -> np.ndarray:
        """The checked batch positions ``msg.payload[key]``: a ``(B,)`` integer array (B >= 1) of
        distinct aligned positions in ``[0, n_aligned)``, as int64.

        Raises:
            ProtocolError: before ``align``.
            PayloadError: not such an array.
        """
        if self.rows is None:
            raise ProtocolError(f"FedBCD party {self.party_id!r} got a training message before fedbcd.align.")
        b = array(msg, key, (None,), kinds="iu").astype(np.int64)
        if b.size == 0:
            raise PayloadError(msg, key, "empty")
        if b.min() < 0 or b.max() >= len(self.rows):
            raise PayloadError(msg, key, f"holding a position outside [0, {len(self.rows)})")
        if np.unique(b).size != b.size:
            raise PayloadError(msg, key, "holding a repeated position")
        return b

    # ------------------------------------------------------------------ sample alignment (PSI)
    def _others(self) -> list[str]:
        return [j for j in self.party_order if j != self.party_id]

    def psi_request(self, msg: Message) -> Message:
        """Label party, first alignment step: a fresh PSI client key and X25519 key (kept in the
        party's state, never sent); reply ``request`` (its IDs blinded, :class:`~hybridfl.privacy.psi.PSIClient`)
        and ``dh`` (its X25519 public key).

        It also replies ``n`` (its set size) and, with a roster, ``sig``: its signature over them
        for the message's ``run`` (:func:`~hybridfl.privacy.psi.sign_offer`).

        Raises:
            PayloadError: a key other than ``run``, or (with a roster) no 32-byte ``run``.
        """
        only_keys(msg, ("run",))
        run = self._run(msg)
        client = psi.PSIClient(self.ids)
        dh = psi.KeyAgreement()
        request = client.request()
        self._align = {"psi": client.secret_key(), "dh": dh.private_bytes(), "run": run, "req": digest(request)}
        self.rows = None
        signed = psi.sign_offer(self.peer_auth, run, "psi-request", len(self.ids), dh.public(), request)
        return msg.reply(request=request, dh=dh.public(), **signed)

    def _run(self, msg: Message) -> bytes:
        """The run label ``msg.payload["run"]`` (required with a roster; ``b""`` without one)."""
        return _bytes(msg, "run", RUN_BYTES) if self.peer_auth is not None or "run" in msg.payload else b""

    def psi_serve(self, msg: Message) -> Message:
        """Passive party: answer the label party's PSI ``request`` as a PSI server with a fresh key
        (reply ``setup``, ``response``) and agree on the tag key with its X25519 public key ``dh``
        (reply its own ``dh``; the tag key stays in the party's state until :meth:`align`).

        It answers one request per run; the request must hold exactly ``n`` distinct points and,
        with a roster, carry the roster's label party's signature ``sig`` over ``n``, ``dh`` and
        the request for ``run`` (checked before any work); it then signs its answer (``sig``).

        Raises:
            ProtocolError: a second request in the run.
            PeerAuthError: (with a roster) an unsigned request or one not signed by the label party.
            PayloadError: a missing or malformed ``request``, ``dh`` or ``n``, or another key.
        """
        if self._psi_served:
            raise ProtocolError(f"FedBCD party {self.party_id!r} answers one PSI request per run and refuses another.")
        self._psi_served = True  # a refused request uses the run's one answer up too
        only_keys(msg, ("request", "dh", "n", "run", "sig"))
        request = _bytes(msg, "request")
        peer = _bytes(msg, "dh", psi.DH_BYTES)
        n, run = integer(msg, "n", low=1, high=psi.MAX_IDS), self._run(msg)
        label = self.peer_auth.roster.labels if self.peer_auth is not None else ("",)
        if len(label) != 1:
            raise ProtocolError(f"FedBCD party {self.party_id!r}: its roster does not name one label party.")
        psi.verify_offer(self.peer_auth, run, label[0], "psi-request", n, peer, request, msg.payload.get("sig"))
        server = psi.PSIServer(self.ids)
        try:
            psi.check_request_size(request, n)
            response = server.respond(request, max_ids=n)
        except psi.PSIError as e:
            raise _refuse(msg, "request", e) from None
        dh = psi.KeyAgreement()
        try:
            key = dh.shared_key(peer, ALIGN_CONTEXT, initiator=False)
        except psi.PSIError as e:
            raise _refuse(msg, "dh", e) from None
        self._align = {"tag_key": key}
        self.rows = None
        setup = server.setup(n)
        out = {"setup": setup, "response": response, "dh": dh.public()}
        if self.peer_auth is not None:  # its set size, key and setup, and the response to this request
            fields = psi.offer_fields(len(self.ids), dh.public(), setup)
            fields += psi.response_fields(label[0], digest(request), response)
            out["sig"] = self.peer_auth.sign(run, "psi-serve", fields)
        return msg.reply(**out)

    def psi_result(self, msg: Message) -> Message:
        """Label party: from every passive party ``k``'s ``setup.<k>``, ``response.<k>`` and
        ``dh.<k>``, the positions of its IDs each party holds; the aligned order is the
        intersection of them all in its own order. Reply ``n_aligned`` and, for every ``k``,
        ``tags.<k>``: the aligned IDs' order tags under the key agreed with ``k``
        (:func:`~hybridfl.privacy.psi.order_tags`); with no common ID only ``n_aligned`` = 0.

        Raises:
            ProtocolError: no :meth:`psi_request` before.
            PayloadError: a missing, unexpected or malformed blob (names the field).
        """
        if "psi" not in self._align:
            raise ProtocolError(
                f"FedBCD label party {self.party_id!r} got fedbcd.psi_result before fedbcd.psi_request."
            )
        others = self._others()
        only_keys(msg, [f"{f}.{k}" for k in others for f in ("setup", "response", "dh", "sig")])
        client = psi.PSIClient(self.ids, key=self._align["psi"])
        dh = psi.KeyAgreement(self._align["dh"])
        common = np.arange(len(self.ids), dtype=np.int64)
        keys = {}
        for k in others:
            setup, response = _bytes(msg, f"setup.{k}"), _bytes(msg, f"response.{k}")
            if self.peer_auth is not None:  # passive party k's own setup, key and response to this request
                try:
                    fields = psi.offer_fields(psi.check_setup(setup), _bytes(msg, f"dh.{k}"), setup)
                except psi.PSIError as e:
                    raise _refuse(msg, f"setup.{k}", e) from None
                fields += psi.response_fields(self.party_id, self._align.get("req", b""), response)
                self.peer_auth.verify(self._align.get("run", b""), k, "psi-serve", fields, msg.payload.get(f"sig.{k}"))
            try:
                keys[k] = dh.shared_key(_bytes(msg, f"dh.{k}", psi.DH_BYTES), ALIGN_CONTEXT, initiator=True)
            except psi.PSIError as e:
                raise _refuse(msg, f"dh.{k}", e) from None
            try:
                held = client.intersect(setup, response)
            except psi.PSIError as e:
                raise _refuse(msg, f"{e.part if e.part in ('setup', 'response') else 'response'}.{k}", e) from None
            common = np.intersect1d(common, held)  # sorted: the label party's order
        self._align = {}
        if common.size == 0:
            return msg.reply(n_aligned=0)
        self.rows = common.astype(np.int64)
        ids = self.ids[self.rows]
        return msg.reply(n_aligned=int(self.rows.size), **{f"tags.{k}": psi.order_tags(keys[k], ids) for k in others})

    def align(self, msg: Message) -> Message:
        """Passive party: map the label party's order ``tags`` (bytes,
        :func:`~hybridfl.privacy.psi.order_tags` of the aligned IDs under the agreed key) to own
        rows; reply ``n_aligned``.

        Raises:
            ProtocolError: no :meth:`psi_serve` before.
            PayloadError: ``tags`` missing, not bytes, or naming a sample twice or one the party
                does not hold.
        """
        if "tag_key" not in self._align:
            raise ProtocolError(f"FedBCD party {self.party_id!r} got fedbcd.align before fedbcd.psi_serve.")
        only_keys(msg, ("tags",))
        tags = _bytes(msg, "tags")
        try:
            rows = psi.match_tags(self._align["tag_key"], self.ids, tags)
        except psi.PSIError as e:
            raise _refuse(msg, "tags", e) from None
        self._align = {}
        self.rows = rows
        return msg.reply(n_aligned=int(rows.size))

    # ------------------------------------------------------------------ state
    def undo(self, rnd: int) -> None:
        """Discard round ``rnd`` and everything after it (the coordinator skipped it): restore the
        snapshot if it was taken in round ``rnd`` or later. A snapshot of a later round was taken
        after this same ``undo`` had been applied (the coordinator repeats it in every message
        until a reply confirms it), so it holds the state before round ``rnd``; restoring it
        again is harmless. Nothing to do if the party received no message since round ``rnd``
        (its snapshot is older, or it has none because it never received a message of a round).

        Raises:
            ProtocolError: the party was loaded from a :meth:`state_dict` without its snapshot.
        """
        if self._snap is None or self._snap_round is None:
            if self._snap_lost:
                raise ProtocolError(
                    f"FedBCD party {self.party_id!r} cannot undo round {rnd}: it was loaded without the snapshot of its state."
                )
            return
        if self._snap_round >= rnd:
            self._load_core({k: np.array(v, copy=True) for k, v in self._snap.items()})

    def _core_state(self) -> dict[str, np.ndarray]:
        sd = {f"bottom.{k}": v.detach().cpu().numpy().copy() for k, v in self.bottom.state_dict().items()}
        if self.is_label:
            sd.update({f"top.{k}": v.detach().cpu().numpy().copy() for k, v in self.top.state_dict().items()})
            sd.update({f"h.{j}": v.detach().cpu().numpy().copy() for j, v in self.others.items()})
        if self.batch is not None:
            sd["batch"] = self.batch.copy()
        if self._adam is not None:  # optimizer "adam": moments and step count of every parameter
            for i, prm in enumerate(self._adam.param_groups[0]["params"]):
                for k, v in self._adam.state.get(prm, {}).items():
                    # at least 1-d: a message keeps no 0-d array (``step`` is one)
                    sd[f"adam.{i}.{k}"] = np.atleast_1d(torch.as_tensor(v).detach().cpu().numpy()).copy()
        return sd

    def _load_core(self, sd: Mapping[str, np.ndarray]) -> None:
        self.bottom.load_state_dict(
            {k[7:]: torch.from_numpy(np.asarray(v)) for k, v in sd.items() if k.startswith("bottom.")}
        )
        if self.is_label:
            self.top.load_state_dict(
                {k[4:]: torch.from_numpy(np.asarray(v)) for k, v in sd.items() if k.startswith("top.")}
            )
            self.others = {
                k[2:]: torch.from_numpy(np.asarray(v)).to(self.device) for k, v in sd.items() if k.startswith("h.")
            }
        self.batch = np.asarray(sd["batch"]) if "batch" in sd else None
        adam = {k[5:]: v for k, v in sd.items() if k.startswith("adam.")}
        if adam and self._adam is None:
            self._adam = torch.optim.Adam(self._own_params(), lr=1.0, foreach=False)  # lr is set at every step
        if self._adam is not None:  # no adam.* entries: the state before the first Adam step
            self._adam.state.clear()
            for i, prm in enumerate(self._adam.param_groups[0]["params"]):
                st = {k.split(".", 1)[1]: v for k, v in adam.items() if k.split(".", 1)[0] == str(i)}
                if st:
                    self._adam.state[prm] = {
                        k: torch.from_numpy(
                            np.array(v, copy=True).reshape(())
                        )  # a scalar on the CPU, as torch keeps it
                        if k == "step"
                        else torch.from_numpy(np.array(v, copy=True)).to(self.device)
                        for k, v in st.items()
                    }

    def state_dict(self, snapshot: bool = False) -> dict[str, np.ndarray]:
        """The party's state as arrays: parameters (``bottom.*``, ``top.*``), the aligned rows,
        the current batch, (label party) the stored ``H_j`` (``h.*``), the Adam state
        (``adam.<i>.step``, ``.exp_avg``, ``.exp_avg_sq`` of parameter ``i``; ``optimizer: adam``
        only), and during the setup the
        alignment's secret keys (``align.*``, uint8; they never leave the node). With ``snapshot``, also
        the round snapshot that ``undo`` restores (``snap.*``, ``snap_round``; -1: none taken yet).
        :meth:`get_state` is this with the snapshot; without it, for comparing models."""
        sd = self._core_state()
        if self.rows is not None:
            sd["rows"] = self.rows.copy()
        sd.update({f"align.{k}": np.frombuffer(v, dtype=np.uint8).copy() for k, v in self._align.items()})
        if self._psi_served:
            sd["psi_served"] = np.ones(1, dtype=np.uint8)
        if snapshot:
            sd.update({f"snap.{k}": v.copy() for k, v in (self._snap or {}).items()})
            sd["snap_round"] = np.array([-1 if self._snap_round is None else self._snap_round], dtype=np.int64)
        return sd

    def load_state_dict(self, sd: Mapping[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_dict`. A state without ``snap_round`` leaves the party unable to
        ``undo`` a round it had snapshotted (:meth:`undo` then raises)."""
        self._load_core({k: v for k, v in sd.items() if not k.startswith(("snap", "align."))})
        self.rows = np.asarray(sd["rows"]) if "rows" in sd else None
        self._align = {k[6:]: np.asarray(v, dtype=np.uint8).tobytes() for k, v in sd.items() if k.startswith("align.")}
        self._psi_served = "psi_served" in sd
        if "snap_round" in sd:
            r = int(np.asarray(sd["snap_round"]).reshape(-1)[0])
            self._snap = {k[5:]: np.asarray(v) for k, v in sd.items() if k.startswith("snap.")} if r >= 0 else None
            self._snap_round = r if r >= 0 else None
            self._snap_lost = False
        else:
            self._snap, self._snap_round, self._snap_lost = None, None, True

    def get_state(self) -> dict[str, np.ndarray]:
        """Everything the party keeps between two messages (client contract of
        :mod:`hybridfl.algorithms.spec`): :meth:`state_dict` with the round snapshot, so that an
        ``undo`` works on a party rebuilt for every message (Flower) or resumed from a checkpoint,
        and its own protocol state (``protocol``, JSON as uint8: :mod:`.protocol`, the fail-closed
        stop included)."""
        return {**self.state_dict(snapshot=True), **self.failed_state()}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`get_state` returned into a freshly built party.

        Raises:
            ValueError: a ``protocol`` entry that is not the JSON :meth:`get_state` writes.
        """
        self.load_state_dict({k: v for k, v in state.items() if k != "protocol"})
        self.protocol.set_array_state(state)
