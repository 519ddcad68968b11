"""A malicious server against the real client classes (issue 28, "Found" 1 and 2: HyFDCA labels and
rows, secure aggregation undone by the server alone). Each test plays one attack exactly as its
docstring says, on the ``tiny`` federation (80 digits, 2 x 2 grid, four clients, two holders per
sample; HyFEM: ``hyfem_small``-like, four clients), after an honest setup (and round 1).

Checked against the code before this work (commit c8f500a, a temporary worktree, the same test
file): every test here failed there except where noted:

- ``test_label_oracle_answers_are_the_same_for_both_labels``: failed (every query answered on its
  label: all 40 labels from 40 queries); ``test_change_bound_oracle_answers_are_the_same_for_both_labels``
  and ``test_the_one_stop_bit_is_set_by_the_message_alone`` came with the projection (checked at
  023471e, the refusing bounds: the first failed, a fresh ``c = +1`` refused on a negative sample;
  the second passed there too, a NaN was refused before);
- ``test_row_read_out_with_no_peers_is_refused_and_the_client_stops``: failed (``peers=[]``
  answered; the two replies differed by ``0.5 y_k x_k``, row ``k`` exactly);
- ``test_single_peer_set_is_refused_with_threshold_three``: failed (``secagg_threshold`` did not
  exist);
- ``test_round_number_lie_does_not_widen_the_change_bound``: failed (a fresh client took the whole
  +5 jump when the message said round 4);
- ``test_self_unmask_is_refused`` and ``test_an_unmask_request_is_answered_once``: failed (the
  victim answered an unmask naming all its peers dropped, reply minus correction = its words; and
  answered the same request twice);
- ``test_hyfem_client_refuses_no_peers_and_an_untagged_fit``: failed (both answered: the
  extractors unmasked, and in the clear);
- ``test_the_stop_survives_a_rebuild``: failed (no stop to keep).
"""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError
from tests.conftest import HYFDCA_BEFORE

POS = [0, 1, 2, 3, 4]


def _cfg(**kw) -> HyFDCAConfig:
    base = {**HYFDCA_BEFORE, "lam": 0.1, "rounds": 3, "positive_classes": POS, "reference": False, "eval_every": 0}
    return HyFDCAConfig(**{**base, **kw})


def _after_round_1(tiny, **kw):
    """A consensus-mode federation (plaintext duals: the checks are the same under Paillier or
    CKKS) after setup and one honest round; the victim is the first client."""
    split, part = tiny
    cfg = _cfg(dual_mode="consensus", local_fraction=0.2, sigma=30, **kw)
    fed = build_federation("hyfdca", split, part, cfg)
    fed.setup()
    fed.server.run_round(1, fed.transport)
    cid = fed.transport.client_ids[0]
    return fed, cid, fed.clients[cid]


def _enc(fed, cid: str, alpha: np.ndarray) -> list[bytes]:
    """``enc(alpha)`` of ``cid``'s segments from a full ``(n_k,)`` vector (the server holds the
    public key: it can encrypt anything)."""
    client = fed.clients[cid]
    return [fed.server.he.encrypt(alpha[rows]) for rows in client.seg_rows]


def _msg(kind: str, cid: str, rnd: int, payload: dict) -> Message:
    return decode(encode(Message(kind, SERVER, cid, rnd, payload)))


_TAG = [1000]


def _primal(fed, cid: str, rnd: int, alpha: np.ndarray, peers=None, acked: bool = False) -> Message:
    """``hyfdca.primal`` carrying ``alpha`` with a fresh tag, ``peers`` (default: every other
    client, as an honest server) and ``acked``."""
    _TAG[0] += 1
    others = [c for c in fed.transport.client_ids if c != cid] if peers is None else list(peers)
    payload = {"alpha": _enc(fed, cid, alpha), "tag": _TAG[0], "peers": others, "acked": acked}
    return _msg("hyfdca.primal", cid, rnd, payload)


def _label_bits(labels: list[bool], answers: list[object]) -> float:
    """The attacker's information about the labels from the answers, in bits: the empirical mutual
    information between a sample's label and the client's answer to the query about it (0 when
    the answers are the same for both labels; 1 when every answer names its label)."""
    n = len(labels)
    bits = 0.0
    for lab in set(labels):
        for ans in set(answers):
            joint = sum(1 for x, z in zip(labels, answers) if x == lab and z == ans) / n
            if joint:
                p_lab = labels.count(lab) / n
                p_ans = answers.count(ans) / n
                bits += joint * np.log2(joint / (p_lab * p_ans))
    return bits


def _query(client, msg: Message) -> str:
    """The answer the attacker sees: ``accept`` or the refusal's sentence."""
    try:
        reply = client.handle(msg).payload
    except (ProtocolError, PayloadError) as e:
        return str(e)
    assert "masked" in reply and "share" not in reply  # the accepted answer is masked (secure aggregation)
    return "accept"


def test_label_oracle_answers_are_the_same_for_both_labels(tiny):
    """Label oracle (issue 28, Found 1). After an honest round 1, the server sends the victim, for
    each of its samples ``k`` in turn, a returning client's ``hyfdca.primal`` (round 2, 3, ...: one
    new round per query, all peers named, fresh tag) carrying the victim's last ``alpha`` with
    ``alpha_k = 0.5``. Before this work the client accepted it iff ``y_k = +1`` (hinge dual domain
    ``y alpha in [0, 1]``): all 40 labels from 40 queries (commit c8f500a), then, with the
    fail-closed stop, the labels up to the first negative sample (about 2 per run).

    Now the client projects the ``alpha`` onto its own feasible set instead of refusing: every
    query is accepted, for positive and negative samples alike (label bits from accept/refuse: 0),
    and the value it takes is the projection (``0.5`` on a positive sample, ``0`` on a negative
    one), feeding a masked reply."""
    fed, cid, client = _after_round_1(tiny)
    y, base = client.y.copy(), client.alpha.copy()
    labels, answers = [], []
    for q, k in enumerate(range(y.size)):  # sample k asked in round 2 + q
        a = base.copy()
        a[k] = 0.5  # the attacker does not know y_k: it always sends +0.5
        answers.append(_query(client, _primal(fed, cid, 2 + q, a)))
        labels.append(bool(y[k] > 0))
        assert client.alpha[k] == (0.5 if y[k] > 0 else 0.0)  # the projection onto y_k alpha_k in [0, 1]
    assert set(labels) == {True, False}
    assert set(answers) == {"accept"} and client.protocol.stopped == ""
    bits = _label_bits(labels, answers)
    assert bits == 0.0
    print(f"label oracle: {len(answers)} queries, {bits} label bits from accept/refuse, no stop")


def test_change_bound_oracle_answers_are_the_same_for_both_labels(tiny):
    """The change-bound variant: a server that does not know ``alpha`` sends, for sample ``k``, a
    fresh ``Enc(c)`` (``c = +1``) and then a jump ``last_k + 5``, the rest of the victim's last
    ``alpha`` unchanged. Were the bounds refusing, the first would be refused iff ``y_k = -1``
    (the box; and the change bound ``|alpha_k - last_k| <= nu R`` alone, since ``last_k != 0`` has
    the sign of ``y_k``), a label per answer until the stop. Now both are projected (onto the box and the change bound, intersected)
    and accepted for both labels: 0 label bits, no stop; the jump moves ``alpha_k`` by at most
    ``nu R = 1`` (``R``: its own dual steps since its last accepted ``alpha``)."""
    fed, cid, client = _after_round_1(tiny)
    y, last = client.y.copy(), client.alpha.copy()
    moved = np.flatnonzero(last != 0)
    assert {bool(v) for v in y[moved] > 0} == {True, False}  # old rule: label-dependent on these samples
    labels, answers, rnd = [], [], 2
    for k in moved:
        for c in (1.0, last[k] + 5.0):
            a = client.alpha.copy()
            before = a[k]
            a[k] = c
            answers.append(_query(client, _primal(fed, cid, rnd, a)))
            labels.append(bool(y[k] > 0))
            rnd += 1
            assert abs(client.alpha[k] - before) <= 1.0 + 1e-6 and 0.0 <= y[k] * client.alpha[k] <= 1.0
    assert set(answers) == {"accept"} and client.protocol.stopped == ""
    assert _label_bits(labels, answers) == 0.0


def test_the_one_stop_bit_is_set_by_the_message_alone(tiny):
    """What still refuses: a check of the message alone (here a NaN in ``alpha``; likewise shape,
    dtype, ciphertext lengths, order, round numbers). The same malformed query on a positive and on
    a negative sample (each from the same state) is refused with the same sentence: the stop is one
    bit per run, and it says nothing about a label. After it every message is refused alike."""
    fed, cid, client = _after_round_1(tiny)
    state = client.get_state()
    answers, labels = [], []
    for k in (int(np.flatnonzero(client.y > 0)[0]), int(np.flatnonzero(client.y < 0)[0])):
        client.set_state(state)
        a = client.alpha.copy()
        a[k] = np.nan
        answers.append(_query(client, _primal(fed, cid, 2, a)))
        labels.append(bool(client.y[k] > 0))
        after = _query(client, _primal(fed, cid, 3, client.alpha.copy()))
        assert "has stopped taking part in this run after refusing 'hyfdca.primal' of round 2" in after
    assert answers[0] == answers[1] and "alpha" in answers[0] and answers[0] != "accept"
    assert _label_bits(labels, answers) == 0.0


def test_row_read_out_with_no_peers_is_refused_and_the_client_stops(tiny):
    """Row read-out (issue 28, Found 1). Two ``alpha``s the client would accept (its last one, and
    the same with ``alpha_k = 0.5`` on a positive sample ``k``), each in a ``hyfdca.primal`` with
    ``peers=[]`` (masked with nobody) and ``acked=False`` (the same base both times): before this
    work both were answered and the difference of the two replies was ``0.5 y_k x_k``, row ``k``.
    Now the first is refused by the peers rule (an exchange of one client, below the threshold, 3 of 4)
    and the second because the client stopped; neither returns anything and ``alpha`` is kept."""
    fed, cid, client = _after_round_1(tiny)
    k = int(np.flatnonzero(client.y > 0)[0])
    a1 = client.alpha.copy()
    a2 = a1.copy()
    a2[k] = 0.5
    with pytest.raises(PayloadError, match=r"'peers' refused \(.*masks only in an exchange of at least 3 clients"):
        client.handle(_primal(fed, cid, 2, a1, peers=[]))
    with pytest.raises(ProtocolError, match="has stopped taking part in this run after refusing 'hyfdca.primal'"):
        client.handle(_primal(fed, cid, 3, a2, peers=[]))
    assert np.array_equal(client.alpha, a1)


def test_single_peer_set_is_refused_with_threshold_three(tiny):
    """The same read-out with a single-peer set (``peers`` = one other client, an exchange of 2):
    refused under the default threshold (a majority of the four clients: 3) and with
    ``secagg_threshold: 3``; accepted with an explicit ``secagg_threshold: 2`` (an exchange of two
    is honest with 50 % participation of four clients); an honest primal naming all peers is
    answered, masked."""
    for t in (0, 3):
        fed, cid, client = _after_round_1(tiny, secagg_threshold=t)
        other = [c for c in fed.transport.client_ids if c != cid][0]
        with pytest.raises(PayloadError, match="at least 3 clients of its roster, not 2"):
            client.handle(_primal(fed, cid, 2, client.alpha.copy(), peers=[other]))
    fed, cid, client = _after_round_1(tiny, secagg_threshold=2)
    other = [c for c in fed.transport.client_ids if c != cid][0]
    assert client.handle(_primal(fed, cid, 2, client.alpha.copy(), peers=[other])).payload["masked"].size
    fed, cid, client = _after_round_1(tiny, secagg_threshold=3)
    reply = client.handle(_primal(fed, cid, 2, client.alpha.copy())).payload
    assert reply["masked"].dtype == np.uint64 and "share" not in reply


def test_round_number_lie_does_not_widen_the_change_bound(tiny):
    """Round-number lie (issue 28, Found 1). ``nu = 2`` (no dual box, only the change bound
    ``nu R``). After an honest round 1 the server sends a returning ``hyfdca.primal`` whose
    ``alpha`` is the victim's with +5 on one sample, saying round 2 or (a fresh federation) round
    4: either way the client moves that sample by ``nu R = 2`` only (projection onto the change
    bound, not a refusal: the bound's outcome depends on its labels), since ``R`` is its own count
    of dual steps since its last accepted ``alpha`` (1), never ``msg.round`` minus its last round
    (3, which accepted the whole jump before this work)."""
    for rnd in (2, 4):
        fed, cid, client = _after_round_1(tiny, nu=2.0)
        last = client.alpha.copy()
        a = last.copy()
        a[0] += 5.0
        assert _query(client, _primal(fed, cid, rnd, a)) == "accept"
        assert abs(client.alpha[0] - last[0] - 2.0) < 1e-5
        assert np.allclose(client.alpha[1:], last[1:])


def _answered_exchange(tiny):
    """The victim answers an honest returning ``hyfdca.primal`` (round 2, all peers): its masked
    reply, the exchange's tag and peers."""
    fed, cid, client = _after_round_1(tiny)
    msg = _primal(fed, cid, 2, client.alpha.copy())
    reply = client.handle(msg).payload["masked"]
    return fed, cid, client, msg, reply


def test_self_unmask_is_refused(tiny):
    """Self-unmask (issue 28, Found 2). The victim answered a masked ``hyfdca.primal``; the server
    sends ``hyfdca.unmask`` to the victim itself with ``dropped`` = all its peers. Before this work
    it answered, and reply minus correction was its words exactly (checked here with the masks
    computed from its own state). Now it is refused (1 of 4 clients would survive, below the
    threshold, a majority of 4: 3); naming the victim itself as dropped is refused too (fresh run)."""
    fed, cid, client, msg, masked = _answered_exchange(tiny)
    tag, peers = int(msg.payload["tag"]), list(msg.payload["peers"])
    # what the attack would read before double masking: its masks with every peer removed left the
    # unmasked words; now its self-mask (a fresh seed, forgotten once shared) stays on them
    words = masked - client.secagg._mask_sum(tag, peers)
    assert not np.array_equal(words.view(np.int64), client.sa_pending - client.sa_base)  # fixed(share) - base
    with pytest.raises(
        PayloadError, match="unmasks only if at least 3 of the 4 clients of the exchange survive, not 1"
    ):
        client.handle(_msg("hyfdca.unmask", cid, 2, {"tag": tag, "dropped": peers, "survivors": [], "shares": []}))
    fed, cid, client, msg, _ = _answered_exchange(tiny)
    ask = {"tag": int(msg.payload["tag"]), "dropped": [cid], "survivors": [], "shares": []}
    with pytest.raises(PayloadError, match="exactly the other clients of its last exchange"):
        client.handle(_msg("hyfdca.unmask", cid, 2, ask))


def test_an_unmask_request_is_answered_once(tiny):
    """Asking the same unmask twice (issue 28, Found 2): an honest request (one peer dropped, the
    victim and two peers survive, their self-mask shares relayed) is answered; the same request again is refused (a request is answered once), and
    the client then stops."""
    fed, cid, client, msg, _ = _answered_exchange(tiny)
    tag, peers = int(msg.payload["tag"]), list(msg.payload["peers"])
    # two peers answer the same exchange: their self-mask shares to the victim ride in their replies
    shares = []
    for p in peers[:2]:
        theirs = [c for c in fed.transport.client_ids if c != p]
        payload = {"alpha": _enc(fed, p, fed.clients[p].alpha.copy()), "tag": tag, "peers": theirs, "acked": False}
        reply = fed.clients[p].handle(_msg("hyfdca.primal", p, 2, payload)).payload
        shares.append(reply["self_shares"][theirs.index(cid)])
    ask = {"tag": tag, "dropped": peers[2:], "survivors": peers[:2], "shares": shares}
    reply = client.handle(_msg("hyfdca.unmask", cid, 2, ask)).payload
    assert reply["correction"].dtype == np.uint64 and len(reply["revealed"]) == 2 and len(reply["revealed"][0]) == 16
    with pytest.raises(ProtocolError, match="each request is answered once"):
        client.handle(_msg("hyfdca.unmask", cid, 2, ask))
    with pytest.raises(ProtocolError, match="after refusing 'hyfdca.unmask' of round 2"):
        client.handle(_msg("hyfdca.ip", cid, 3, {"w": np.zeros(client.X.shape[1])}))


def test_the_stop_survives_a_rebuild(tiny):
    """Fail closed across a rebuild (Flower builds the client anew for every message from its
    saved state; checkpoints): the state of a stopped client, restored into a fresh client of
    another federation, still refuses an honest message."""
    fed, cid, client = _after_round_1(tiny)
    with pytest.raises(PayloadError):
        client.handle(_primal(fed, cid, 2, client.alpha.copy(), peers=[]))
    state = dict(client.get_state())
    fresh_fed, _, _ = _after_round_1(tiny)
    fresh = fresh_fed.clients[cid]
    fresh.set_state(state)
    with pytest.raises(ProtocolError, match="has stopped taking part"):
        fresh.handle(_msg("hyfdca.ip", cid, 2, {"w": np.zeros(fresh.X.shape[1])}))
    assert client.failed_state() == {"protocol": state["protocol"]}


def test_hyfem_client_refuses_no_peers_and_an_untagged_fit(digits_split):
    """HyFEM (issue 28, Found 2), ``secure_aggregation: true``, after setup (``hyfem.keys``): the
    server's round-1 ``hyfem.fit`` to a client with ``peers=[]`` is refused (peers rule), and the
    same ``hyfem.fit`` without ``tag`` and ``peers`` is refused (the client's own policy: it never
    sends its extractors in the clear). Each refusal stops the client for the run (the honest
    message after it is refused too); from the state before, the honest message is answered with
    ``ext_masked`` only."""
    from hybridfl.algorithms.hyfem import HyFEMConfig
    from hybridfl.data.dataset import DatasetSplit
    from hybridfl.data.partitioners import ClassBlockPartitioner

    split = DatasetSplit(digits_split.train.take(np.arange(120)), digits_split.test.take(np.arange(40)))
    part = ClassBlockPartitioner(
        num_clients=4, classes_per_client=6, blocks_per_client=2, no_full_client=False, seed=0
    ).partition(split.train)
    cfg = HyFEMConfig(rounds=1, local_steps=1, hidden=8, extractor_dim=4, baselines=False, secure_aggregation=True)
    fed = build_federation("hyfem", split, part, cfg)
    fed.setup()
    cid = fed.transport.client_ids[0]
    client = fed.clients[cid]
    honest = fed.server.fit_message(cid, 1, fed.transport.client_ids)
    no_peers = Message(honest.kind, SERVER, cid, 1, {**honest.payload, "peers": []})
    saved = client.get_state()
    with pytest.raises(PayloadError, match="masks only in an exchange of at least 3 clients of its roster, not 1"):
        client.handle(decode(encode(no_peers)))
    with pytest.raises(ProtocolError, match="has stopped taking part in this run after refusing 'hyfem.fit'"):
        client.handle(decode(encode(honest)))  # fail closed: the honest message too
    client.set_state(saved)
    clear = {k: v for k, v in honest.payload.items() if k not in ("tag", "peers")}
    with pytest.raises(PayloadError, match="'tag' missing: client .* never sends its extractors in the clear"):
        client.handle(decode(encode(Message(honest.kind, SERVER, cid, 1, clear))))
    client.set_state(saved)
    reply = client.handle(decode(encode(honest))).payload
    assert "ext_masked" in reply and not any(k.startswith("ext.") for k in reply)


def _negative_curvature_query(tiny, positive: bool) -> str:
    """The crafted-norms attack on a fresh federation, logistic loss, consensus mode: at setup
    the server's ``hyfdca.norms`` says ``q_k = -4 lambda N / sigma'`` for one sample ``k`` (1
    elsewhere), so its SDCA step has curvature ``s = -4``; in round 1 a returning ``hyfdca.primal``
    carries ``alpha_k = 0.5``, then ``hyfdca.ip`` and a ``hyfdca.dual`` with ``u = 0.1``. Returns
    the client's answer to the dual (``accept`` or the refusal)."""
    split, part = tiny
    fed = build_federation("hyfdca", split, part, _cfg(dual_mode="consensus", loss="logistic", local_fraction=1.0))
    cid = fed.transport.client_ids[0]
    client = fed.clients[cid]
    k = int(np.flatnonzero((client.y > 0) == positive)[0])
    honest = client.handle

    def crafted(msg: Message) -> Message:
        if msg.kind == "hyfdca.norms":
            q = np.ones(client.ids.size)
            q[k] = -4.0 * float(client.params["lam"]) * float(client.params["N"]) / float(client.params["sigma"])
            msg = Message(msg.kind, msg.sender, msg.receiver, msg.round, {**msg.payload, "norms": _enc(fed, cid, q)})
        return honest(msg)

    client.handle = crafted
    fed.setup()
    del client.handle
    a = np.zeros(client.ids.size)
    a[k] = 0.5
    assert _query(client, _primal(fed, cid, 1, a)) == "accept"
    client.handle(_msg("hyfdca.ip", cid, 1, {"w": np.zeros(client.X.shape[1])}))
    try:
        client.handle(_msg("hyfdca.dual", cid, 1, {"ip": _enc(fed, cid, np.full(client.ids.size, 0.1))}))
    except Exception as e:  # the attacker sees a refusal, whatever its kind
        return str(e)
    return "accept"


def test_crafted_negative_norms_do_not_make_a_step_fail_on_one_label(tiny):
    """Another label-dependent refusal, found while checking the client's remaining refusals: a
    negative curvature ``s = -4`` at ``y_k alpha_k = 0.5`` zeroes the derivative of the logistic
    step's Newton iteration, which then fails (division by zero) on a positive sample and not on a
    negative one (whose ``alpha_k`` was projected to 0): accept/refuse was the label (checked at
    023471e plus the projection: the positive sample's dual refused, the negative's answered). The
    client now projects the decrypted squared norms (and segment mode's Gram diagonals) onto
    ``>= 0``: both are answered, 0 label bits."""
    answers = [_negative_curvature_query(tiny, positive) for positive in (True, False)]
    assert answers == ["accept", "accept"], answers
    assert _label_bits([True, False], answers) == 0.0
