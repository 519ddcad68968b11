"""The bridge between our :class:`~hybridfl.runtime.messages.Message` and Flower's Message API.

Every message of an algorithm is encoded with our own codec (:func:`hybridfl.runtime.messages.encode`,
the bytes the in-process simulation counts) and carried as one ``bytes`` value of a Flower
``ConfigRecord`` in a Flower ``Message`` of type ``query.hybridfl``. Flower moves it from the
ServerApp through the SuperLink to the SuperNode of the receiving client and back.

:class:`FlowerTransport` implements our ``Transport`` protocol (``send_and_receive``) on a Flower
``Grid``, so the server classes of the algorithms run unchanged over Flower. It logs two sizes per
message: our counted bytes (``log``, a :class:`CommLog` exactly like the simulation's) and Flower's
serialized object bytes (``wire``: the sum of the deflated Message/RecordDict/ConfigRecord objects
Flower pushes and pulls, without gRPC/HTTP framing and TLS).

Node failures (see ``docs/deploy.md``, "Node failures"): a SuperNode that is killed and started
again with the same ``data-dir`` comes back under a *new* Flower node ID (Flower 1.41 registers a
fresh key pair per SuperNode process) while the SuperLink keeps reporting the old ID online until
its heartbeat expires (up to 2 x 30 s), after which replies to it are Flower ``NODE_UNAVAILABLE``
errors. :class:`FlowerTransport` therefore maps our client IDs to node IDs by asking every node it
has not seen yet which client it holds (the hello, carrying only the run's session and a nonce,
answered with a signature under the client's own key from ``client prepare``/``export-clients``:
:mod:`hybridfl.privacy.credentials`; the run's setup, with the config, the layout of client names,
blocks and label holders, and the seed, goes only to a node that proved its client), remaps a
client to the new node that proves it holds it, and re-sends the messages that node's
predecessor did not answer, with the same per-client sequence number, so the ClientApp (whose
state survives on the node's disk) answers it exactly once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from flwr.app import Message

from hybridfl.errors import HybridFLError
from hybridfl.privacy.credentials import NONCE_BYTES
from hybridfl.runtime.flower.grid import pace, pull_replies
from hybridfl.runtime.flower.wire import (  # noqa: F401 (re-exported: the bridge's public names)
    ACKED,
    HELLO,
    KEY,
    MESSAGE_TYPE,
    MESSAGE_UNAVAILABLE,
    NODE_UNAVAILABLE,
    RECORD,
    SEQ,
    SETUP,
    WireEntry,
    WireLog,
    flower_nbytes,
    pack,
    unpack,
    unpack_meta,
    unpack_seq,
)
from hybridfl.runtime.messages import SERVER, decode, encode
from hybridfl.runtime.messages import Message as HMessage
from hybridfl.runtime.transport import CommLog, Strikes

log = logging.getLogger("hybridfl.flower")


@dataclass
class _Out:
    """One of our messages in flight: where it was pushed and what came back."""

    msg: HMessage
    raw: bytes
    seq: int | None
    node: int = 0
    mid: str = ""  # Flower message ID of its latest push; "" = not delivered, waiting for its client's node
    deadline: float = 0.0
    lost: str = ""  # why it waits (its node went offline, or the SuperLink refused it)
    reply: Message | None = None
    gave_up: bool = False  # its deadline passed: the reply counts as missing
    asked_again: bool = False  # re-sent once after its reply's objects never reached the SuperLink


class FlowerTransport:
    """Our ``Transport`` on a Flower ``Grid``: push one Flower message per our message, pull replies.

    Survives a SuperNode that is killed and started again (with the same ``data-dir``) during the
    run: while it waits for replies it looks for nodes it has not seen (every ``node_check``
    seconds), sends each the hello and, when one turns out to hold a client of the run, maps that
    client to it and re-sends the messages of the exchange the client has not answered yet. Every
    algorithm message carries the client's next sequence number (outside our counted bytes), so
    the ClientApp answers a re-sent message it had already handled with its saved reply instead of
    applying it twice (:func:`hybridfl.runtime.flower.node.serve`).

    Args:
        grid: the ServerApp's ``Grid``.
        nodes: client ID -> Flower node ID (from the hello); or set later with :meth:`attach`.
        poll_interval: seconds between pulls for replies at the start of an exchange (Flower's own
            ``grid.send_and_receive`` sleeps 3 s between pulls; the default here is 0.02 s); a long
            exchange is polled less often: every tenth of the time since its push, up to
            ``max_poll_interval`` seconds.
        max_poll_interval: see ``poll_interval`` (None: ``max(poll_interval, 0.2)``; 0 polls never wait).
        timeout: seconds to wait for the reply to one message (counted again from a re-send).
        sequenced: attach per-client sequence numbers (False for stateless pings).
        node_check: seconds between two looks at the SuperLink's node list while waiting.

    Implements the :class:`~hybridfl.runtime.transport.Transport` contract: a message whose reply
    has not arrived ``timeout`` seconds after its (last) push is given up and recorded in
    :attr:`abandoned`; :meth:`send_and_receive` returns the replies that did arrive, so the
    algorithm's missing-reply policy runs exactly as for a failure in the simulation. The next
    message to that client carries ``acked`` so its ClientApp accepts the gap in the numbers.

    A reply that arrives but is no answer (a Flower error reply, e.g. a ClientApp that failed or
    refused the message; bytes that do not decode; a message under another client's name) counts as
    missing too, logged with the client and the reason (:attr:`strikes`); a client with
    :data:`~hybridfl.runtime.transport.MAX_STRIKES` of them is dropped for the run: no message is
    sent to it any more and its replies count as missing.

    Raises (from :meth:`send_and_receive`):
        KeyError: a message for a client that is not connected.
        HybridFLError: a client came back without the state of the messages it had answered.
    """

    def __init__(
        self,
        grid,
        nodes: Mapping[str, int] | None = None,
        poll_interval: float = 0.02,
        timeout: float = 600.0,
        sequenced: bool = True,
        node_check: float = 1.0,
        max_poll_interval: float | None = None,
    ):
        self.grid = grid
        self.poll_interval = float(poll_interval)
        self._pool: ThreadPoolExecutor | None = None  # pulls ready replies in parallel (flower.grid)
        self.max_poll_interval = (
            max(self.poll_interval, 0.2) if max_poll_interval is None else max(self.poll_interval, max_poll_interval)
        )
        if self.poll_interval <= 0:
            self.max_poll_interval = 0.0
        self.timeout = float(timeout)
        self.sequenced = bool(sequenced)
        self.node_check = float(node_check)
        self.log = CommLog()
        self.wire = WireLog()
        self.hello: dict | None = None
        self.rejoins: list[dict] = []
        self.nodes: dict[str, int] = {}
        self.seq: dict[str, int] = {}
        self.acked: dict[str, int] = {}
        self._seen: set[int] = set()
        self._online: set[int] = set()
        self._probes: dict[str, int] = {}  # Flower message ID of a hello -> its node
        self._nonces: dict[int, bytes] = {}  # node -> the nonce of its hello
        self.credentials: dict[str, str] = {}
        self.refused: dict[int, str] = {}  # node -> why its hello was refused
        self._found: dict[int, HMessage] | None = None
        self._inflight: list[_Out] = []
        # the first look at the node list node_check seconds from now (hello_all looks at once): an
        # exchange that ends sooner costs no request for it
        self._next_check = time.monotonic() + self.node_check
        self.abandoned: list[dict] = []
        self.strikes = Strikes()
        self.eval_log = CommLog()
        self.attach(nodes or {})

    @property
    def client_ids(self) -> list[str]:
        """The clients of the run mapped to a node (:meth:`attach`), in the order given there."""
        return list(self.nodes)

    def attach(self, nodes: Mapping[str, int]) -> None:
        """Client ID -> node ID; every client's sequence starts after its hello (number 0)."""
        self.nodes = {str(c): int(n) for c, n in nodes.items()}
        self.seq = {c: 0 for c in self.nodes}
        self.acked = {c: 0 for c in self.nodes}
        self._seen |= set(self.nodes.values())

    # ------------------------------------------------------------------ hello / node discovery
    def hello_all(
        self, hello: Mapping, expected: Iterable[str], wait: float, credentials: Mapping[str, str]
    ) -> dict[int, HMessage]:
        """Send the hello (``deploy.hello``: the ``session`` of ``hello`` and a fresh 32-byte
        ``nonce`` per node, nothing else) to every connected node and to every node that connects
        later, until nodes holding all ``expected`` clients have answered with a valid proof; then
        send the setup (``deploy.setup``, payload ``hello``) to the proven nodes only
        (:meth:`send_setup`). A node that has not proved a client never receives the config,
        the layout or the seed.

        A node is mapped to the client it names only if its ``proof`` is that client's Ed25519
        signature over the hello's ``session`` and its nonce, checked against ``credentials``
        (:func:`hybridfl.privacy.credentials.verify_hello`); the same check guards a restarted node
        that claims a client later in the run. A node whose reply does not parse, names a client
        without a valid proof, or whose ClientApp fails on the hello is logged and ignored (an
        untrusted node cannot stop the run); a node that never answers (e.g. a killed SuperNode the
        SuperLink still lists for up to a minute) is left behind. The payload is kept: nodes that
        connect during the run get it too.

        Args:
            hello: the run's hello payload; must hold ``session`` (a string naming this run).
            expected: the run's client IDs.
            wait: seconds to wait for them.
            credentials: client ID -> its registered public key (64 hex characters).

        Returns:
            Node ID -> setup reply of every node that answered the hello with a valid proof (its
            payload with the proven ``client_id``).

        Raises:
            TimeoutError: no node proving some expected client answered within ``wait`` seconds
                (the message names the refused nodes and why).
            HybridFLError: a proven node refused the setup or answered it wrongly (:meth:`send_setup`).
        """
        self.hello = dict(hello)
        self.credentials = {str(c): str(k) for c, k in credentials.items()}
        want = {str(c) for c in expected}
        found: dict[int, HMessage] = {}
        self._found = found
        deadline = time.monotonic() + float(wait)
        self._next_check = 0.0
        try:
            while not want <= {str(r.payload.get("client_id")) for r in found.values()}:
                self._discover(min(self.node_check, 0.2))
                pulled = time.monotonic()
                self._pull([])
                if want <= {str(r.payload.get("client_id")) for r in found.values()}:
                    break
                if time.monotonic() > deadline:
                    have = {str(r.payload.get("client_id")) for r in found.values()}
                    why = "; ".join(f"node {n}: {r}" for n, r in list(self.refused.items())[-3:])
                    raise TimeoutError(
                        f"no SuperNode holding client(s) {', '.join(sorted(want - have))} answered within {wait:g} s "
                        f"({len(self._online)} SuperNodes connected, {len(found)} answered"
                        + (f"; refused: {why}" if why else "")
                        + ")."
                    )
                pace(pulled, self.poll_interval)
        finally:
            self._found = None
        return self.send_setup({nid: str(r.payload["client_id"]) for nid, r in found.items()})

    def send_setup(self, nodes: Mapping[int, str]) -> dict[int, HMessage]:
        """Send the run's setup (``deploy.setup``, the payload given to :meth:`hello_all`) to
        ``nodes`` (node ID -> the client it proved) and wait for every reply.

        Returns:
            Node ID -> its setup reply (``client_id`` set to the proven client).

        Raises:
            HybridFLError: a node's ClientApp failed on the setup (e.g. its client's own policy
                refused the config), or its reply does not parse or names another client; the
                setup needs every client (one sentence naming the client).
            TimeoutError: a node did not answer within the transport's ``timeout``.
        """
        if self.hello is None:
            raise RuntimeError("no setup to send: call hello_all first.")
        nodes = dict(nodes)
        fms = [
            Message(
                pack(encode(HMessage(SETUP, SERVER, cid, 0, dict(self.hello)))),
                dst_node_id=nid,
                message_type=MESSAGE_TYPE,
                group_id="0",
            )
            for nid, cid in nodes.items()
        ]
        ids = list(self.grid.push_messages(fms)) if fms else []
        want = {str(mid): nid for mid, nid in zip(ids, nodes) if mid}
        gone = [nid for nid in nodes if nid not in want.values()]
        if gone:
            raise HybridFLError(f"client {nodes[gone[0]]!r} (node {gone[0]}) left before it got the run's setup.")
        out: dict[int, HMessage] = {}
        deadline = time.monotonic() + self.timeout
        while want:
            pulled = time.monotonic()
            for r in self.grid.pull_messages(list(want)):
                nid = want.pop(str(r.metadata.reply_to_message_id), None)
                if nid is not None:
                    out[nid] = _setup_reply(nid, nodes[nid], r)
            if want and time.monotonic() > deadline:
                nid = next(iter(want.values()))
                raise TimeoutError(
                    f"client {nodes[nid]!r} (node {nid}) did not answer the run's setup in {self.timeout:g} s."
                )
            if want:
                pace(pulled, self.poll_interval)
        return out

    def wait_interval(self, elapsed: float) -> float:
        """Seconds to wait before the next pull, ``elapsed`` seconds into an exchange: ``poll_interval``
        at first, then a tenth of ``elapsed``, at most ``max_poll_interval`` (a long wait costs the
        SuperLink fewer requests; the reply is noticed at most about 10 % late)."""
        return min(self.max_poll_interval, max(self.poll_interval, 0.1 * float(elapsed)))

    def _probe(self, nid: int) -> None:
        if self.hello is None:
            raise RuntimeError("no hello to send: call hello_all first.")
        nonce = os.urandom(NONCE_BYTES)  # fresh per node: a recorded proof never verifies again
        self._nonces[nid] = nonce
        raw = encode(HMessage(HELLO, SERVER, f"node-{nid}", 0, {"session": self.hello.get("session"), "nonce": nonce}))
        ids = list(
            self.grid.push_messages([Message(pack(raw), dst_node_id=nid, message_type=MESSAGE_TYPE, group_id="0")])
        )
        if ids and ids[0]:
            self._probes[ids[0]] = nid

    def _discover(self, interval: float) -> None:
        """At most every ``interval`` s: hello to nodes not seen yet; re-send messages whose node
        is listed online again (a node that lost its connection and kept its ID)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + interval
        self._online = {int(n) for n in self.grid.get_node_ids()}
        if self.hello is not None:
            for nid in sorted(self._online - self._seen):
                self._seen.add(nid)
                self._probe(nid)
        back = [
            o for o in self._inflight if o.reply is None and not o.mid and self.nodes[o.msg.receiver] in self._online
        ]
        if back:
            self._push(back, retry=True)

    def _refuse(self, nid: int, why: str) -> None:
        self.refused[nid] = why
        log.warning("hybridfl: node %d refused at the hello: %s", nid, why)

    def _check_hello(self, nid: int, r: Message) -> HMessage | None:
        """The hello reply of node ``nid`` if it parses and proves the client it names, else None
        (the reason logged and kept in :attr:`refused`)."""
        from hybridfl.privacy.credentials import verify_hello

        if r.has_error():
            if r.error.code != NODE_UNAVAILABLE:  # (unavailable: a node that went away before answering)
                self._refuse(nid, f"its ClientApp failed on {HELLO!r}: {str(r.error.reason)[:300]}")
            return None
        try:
            h = decode(unpack(r.content))
        except (ValueError, HybridFLError) as e:
            self._refuse(nid, f"its reply does not parse ({str(e)[:200]})")
            return None
        cid = h.payload.get("client_id")
        if h.kind != HELLO or not isinstance(cid, str) or len(cid) > 128:
            self._refuse(nid, "its reply is not a hello naming a client")
            return None
        key = self.credentials.get(cid)
        if key is None:
            self._refuse(nid, f"it claims client {cid!r}, which is not in this run")
            return None
        nonce = self._nonces.get(nid, b"")
        if not verify_hello(key, str(self.hello.get("session")), nonce, cid, h.payload.get("proof")):
            self._refuse(nid, f"it claims client {cid!r} without a valid proof (signature under that client's key)")
            return None
        return h

    def _on_hello(self, nid: int, r: Message) -> None:
        h = self._check_hello(nid, r)
        if h is None:
            return
        if self._found is not None:
            self._found[nid] = h
            return
        cid = str(h.payload["client_id"])
        old = self.nodes[cid]
        if nid == old:
            return
        state = h.payload.get("seq", -1)
        if isinstance(state, bool) or not isinstance(state, int):
            self._refuse(nid, f"its hello for client {cid!r} carries no integer 'seq'")
            return
        ready = h.payload.get("ready") is True  # it holds this run's setup (its state survived)
        if not ready:
            state = 0
        if not self.acked[cid] <= state <= self.seq[cid]:
            raise HybridFLError(
                f"client {cid!r} came back as node {nid} with its saved state after message #{state}, but the server "
                f"already has its reply to message #{self.acked[cid]}: the node's state directory was lost or replaced, "
                "so the run cannot continue exactly."
            )
        if not ready:  # nothing of this run on the node yet (and nothing answered): the setup first
            self.send_setup({nid: cid})
        self.nodes[cid] = nid
        resend = [o for o in self._inflight if o.msg.receiver == cid and o.reply is None and not o.gave_up]
        self.rejoins.append(
            {
                "client": cid,
                "old_node": old,
                "node": nid,
                "state_seq": state,
                "acked_seq": self.acked[cid],
                "resent": len(resend),
                "time": time.time(),
            }
        )
        log.warning(
            "hybridfl: client %s rejoined as node %d (was node %d; its saved state is after message #%d); "
            "re-sending %d message(s)",
            cid,
            nid,
            old,
            state,
            len(resend),
        )
        self._push(resend, retry=True)

    # ------------------------------------------------------------------ messages
    def _push(self, outs: list[_Out], retry: bool = False) -> None:
        if not outs:
            return
        fms = []
        for o in outs:
            o.node = self.nodes[o.msg.receiver]
            acked = self.acked.get(o.msg.receiver) if o.seq is not None else None
            fm = Message(
                pack(o.raw, o.seq, acked), dst_node_id=o.node, message_type=MESSAGE_TYPE, group_id=str(o.msg.round)
            )
            m = o.msg
            self.wire.entries.append(
                WireEntry(m.round, m.kind, m.sender, m.receiver, len(o.raw), flower_nbytes(fm), retry)
            )
            fms.append(fm)
        ids = list(self.grid.push_messages(fms))
        now = time.monotonic()
        for i, o in enumerate(outs):
            o.mid = str(ids[i]) if i < len(ids) and ids[i] else ""
            o.deadline = now + self.timeout
            o.lost = "" if o.mid else f"the SuperLink refused it for node {o.node}, which left the federation"

    def _pull(self, outs: list[_Out]) -> None:
        by_mid = {o.mid: o for o in outs if o.mid and o.reply is None and not o.gave_up}
        ids = [*by_mid, *self._probes]
        if not ids:
            return
        if self._pool is None and len(ids) > 1:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hybridfl-pull")
        for r in pull_replies(self.grid, ids, self._pool):
            mid = r.metadata.reply_to_message_id
            if mid in self._probes:
                self._on_hello(self._probes.pop(mid), r)
            elif mid in by_mid:
                o = by_mid.pop(mid)
                if r.has_error() and r.error.code == NODE_UNAVAILABLE:
                    o.mid, o.lost = "", f"its node {o.node} went offline (Flower: node unavailable)"
                    log.warning(
                        "hybridfl: client %s: node %d went offline; waiting for a node holding it",
                        o.msg.receiver,
                        o.node,
                    )
                    continue
                if r.has_error() and r.error.code == MESSAGE_UNAVAILABLE and o.seq is not None and not o.asked_again:
                    self._ask_again(o)
                    continue
                o.reply = r
                if o.seq is not None and not r.has_error():
                    self.acked[o.msg.receiver] = max(self.acked[o.msg.receiver], o.seq)

    def _ask_again(self, o: _Out) -> None:
        """``o``'s reply objects never reached the SuperLink (``MESSAGE_UNAVAILABLE``: its node stopped
        mid-upload): the same message once more (a ClientApp answers a repeat with its saved reply; a
        dead node's successor with the rejoin) instead of counting the client as failed."""
        o.asked_again = True
        log.warning("hybridfl: client %s: its reply never finished uploading; asking again", o.msg.receiver)
        self._push([o], retry=True)

    def _give_up(self, o: _Out) -> None:
        """The deadline of ``o`` passed: its reply counts as missing (recorded in :attr:`abandoned`)."""
        o.gave_up = True
        why = f"{o.lost}; no node holding it came back" if o.lost else "no reply"
        self.abandoned.append(
            {
                "round": o.msg.round,
                "kind": o.msg.kind,
                "client": o.msg.receiver,
                "seq": o.seq,
                "why": why,
                "time": time.time(),
            }
        )
        log.warning(
            "hybridfl: client %s: no reply to %r within %g s (%s); going on without it",
            o.msg.receiver,
            o.msg.kind,
            self.timeout,
            why,
        )

    def evaluation_exchange(self, messages: list[HMessage]) -> list[HMessage]:
        """:meth:`send_and_receive` for evaluation messages: logged in :attr:`eval_log`, not in
        :attr:`log`, so the counted bytes equal the simulation's (whose evaluation exchanges use
        a separate transport)."""
        main, self.log = self.log, self.eval_log
        try:
            return self.send_and_receive(messages)
        finally:
            self.eval_log, self.log = self.log, main

    def send_and_receive(self, messages: Iterable[HMessage], check_sender: bool = True) -> list[HMessage]:
        """Deliver ``messages`` (one Flower message each) and return the replies that arrived
        before their deadline, in the same order (a client given up is missing from the list)."""
        msgs = list(messages)
        t0 = time.perf_counter()
        for m in msgs:
            if m.receiver not in self.nodes:
                raise KeyError(f"no connected client named {m.receiver!r} (connected: {', '.join(self.nodes)})")
        if self.sequenced and len({m.receiver for m in msgs}) < len(msgs):
            raise ValueError(
                "one exchange holds two messages for the same client; the sequenced transport sends one per client."
            )
        outs = []
        for m in msgs:
            if m.receiver in self.strikes.dropped:
                continue  # dropped for the run after repeated bad replies: its reply is missing
            raw = encode(m)
            seq = None
            if self.sequenced:
                self.seq[m.receiver] += 1
                seq = self.seq[m.receiver]
            self.log.add(m, len(raw))
            outs.append(_Out(m, raw, seq))
        self._inflight = outs
        try:
            self._push(outs)
            while any(o.reply is None and not o.gave_up for o in outs):
                pulled = time.monotonic()
                self._pull(outs)
                if all(o.reply is not None for o in outs):
                    break
                self._discover(self.node_check)
                now = time.monotonic()
                for o in outs:
                    if o.reply is None and not o.gave_up and now > o.deadline:
                        self._give_up(o)
                if all(o.reply is not None or o.gave_up for o in outs):
                    break
                pace(pulled, self.wait_interval(time.perf_counter() - t0))
        finally:
            self._inflight = []
        result = []
        for o in outs:
            r, m = o.reply, o.msg
            if r is None:  # given up: the algorithm's missing-reply policy decides
                continue
            h, raw, why = _answer(o, r, check_sender)
            if h is None:  # a bad reply: missing, under the same policy
                self.strikes.add(m.receiver, m.round, m.kind, why)
                continue
            self.log.add(h, len(raw))
            self.wire.entries.append(WireEntry(h.round, h.kind, h.sender, h.receiver, len(raw), flower_nbytes(r)))
            result.append(h)
        self.wire.exchanges.append(
            {
                "round": msgs[0].round if msgs else 0,
                "kind": msgs[0].kind if msgs else "",
                "messages": len(msgs),
                "seconds": time.perf_counter() - t0,
            }
        )
        return result


def _setup_reply(nid: int, cid: str, r: Message) -> HMessage:
    """The checked reply of node ``nid`` (proven to hold ``cid``) to the setup.

    Raises:
        HybridFLError: an error reply, bytes that do not parse, or another kind or client.
    """
    if r.has_error():
        raise HybridFLError(f"client {cid!r} (node {nid}) refused the run's setup: {str(r.error.reason)[:500]}")
    try:
        h = decode(unpack(r.content))
    except (ValueError, HybridFLError) as e:
        raise HybridFLError(
            f"client {cid!r} (node {nid}) answered the run's setup with bytes that do not parse ({e})"
        ) from None
    if h.kind != SETUP or h.payload.get("client_id") != cid:
        raise HybridFLError(f"node {nid} answered the setup of client {cid!r} with another kind or client.")
    return h


def _answer(o: _Out, r: Message, check_sender: bool) -> tuple[HMessage | None, bytes, str]:
    """``(our reply, its bytes, "")`` if the Flower reply ``r`` to ``o`` is an answer from its
    client, else ``(None, b"", why)``: an error reply, bytes that do not decode, or a message
    under another client's name or to someone other than the server."""
    m = o.msg
    if r.has_error():
        return (
            None,
            b"",
            f"its ClientApp failed on {m.kind!r} (Flower error {r.error.code}: {str(r.error.reason)[:300]})",
        )
    try:
        raw = unpack(r.content)
        h = decode(raw)
    except (ValueError, HybridFLError) as e:
        return None, b"", f"its reply does not decode ({str(e)[:200]})"
    if check_sender and (h.sender != m.receiver or h.receiver != m.sender):
        return None, b"", f"node {o.node} answered as {h.sender[:64]!r} to {h.receiver[:64]!r}"
    return h, raw, ""
