"""HyFDCA sample alignment: which clients hold each sample, and the segments built from it.

HyFDCA groups the samples by their *holder set* (the clients that hold the sample) into
*segments*: the dual variables, inner products and squared norms are summed per segment (HyFDCA
Alg. 1-2 sum over the holders ``B_i`` of each sample). Two ways to find the holder sets
(``alignment`` in :class:`~hybridfl.algorithms.hyfdca.config.HyFDCAConfig`):

- ``plaintext`` (the paper's setting, HyFDCA Sec. 3 assumes the server knows who holds which
  sample): every client's hello lists its sample IDs; the server groups them. The server learns
  every client's IDs.
- ``psi`` (default; our addition): pairwise private set intersection between the clients, the
  server relaying opaque blobs (:mod:`hybridfl.privacy.psi`). The server never sees an ID.

The ``psi`` protocol, for clients ordered by name (a pair ``a < b``: ``a`` is the PSI client,
``b`` the PSI server), in four exchanges before ``hyfdca.init``:

1. ``hyfdca.hello`` (payload ``alignment: psi``, ``clients``: every client's name, ``run``): each client
   makes a fresh PSI client key, PSI server key and X25519 key (:class:`~hybridfl.privacy.psi.KeyAgreement`;
   a key of its own, not the secure-aggregation key: it exists without secure aggregation and
   serves one purpose) and replies ``psi_dh`` (its X25519 public key), ``psi_request`` (its IDs
   blinded, if it has a higher-named peer; one request serves them all) and ``psi_setup`` (its
   IDs blinded under its server key, if it has a lower-named peer; one setup serves them all).
2. ``hyfdca.psi_serve`` to every client with a lower-named peer: ``request.<a>`` and ``dh.<a>``
   of each lower peer ``a``; it replies ``response.<a>`` (the PSI response) and keeps the pair
   key ``K_ab`` (X25519, :data:`CONTEXT`).
3. ``hyfdca.psi_result`` to every client with a higher-named peer: ``setup.<b>``,
   ``response.<b>`` and ``dh.<b>`` of each higher peer ``b``; it learns which of its samples
   ``b`` holds (positions in its own list) and replies ``tags.<b>``: those IDs' HMAC tags under
   ``K_ab`` (:func:`~hybridfl.privacy.psi.order_tags`; ``b""`` for none).
4. ``hyfdca.psi_tags`` to every client: ``tags.<a>`` of each lower peer ``a``; it maps them to
   its rows (:func:`~hybridfl.privacy.psi.match_tags`), so it now knows, for each of its
   samples, every other holder. It replies ``sets`` (``(S_k, K)`` uint8: each holder set it
   has, as a 0/1 row over ``clients``) and ``counts`` (``(S_k,)`` int64: its samples per set).

The server checks every blob (sizes, :func:`~hybridfl.privacy.psi.check_request` and friends)
and every count: each holder of a set must report it with the same count, and for each pair the
counts of the sets holding both must add up to the number of tags the pair exchanged; else it
stops with a :class:`~hybridfl.errors.ProtocolError` naming the clients. It builds the segments
from the sets and counts alone (:func:`segment_order`), and ``hyfdca.init`` tells each client
its segments as holder sets (``segment_sets``), from which the client finds its rows' segment.
Within a segment every holder orders its rows by sample ID (as in ``plaintext``), so the holders
agree on the order without the server.

What each party learns (docs/privacy.md, "HyFDCA alignment"): the server, the number of samples
of each client, the size of every pairwise intersection and of every segment (holder set); a
client, which of its samples each other client holds (and, from the request/setup sizes relayed to
it, nothing more: the PSI hides the IDs outside the intersection). The relay sees the X25519
public keys, blinded points and HMAC tags it cannot invert.

Against an *active* server (one that appends its own blinded guesses to a relayed request, sends
a request or setup of its own, or replaces a public key) the clients need a roster
(:mod:`hybridfl.privacy.roster`, ``roster.json`` in each client directory): the hello carries a
fresh ``run`` label; each client signs its X25519 key, set size and request (``psi_request_sig``)
or setup (``psi_setup_sig``), and each response (``response_sig.<a>``, binding the requester's
name and the request's SHA-256) with its Ed25519 credential; the server relays the signatures
with the blobs and every set size (``n.<peer>``), and a peer refuses a blob whose signature does
not verify. Roster or not, a responder answers each request once (the alignment's order) and only
if it holds exactly the sender's set size of distinct points (:func:`~hybridfl.privacy.psi.check_request_size`),
before any exponentiation.

Both alignments give the same segments in the same order (:func:`segment_order` of the holder
sets, not of arrival order), so a run's results do not depend on the alignment (tested to 1e-12).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from hybridfl.algorithms.hyfdca import kinds
from hybridfl.algorithms.hyfdca.idlists import shared_lists
from hybridfl.errors import ProtocolError
from hybridfl.privacy import psi
from hybridfl.privacy.credentials import SIGNATURE_BYTES
from hybridfl.privacy.roster import RUN_BYTES, PeerAuth, PeerAuthError, digest
from hybridfl.runtime import validate
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.validate import PayloadError

CONTEXT = b"hybridfl/hyfdca/align/v1"
"""Domain separation of the pair keys two clients agree on for the intersection tags."""

PSI_KINDS = (kinds.PSI_SERVE, kinds.PSI_RESULT, kinds.PSI_TAGS)
"""The alignment exchanges between ``hyfdca.hello`` and ``hyfdca.init`` (``alignment: psi``)."""

Holders = tuple[str, ...]
"""A holder set: the names of the clients that hold a sample, sorted."""


# ---------------------------------------------------------------------- segments
def segment_order(sets: Iterable[Holders], clients: Sequence[str]) -> list[Holders]:
    """The segments' order: the holder sets (each a sorted tuple of names) sorted by the tuple of
    their members' positions in ``clients`` (the server's client order), so both alignments and
    every arrival order of the replies give the same segment indices.

    Raises:
        KeyError: a set names a client outside ``clients``.
    """
    pos = {c: i for i, c in enumerate(clients)}
    return sorted({tuple(sorted(s)) for s in sets}, key=lambda s: sorted(pos[c] for c in s))


def plaintext_segments(
    holdings: Mapping[str, Sequence[str]], clients: Sequence[str]
) -> list[tuple[Holders, np.ndarray]]:
    """The reference alignment from every client's sample IDs: per segment (in
    :func:`segment_order`) its holder set and its sample IDs ``(n_g,)`` (str, sorted). Used by the
    server with ``alignment: plaintext`` and by the simulation's monitor (privileged) and tests."""
    # each sample's holder set as a bit mask over ``clients`` (ints: no list per sample to build and
    # collect), clients with equal ID lists (shared_lists) adding their bits in one pass over it
    shared, bits, masks = shared_lists({c: holdings[c] for c in clients}), defaultdict(int), {}
    for i, c in enumerate(clients):
        bits[id(shared[c])] |= 1 << i
    get = masks.get
    for ids in {id(v): v for v in shared.values()}.values():  # each distinct list once
        bit = bits[id(ids)]
        for s in map(str, ids):
            masks[s] = get(s, 0) | bit
    by_mask: dict[int, list[str]] = defaultdict(list)
    for s, m in masks.items():
        by_mask[m].append(s)
    members = {tuple(sorted(c for i, c in enumerate(clients) if m >> i & 1)): ids for m, ids in by_mask.items()}
    return [(key, np.array(sorted(members[key]))) for key in segment_order(members, clients)]


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
    """A :class:`PayloadError` naming ``key`` for a PSI blob the wrapper refused."""
    return PayloadError(msg, key, f"that was refused ({str(e).rstrip('.')})")


def _tag_count(msg: Message, key: str, cap: int) -> bytes:
    """The tags ``msg.payload[key]``: bytes, a whole number of at most ``cap`` distinct tags.

    Raises:
        PayloadError: not bytes, not a multiple of :data:`~hybridfl.privacy.psi.TAG_BYTES`, too
            many tags or a repeated one.
    """
    tags = _bytes(msg, key)
    n, rest = divmod(len(tags), psi.TAG_BYTES)
    if rest:
        raise PayloadError(msg, key, f"of {len(tags)} bytes, not a multiple of {psi.TAG_BYTES}")
    if n > cap:
        raise PayloadError(msg, key, f"naming {n} samples, more than the {cap} both hold at most")
    if len({tags[i : i + psi.TAG_BYTES] for i in range(0, len(tags), psi.TAG_BYTES)}) != n:
        raise PayloadError(msg, key, "naming a sample twice")
    return tags


# ---------------------------------------------------------------------- client side
class AlignClientMixin:
    """The client's side of ``alignment: psi`` (mixed into
    :class:`~hybridfl.algorithms.hyfdca.client.HyFDCAClient`; uses its ``client_id`` and ``ids``).

    State (:meth:`_align_state`): ``align_clients`` the run's client names (from the hello),
    ``align_step`` the last alignment exchange answered (1 hello .. 4 tags), the secret keys
    (``align_psi_c``, ``align_psi_s``, ``align_dh``; never sent), the pair keys with the
    lower-named peers (``align_key.<peer>``) and ``align_held`` ``(n_k, K)`` uint8: which clients
    hold each of its rows (learned so far)."""

    def _align_init(self) -> None:
        self.align_clients: list[str] = []
        self.align_step = 0
        self.align_secret: dict[str, bytes] = {}
        self.align_keys: dict[str, bytes] = {}
        self.align_held: np.ndarray | None = None
        self.align_run = b""  # the run label of the hello (signed statements name it)

    def _auth(self) -> PeerAuth | None:
        """Its roster and credential (signs and checks the peers' PSI blobs), or ``None``."""
        return getattr(self, "peer_auth", None)

    def _verify(self, msg: Message, key: str, sender: str, purpose: str, fields: list[bytes]) -> None:
        """With a roster: ``msg.payload[key]`` must be ``sender``'s signature over ``fields``.

        Raises:
            PeerAuthError: it is missing or does not verify (named by the field).
        """
        auth = self._auth()
        if auth is not None:
            try:
                auth.verify(self.align_run, sender, purpose, fields, msg.payload.get(key))
            except PeerAuthError as e:
                raise PeerAuthError(f"{str(e).rstrip('.')} (field {key!r}).") from None

    def _align_peers(self, lower: bool) -> list[str]:
        """The peers named below (``lower``) or above it, in client order."""
        me = self.client_id
        return [c for c in self.align_clients if (c < me if lower else c > me)]

    def _align_expect(self, msg: Message, step: int) -> None:
        """Refuse an alignment message out of order (not right after exchange ``step``).

        Raises:
            ProtocolError: it is.
        """
        if self.align_step != step or self.align_held is None:
            raise ProtocolError(f"HyFDCA client {self.client_id!r} got {msg.kind!r} out of the alignment's order.")

    def align_hello(self, msg: Message) -> dict[str, Any]:
        """Exchange 1 (``alignment: psi``): check ``clients`` (names, no repeat, its own among them),
        make fresh keys, reply ``psi_dh``, and ``psi_request`` / ``psi_setup`` as its peers need.

        Raises:
            PayloadError: ``clients`` missing, not a list of distinct names, or without its own name.
        """
        validate.only_keys(msg, ("alignment", "clients", "run"))
        clients = validate.strings(msg, "clients")
        if self.client_id not in clients:
            raise PayloadError(msg, "clients", "without this client's name")
        auth = self._auth()
        run = _bytes(msg, "run", RUN_BYTES) if auth is not None or "run" in msg.payload else b""
        self.align_clients = clients
        held = np.zeros((self.ids.size, len(clients)), dtype=np.uint8)
        held[:, clients.index(self.client_id)] = 1
        self.align_held = held
        c, s, dh = psi.PSIClient(self.ids), psi.PSIServer(self.ids), psi.KeyAgreement()
        self.align_secret = {"psi_c": c.secret_key(), "psi_s": s.secret_key(), "dh": dh.private_bytes()}
        self.align_keys = {}
        self.align_step, self.align_run = 1, run
        out: dict[str, Any] = {"psi_dh": dh.public()}
        n = int(self.ids.size)
        for key, want, make in (("request", False, c.request), ("setup", True, lambda: s.setup(n))):
            if self._align_peers(lower=want):
                out[f"psi_{key}"] = blob = make()
                if auth is not None:  # its key, size and blob, under its credential (a relay cannot append)
                    out[f"psi_{key}_sig"] = auth.sign(run, f"psi-{key}", psi.offer_fields(n, dh.public(), blob))
                if key == "request":
                    self.align_secret["req"] = digest(blob)  # to check the responses are to this request
        return out

    def align_serve(self, msg: Message) -> dict[str, Any]:
        """Exchange 2: answer each lower peer ``a``'s ``request.<a>`` as PSI server (reply
        ``response.<a>``) and keep the pair key from ``dh.<a>``.

        Raises:
            ProtocolError: out of order.
            PayloadError: a key of a peer it does not know or that is not lower, a missing or
                malformed request or key.
        """
        self._align_expect(msg, 1)
        lower = self._align_peers(lower=True)
        auth = self._auth()  # without a roster a signature is let through unchecked (a peer with one sent it)
        validate.only_keys(msg, [f"{f}.{a}" for a in lower for f in ("request", "dh", "n", "request_sig")])
        server = psi.PSIServer(self.ids, key=self.align_secret["psi_s"])
        dh = psi.KeyAgreement(self.align_secret["dh"])
        out, keys = {}, {}
        for a in lower:
            peer, request = _bytes(msg, f"dh.{a}", psi.DH_BYTES), _bytes(msg, f"request.{a}")
            n = validate.integer(msg, f"n.{a}", low=1, high=psi.MAX_IDS)
            self._verify(msg, f"request_sig.{a}", a, "psi-request", psi.offer_fields(n, peer, request))
            try:
                keys[a] = dh.shared_key(peer, CONTEXT, initiator=False)
            except psi.PSIError as e:
                raise _refuse(msg, f"dh.{a}", e) from None
            try:  # at most the peer's (signed) set size, no repeated point: checked before any work
                psi.check_request_size(request, n)
                out[f"response.{a}"] = server.respond(request, max_ids=n)
            except psi.PSIError as e:
                raise _refuse(msg, f"request.{a}", e) from None
            if auth is not None:
                fields_r = psi.response_fields(a, digest(request), out[f"response.{a}"])
                out[f"response_sig.{a}"] = auth.sign(self.align_run, "psi-response", fields_r)
        self.align_keys = keys
        self.align_step = 2
        return out

    def align_result(self, msg: Message) -> dict[str, Any]:
        """Exchange 3: for each higher peer ``b``, the positions of its samples ``b`` holds (PSI
        client, from ``setup.<b>`` and ``response.<b>``); reply ``tags.<b>``, those IDs' tags
        under the key agreed through ``dh.<b>``.

        Raises:
            ProtocolError: out of order.
            PayloadError: a key of a peer it does not know or that is not higher, a missing or
                malformed setup, response or key.
        """
        self._align_expect(msg, 2 if self._align_peers(lower=True) else 1)
        higher = self._align_peers(lower=False)
        fields = ("setup", "response", "dh", "n", "setup_sig", "response_sig")
        validate.only_keys(msg, [f"{f}.{b}" for b in higher for f in fields])
        client = psi.PSIClient(self.ids, key=self.align_secret["psi_c"])
        dh = psi.KeyAgreement(self.align_secret["dh"])
        held = self.align_held.copy()
        out = {}
        for b in higher:
            peer, setup, response = (_bytes(msg, f"{f}.{b}") for f in ("dh", "setup", "response"))
            n = validate.integer(msg, f"n.{b}", low=1, high=psi.MAX_IDS)
            self._verify(msg, f"setup_sig.{b}", b, "psi-setup", psi.offer_fields(n, peer, setup))
            mine = psi.response_fields(self.client_id, self.align_secret.get("req", b""), response)
            self._verify(msg, f"response_sig.{b}", b, "psi-response", mine)
            try:
                key = dh.shared_key(_bytes(msg, f"dh.{b}", psi.DH_BYTES), CONTEXT, initiator=True)
            except psi.PSIError as e:
                raise _refuse(msg, f"dh.{b}", e) from None
            try:
                rows = client.intersect(setup, response, max_ids=n)
            except psi.PSIError as e:
                raise _refuse(msg, f"{e.part if e.part in ('setup', 'response') else 'response'}.{b}", e) from None
            held[rows, self.align_clients.index(b)] = 1
            out[f"tags.{b}"] = psi.order_tags(key, self.ids[rows].tolist())
        self.align_held = held
        self.align_step = 3
        return out

    def align_tags(self, msg: Message) -> dict[str, Any]:
        """Exchange 4: map each lower peer ``a``'s ``tags.<a>`` to its rows; now it knows every
        holder of each of its samples. Reply ``sets`` ``(S_k, K)`` uint8 (its holder sets as 0/1
        rows over the clients, in first-row order) and ``counts`` ``(S_k,)`` int64.

        Raises:
            ProtocolError: out of order.
            PayloadError: a key of a peer it does not know or that is not lower, tags that are
                not bytes or name a sample twice or one it does not hold.
        """
        higher, lower = self._align_peers(lower=False), self._align_peers(lower=True)
        self._align_expect(msg, 3 if higher else (2 if lower else 1))
        validate.only_keys(msg, [f"tags.{a}" for a in lower])
        held = self.align_held.copy()
        for a in lower:
            tags = _bytes(msg, f"tags.{a}")
            if not tags:
                continue
            try:
                rows = psi.match_tags(self.align_keys[a], self.ids.tolist(), tags)
            except psi.PSIError as e:
                raise _refuse(msg, f"tags.{a}", e) from None
            held[rows, self.align_clients.index(a)] = 1
        sets, first, counts = np.unique(held, axis=0, return_index=True, return_counts=True)
        order = np.argsort(first)
        self.align_held = held
        self.align_secret, self.align_keys = {}, {}
        self.align_step = 4
        return {"sets": sets[order].astype(np.uint8), "counts": counts[order].astype(np.int64)}

    def align_segment(self, msg: Message) -> np.ndarray:
        """``hyfdca.init`` under ``alignment: psi``: the local segment index ``(n_k,)`` of each row
        from ``segment_sets`` ``(S_k, K)`` (its segments' holder sets, in the server's order).

        Raises:
            ProtocolError: no finished alignment before.
            PayloadError: ``segment_sets`` is not a 0/1 matrix holding each of its holder sets
                exactly once.
        """
        if self.align_step != 4 or self.align_held is None:
            raise ProtocolError(f"HyFDCA client {self.client_id!r} got 'hyfdca.init' before its alignment.")
        held = self.align_held
        sets = validate.array(msg, "segment_sets", (None, held.shape[1]), kinds="iu")
        if sets.size and (sets.min() < 0 or sets.max() > 1):
            raise PayloadError(msg, "segment_sets", "holding a value other than 0 and 1")
        index = {bytes(row.astype(np.uint8)): j for j, row in enumerate(sets)}
        mine = {bytes(row) for row in held}
        if len(index) != len(sets) or set(index) != mine:
            raise PayloadError(msg, "segment_sets", "not holding each of this client's holder sets exactly once")
        return np.array([index[bytes(row)] for row in held], dtype=np.int64)

    def _align_state(self) -> dict[str, Any]:
        """The alignment's part of ``get_state`` (codec values; ``{}`` before a ``psi`` hello)."""
        if not self.align_clients:
            return {}
        st: dict[str, Any] = {
            "align_clients": json.dumps(self.align_clients),
            "align_step": int(self.align_step),
            "align_run": self.align_run,
        }
        if self.align_held is not None:
            st["align_held"] = self.align_held.copy()
        for k, v in self.align_secret.items():
            st[f"align_{k}"] = v
        for c, v in self.align_keys.items():
            st[f"align_key.{c}"] = v
        return st

    def _set_align_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`_align_state` (no entry: nothing changes)."""
        if "align_clients" not in state:
            return
        self.align_clients = [str(c) for c in json.loads(str(state["align_clients"]))]
        self.align_step = int(state["align_step"])
        held = state.get("align_held")
        self.align_held = None if held is None else np.asarray(held, dtype=np.uint8).copy()
        self.align_run = bytes(state.get("align_run", b""))
        self.align_secret = {
            k: bytes(state[f"align_{k}"]) for k in ("psi_c", "psi_s", "dh", "req") if f"align_{k}" in state
        }
        self.align_keys = {k.split(".", 1)[1]: bytes(v) for k, v in state.items() if k.startswith("align_key.")}


# ---------------------------------------------------------------------- server side
def check_psi_hello(r: Message, lower: bool, higher: bool) -> int:
    """A hello reply under ``alignment: psi``: no ``ids``; ``n_samples`` >= 1; ``psi_dh`` an X25519
    public key; ``psi_request`` (iff the client has a higher-named peer) and ``psi_setup`` (iff
    it has a lower-named one) well-formed PSI messages of ``n_samples`` points (a request without
    a repeated point); ``psi_request_sig`` / ``psi_setup_sig``, if sent, 64-byte signatures (the
    peers check them against their roster; the server relays them). Returns ``n_samples``.

    Raises:
        PayloadError: any of these fails.
    """
    if "ids" in r.payload:
        raise PayloadError(r, "ids", "not expected under PSI alignment")
    validate.strings(r, "blocks")
    n = validate.integer(r, "n_samples", low=1, high=psi.MAX_IDS)
    _bytes(r, "psi_dh", psi.DH_BYTES)
    for key, want, check in (("psi_request", higher, psi.check_request), ("psi_setup", lower, psi.check_setup)):
        if not want:
            for k in (key, f"{key}_sig"):
                if k in r.payload:
                    raise PayloadError(r, k, "not expected (no peer needs it)")
            continue
        try:
            got = check(_bytes(r, key), max_ids=n)
        except psi.PSIError as e:
            raise _refuse(r, key, e) from None
        if got != n:
            raise PayloadError(r, key, f"holding {got} IDs, not the {n} samples it reported")
        if f"{key}_sig" in r.payload:
            _bytes(r, f"{key}_sig", SIGNATURE_BYTES)
    return n


def _signed(by: Mapping[str, Mapping[str, Any]], c: str, key: str, name: str) -> dict[str, Any]:
    """``{name: by[c][key]}`` if client ``c``'s hello carried ``key`` (a signature), else ``{}``."""
    return {name: by[c][key]} if key in by[c] else {}


def _serve_payload(by: Mapping[str, Mapping[str, Any]], lower: Sequence[str]) -> dict[str, Any]:
    """``hyfdca.psi_serve``'s payload: each lower peer ``a``'s request, key, size and signature."""
    out: dict[str, Any] = {}
    for a in lower:
        out.update({f"request.{a}": by[a]["psi_request"], f"dh.{a}": by[a]["psi_dh"], f"n.{a}": by[a]["n_samples"]})
        out.update(_signed(by, a, "psi_request_sig", f"request_sig.{a}"))
    return out


def _result_payload(
    by: Mapping[str, Mapping[str, Any]], served: Mapping[str, Mapping[str, Any]], a: str, higher: Sequence[str]
) -> dict[str, Any]:
    """``hyfdca.psi_result``'s payload to ``a``: each higher peer ``b``'s setup, response to
    ``a``, key, size and signatures."""
    out: dict[str, Any] = {}
    for b in higher:
        out.update({f"setup.{b}": by[b]["psi_setup"], f"response.{b}": served[b][f"response.{a}"]})
        out.update({f"dh.{b}": by[b]["psi_dh"], f"n.{b}": by[b]["n_samples"]})
        out.update(_signed(by, b, "psi_setup_sig", f"setup_sig.{b}"))
        out.update(_signed(served, b, f"response_sig.{a}", f"response_sig.{b}"))
    return out


def _check_tags_reply(r: Message, order: Sequence[str], n: int) -> None:
    """A ``hyfdca.psi_tags`` reply of a client with ``n`` samples: ``sets`` distinct 0/1 rows over
    ``order`` that all include the client; ``counts`` positive, one per set, adding up to ``n``.

    Raises:
        PayloadError: any of these fails.
    """
    validate.only_keys(r, ("client_seconds", "he_seconds", "sets", "counts"))
    sets = validate.array(r, "sets", (None, len(order)), kinds="iu")
    counts = validate.array(r, "counts", (sets.shape[0],), kinds="iu")
    if sets.shape[0] == 0:
        raise PayloadError(r, "sets", "empty")
    if sets.min() < 0 or sets.max() > 1 or not (sets[:, list(order).index(r.sender)] == 1).all():
        raise PayloadError(r, "sets", "not 0/1 rows that all include the client itself")
    if np.unique(sets, axis=0).shape[0] != sets.shape[0]:
        raise PayloadError(r, "sets", "holding a set twice")
    if counts.min() < 1 or int(counts.sum()) != n:
        raise PayloadError(r, "counts", f"not positive counts adding up to its {n} samples")


class AlignServerMixin:
    """The server's side of ``alignment: psi`` (mixed into
    :class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`; uses its ``client_ids`` and
    ``_setup_exchange``): relays the blobs and builds the segments from the holder sets' counts."""

    def _align_exchange(self, transport: Any, msgs: list[Message], stats: dict, check: Any) -> list[Message]:
        """A setup exchange of ``msgs`` (none with a single client: no pair)."""
        return self._setup_exchange(transport, msgs, stats, check) if msgs else []

    def psi_hello_payload(self) -> dict[str, Any]:
        """The ``hyfdca.hello`` payload under ``alignment: psi``: ``alignment``, ``clients`` and
        ``run`` (a fresh random run label that the clients' signatures name)."""
        return {"alignment": "psi", "clients": list(self.client_ids), "run": os.urandom(RUN_BYTES)}

    def psi_align(self, transport: Any, stats: dict, hello: list[Message]) -> list[tuple[Holders, int]]:
        """Exchanges 2-4 of the module docstring from the checked hello replies; returns each
        segment's holder set and size, in :func:`segment_order`.

        Raises:
            ProtocolError: a client did not answer; holders of a set report different counts; a
                pair's counts disagree with its intersection size.
            PayloadError: a malformed reply (names the client and the field).
        """
        names = sorted(self.client_ids)
        by = {r.sender: r.payload for r in hello}
        n = {c: int(by[c]["n_samples"]) for c in names}

        def lower(c: str) -> list[str]:
            return [a for a in names if a < c]

        def higher(c: str) -> list[str]:
            return [b for b in names if b > c]

        def check_serve(r: Message) -> None:
            signed = [f"response_sig.{a}" for a in lower(r.sender) if "psi_request_sig" in by[a]]
            validate.only_keys(
                r, ["client_seconds", "he_seconds", *(f"response.{a}" for a in lower(r.sender)), *signed]
            )
            for a in lower(r.sender):
                try:
                    psi.check_response(_bytes(r, f"response.{a}"), n[a])
                except psi.PSIError as e:
                    raise _refuse(r, f"response.{a}", e) from None
            for k in signed:
                _bytes(r, k, SIGNATURE_BYTES)

        # 2. serve: each client answers its lower peers' requests
        msgs = [Message(kinds.PSI_SERVE, SERVER, c, 0, _serve_payload(by, lower(c))) for c in names if lower(c)]
        served = {r.sender: r.payload for r in self._align_exchange(transport, msgs, stats, check_serve)}

        def check_result(r: Message) -> None:
            validate.only_keys(r, ["client_seconds", "he_seconds", *(f"tags.{b}" for b in higher(r.sender))])
            for b in higher(r.sender):
                _tag_count(r, f"tags.{b}", min(n[r.sender], n[b]))

        # 3. result: each client intersects with its higher peers and tags the common IDs
        msgs = [
            Message(kinds.PSI_RESULT, SERVER, a, 0, _result_payload(by, served, a, higher(a)))
            for a in names
            if higher(a)
        ]
        results = {r.sender: r.payload for r in self._align_exchange(transport, msgs, stats, check_result)}
        common = {
            (a, b): len(results[a][f"tags.{b}"]) // psi.TAG_BYTES for a in names for b in higher(a)
        }  # pairwise intersection sizes (the server learns them)
        # 4. tags: each client learns its lower peers' intersections and reports its holder sets
        msgs = [
            Message(kinds.PSI_TAGS, SERVER, b, 0, {f"tags.{a}": results[a][f"tags.{b}"] for a in lower(b)})
            for b in names
        ]
        order = list(self.client_ids)
        reported: dict[str, dict[Holders, int]] = {}
        for r in self._setup_exchange(transport, msgs, stats, lambda r: _check_tags_reply(r, order, n[r.sender])):
            sets = np.asarray(r.payload["sets"])
            reported[r.sender] = {
                tuple(sorted(order[i] for i in np.flatnonzero(row))): int(k)
                for row, k in zip(sets, np.asarray(r.payload["counts"]))
            }
        return _segments_from_counts(reported, common, order)


def _segments_from_counts(
    reported: Mapping[str, Mapping[Holders, int]], common: Mapping[tuple[str, str], int], order: Sequence[str]
) -> list[tuple[Holders, int]]:
    """The segments (holder set, size) in :func:`segment_order` from each client's reported
    counts per holder set, after checking that every holder of a set reports it with the same
    count and that each pair's sets add up to its intersection size ``common[(a, b)]``.

    Raises:
        ProtocolError: the first disagreement, naming the clients.
    """
    sizes: dict[Holders, int] = {}
    for c, sets in reported.items():
        for key, k in sets.items():
            for h in key:
                other = reported.get(h, {}).get(key)
                if other != k:
                    got = "no count" if other is None else f"{other} samples"
                    raise ProtocolError(
                        f"HyFDCA alignment: client {c!r} reports {k} samples held by {list(key)}, "
                        f"client {h!r} {got} for that set."
                    )
            sizes[key] = k
    for (a, b), m in common.items():
        both = sum(k for key, k in reported[a].items() if b in key)
        if both != m:
            raise ProtocolError(
                f"HyFDCA alignment: client {a!r} reports {both} samples shared with {b!r}, their PSI found {m}."
            )
    return [(key, sizes[key]) for key in segment_order(sizes, order)]
