"""PSI against an active server, played against the real client classes (HyFDCA's
:class:`~hybridfl.algorithms.hyfdca.client.HyFDCAClient`, FedBCD's
:class:`~hybridfl.algorithms.fedbcd.party.FedBCDParty`): with a roster
(:mod:`hybridfl.privacy.roster`) a relayed request with the server's own blinded guesses
appended, a request the coordinator made itself, a swapped X25519 key, a request of another run,
a forged response, a second request and a request repeating one point are each refused in one
sentence before any exponentiation; without a roster the guessing attack still works (what
docs/privacy.md says is lost), and a repeated point and a second request are refused anyway."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from hybridfl.algorithms.fedbcd import FedBCDParty
from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.algorithms.hyfdca.align import check_psi_hello
from hybridfl.data import DatasetSplit, HybridDataset
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.errors import ProtocolError
from hybridfl.privacy import psi
from hybridfl.privacy.roster import PeerAuthError, in_memory_auths
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError


def one_sentence(e: BaseException) -> bool:
    s = str(e)
    return s.endswith(".") and "\n" not in s and ". " not in s[:-1]


def _ids(prefix: str, idx) -> list[str]:
    return [f"{prefix}-{i:05d}@bank.example" for i in idx]


def _hyfdca_pair(signed: bool | tuple[str, ...]):
    """Clients ``a`` (PSI requester) and ``b`` (responder) of a real HyFDCA federation, 120
    samples each, 100 in common; with ``signed``, each holds a roster (an in-memory one, as
    ``roster.json`` in its directory would give). Returns the clients, their hello replies and
    the run label."""
    rng = np.random.default_rng(0)
    ids = _ids("customer", range(140))
    blocks = {f"b{j}": rng.normal(size=(140, 2)).astype(np.float32) for j in range(2)}
    y = np.tile([0, 1], 70)
    split = DatasetSplit(
        HybridDataset("t", ids, y, blocks, ["n", "p"]),
        HybridDataset("t", _ids("test", range(4)), y[:4], {k: v[:4] for k, v in blocks.items()}, ["n", "p"]),
    )
    part = Partition([ClientShard("a", ids[:120], ("b0",)), ClientShard("b", ids[20:], ("b1",))])
    cfg = HyFDCAConfig(alignment="psi", positive_classes=[1], secure_aggregation=False, rounds=1, reference=False)
    fed = build_federation("hyfdca", split, part, cfg, seed=0)
    clients = fed.clients
    for c, auth in in_memory_auths(["a", "b"]).items():
        if signed is True or c in (signed or ()):
            clients[c].peer_auth = auth
    run = os.urandom(32)
    hello = {
        c: clients[c].handle(
            Message("hyfdca.hello", SERVER, c, 0, {"alignment": "psi", "clients": ["a", "b"], "run": run})
        )
        for c in ("a", "b")
    }
    for c, r in hello.items():
        check_psi_hello(r, lower=c == "b", higher=c == "a")  # the honest server's checks pass
    return clients, {c: r.payload for c, r in hello.items()}, run


def _serve(h: dict, request: bytes, n: int, sig: bool = True) -> dict:
    p = {"request.a": request, "dh.a": h["a"]["psi_dh"], "n.a": n}
    if sig and "psi_request_sig" in h["a"]:
        p["request_sig.a"] = h["a"]["psi_request_sig"]
    return p


def _guess_attack(clients, h) -> tuple[int, dict]:
    """The server appends its own blinded guesses (b's 100 last IDs and 100 it does not hold) to
    a's relayed request and checks b's answer against b's setup: the guesses it learns b holds."""
    guesses = _ids("customer", range(40, 140)) + _ids("stranger", range(100))
    mine = psi.PSIClient(guesses)
    lib = psi._lib()
    points = [*lib.Request.FromString(h["a"]["psi_request"]).encrypted_elements]
    points += lib.Request.FromString(mine.request()).encrypted_elements  # its guesses after a's points
    tampered = lib.Request(reveal_intersection=True, encrypted_elements=points).SerializeToString()
    reply = clients["b"].handle(Message("hyfdca.psi_serve", SERVER, "b", 0, _serve(h, tampered, 120 + 200)))
    tail = lib.Response(
        encrypted_elements=lib.Response.FromString(reply.payload["response.a"]).encrypted_elements[120:]
    )
    found = mine.intersect(h["b"]["psi_setup"], tail.SerializeToString())
    return int(found.size), {"right": int((found < 100).sum())}


def test_without_a_roster_the_server_learns_which_guesses_a_peer_holds():
    """The attack a roster stops (docs/privacy.md, what is lost without one): 100 of 200 guesses
    are b's, the server finds exactly those 100."""
    clients, h, _ = _hyfdca_pair(signed=False)
    n, got = _guess_attack(clients, h)
    assert n == 100 and got["right"] == 100


def test_with_a_roster_appended_guesses_are_refused_before_any_work(monkeypatch):
    clients, h, _ = _hyfdca_pair(signed=True)
    monkeypatch.setattr(psi, "_w_respond", _no_exponentiation)
    with pytest.raises(PeerAuthError) as e:
        _guess_attack(clients, h)
    assert "'a'" in str(e.value) and "request_sig.a" in str(e.value) and one_sentence(e.value)
    assert clients["b"].protocol.stopped  # fail closed: nothing more in this run


def _no_exponentiation(*a, **k):
    raise AssertionError("the responder exponentiated a refused request")


@pytest.mark.parametrize("attack", ["unsigned", "claimed_size", "swapped_key", "other_run", "own_request"])
def test_with_a_roster_every_forged_request_is_refused(attack, monkeypatch):
    clients, h, run = _hyfdca_pair(signed=True)
    monkeypatch.setattr(psi, "_w_respond", _no_exponentiation)
    req = h["a"]["psi_request"]
    p = _serve(h, req, 120)
    if attack == "unsigned":
        del p["request_sig.a"]
    elif attack == "claimed_size":
        p["n.a"] = 121
    elif attack == "swapped_key":  # the server's own X25519 key in place of a's: it would learn the tag key
        p["dh.a"] = psi.KeyAgreement().public()
    elif attack == "other_run":  # a's own signature over this very request, made for another run
        fields = psi.offer_fields(120, p["dh.a"], req)
        assert clients["a"].peer_auth.sign(run, "psi-request", fields) == p["request_sig.a"]  # Ed25519: deterministic
        p["request_sig.a"] = clients["a"].peer_auth.sign(os.urandom(32), "psi-request", fields)
    else:  # the server's own request (it holds the blinding key)
        p["request.a"] = psi.PSIClient(_ids("customer", range(120))).request()
    with pytest.raises((PeerAuthError, PayloadError)) as e:
        clients["b"].handle(Message("hyfdca.psi_serve", SERVER, "b", 0, p))
    assert one_sentence(e.value), str(e.value)
    if attack == "swapped_key":
        assert "psi-request of 'a'" in str(e.value)


def test_with_a_roster_a_forged_response_or_setup_is_refused():
    """The requester checks b's signature on its setup and on the response to its own request."""
    clients, h, _ = _hyfdca_pair(signed=True)
    served = clients["b"].handle(Message("hyfdca.psi_serve", SERVER, "b", 0, _serve(h, h["a"]["psi_request"], 120)))
    honest = {
        "setup.b": h["b"]["psi_setup"],
        "response.b": served.payload["response.a"],
        "dh.b": h["b"]["psi_dh"],
        "n.b": 120,
        "setup_sig.b": h["b"]["psi_setup_sig"],
        "response_sig.b": served.payload["response_sig.a"],
    }
    fake = psi.PSIServer(_ids("customer", range(100)))  # the server's own setup: a's tags would count its guesses
    for key, value in (("setup.b", fake.setup()), ("response.b", fake.respond(h["a"]["psi_request"]))):
        a = _hyfdca_pair(signed=True)[0]["a"]  # a fresh requester (a refusal stops a client for the run)
        a.__dict__.update({k: v for k, v in clients["a"].__dict__.items() if k.startswith("align") or k == "peer_auth"})
        with pytest.raises(PeerAuthError) as e:
            a.handle(Message("hyfdca.psi_result", SERVER, "a", 0, {**honest, key: value}))
        assert one_sentence(e.value) and key.replace(".", "_sig.") in str(e.value)
    reply = clients["a"].handle(Message("hyfdca.psi_result", SERVER, "a", 0, honest))
    assert len(reply.payload["tags.b"]) == 100 * psi.TAG_BYTES  # the honest relay still aligns


def test_a_client_with_a_roster_refuses_a_peer_without_one():
    """Only ``a`` holds a roster: ``b`` lets a's signature through unchecked and answers; ``a``
    refuses b's unsigned setup in one sentence (fails closed) instead of aligning unauthenticated."""
    clients, h, _ = _hyfdca_pair(signed=("a",))
    assert "psi_setup_sig" not in h["b"] and "psi_request_sig" in h["a"]
    served = clients["b"].handle(Message("hyfdca.psi_serve", SERVER, "b", 0, _serve(h, h["a"]["psi_request"], 120)))
    relay = {
        "setup.b": h["b"]["psi_setup"],
        "response.b": served.payload["response.a"],
        "dh.b": h["b"]["psi_dh"],
        "n.b": 120,
    }
    with pytest.raises(PeerAuthError, match="unsigned psi-setup of 'b'") as e:
        clients["a"].handle(Message("hyfdca.psi_result", SERVER, "a", 0, relay))
    assert one_sentence(e.value) and clients["a"].protocol.stopped


def test_a_request_repeating_one_point_is_refused_before_any_work(monkeypatch):
    """Amplification: a hello claiming N samples with one point N times (one exponentiation for
    its sender) is refused by the server's check and by the responder, roster or not, before
    any exponentiation."""
    clients, h, _ = _hyfdca_pair(signed=False)
    monkeypatch.setattr(psi, "_w_respond", _no_exponentiation)
    one = psi._lib().Request.FromString(psi.PSIClient(["x"]).request()).encrypted_elements[0]
    n = 100_000
    flood = psi._lib().Request(reveal_intersection=True, encrypted_elements=[one] * n).SerializeToString()
    with pytest.raises(PayloadError) as e:
        check_psi_hello(
            Message("hyfdca.hello", "a", SERVER, 0, {**h["a"], "psi_request": flood, "n_samples": n}), False, True
        )
    assert "repeats a point" in str(e.value) and one_sentence(e.value)
    with pytest.raises(PayloadError) as e:
        clients["b"].handle(Message("hyfdca.psi_serve", SERVER, "b", 0, _serve(h, flood, n)))
    assert "repeats a point" in str(e.value) and one_sentence(e.value)


def test_hyfdca_answers_psi_serve_once():
    clients, h, _ = _hyfdca_pair(signed=True)
    msg = Message("hyfdca.psi_serve", SERVER, "b", 0, _serve(h, h["a"]["psi_request"], 120))
    clients["b"].handle(msg)
    with pytest.raises(ProtocolError) as e:
        clients["b"].handle(msg)
    assert one_sentence(e.value)


# ---------------------------------------------------------------------- FedBCD
def _parties(signed: bool) -> dict[str, FedBCDParty]:
    """Label party p0 and passive parties p1, p2 (100 IDs each, 80 in common with p0)."""
    order = ["p0", "p1", "p2"]
    auths = in_memory_auths(order, labels=["p0"]) if signed else {}
    out = {}
    for k, c in enumerate(order):
        ids = np.array(_ids("customer", range(20 * k, 20 * k + 100)), dtype=str)
        kw = dict(labels=np.zeros(100), top=torch.nn.Identity(), party_order=order) if k == 0 else {}
        x = np.zeros((100, 2), np.float32)
        out[c] = FedBCDParty(c, ids, x, torch.nn.Linear(2, 1), ["b"], peer_auth=auths.get(c), **kw)
    return out


def _ask(parties, run: bytes) -> dict:
    req = parties["p0"].handle(Message("fedbcd.psi_request", SERVER, "p0", 0, {"run": run})).payload
    return {
        "request": req["request"],
        "dh": req["dh"],
        "n": req["n"],
        "run": run,
        **({"sig": req["sig"]} if "sig" in req else {}),
    }


def test_fedbcd_coordinator_cannot_use_its_own_request(monkeypatch):
    """The coordinator sends passive party p1 a request of its own (guessed IDs, its blinding
    key): without a roster p1 answers and the coordinator learns which guesses p1 holds; with one
    p1 refuses it, and a request signed by another passive party (p2) too, before any work."""
    guesses = _ids("customer", range(0, 200))
    mine = psi.PSIClient(guesses)
    req, dh = mine.request(), psi.KeyAgreement().public()
    open_run = (
        _parties(signed=False)["p1"]
        .handle(Message("fedbcd.psi_serve", SERVER, "p1", 0, {"request": req, "dh": dh, "n": 200}))
        .payload
    )
    found = mine.intersect(open_run["setup"], open_run["response"])
    assert found.tolist() == list(range(20, 120))  # p1's IDs exactly: what a roster prevents
    parties = _parties(signed=True)
    monkeypatch.setattr(psi, "_w_respond", _no_exponentiation)
    run = os.urandom(32)
    p2_sig = parties["p2"].peer_auth.sign(run, "psi-request", psi.offer_fields(200, dh, req))
    for extra in ({}, {"sig": p2_sig}):
        with pytest.raises(PeerAuthError) as e:
            _parties(signed=True)["p1"].handle(
                Message("fedbcd.psi_serve", SERVER, "p1", 0, {"request": req, "dh": dh, "n": 200, "run": run, **extra})
            )
        assert one_sentence(e.value)


def test_fedbcd_passive_party_answers_one_request_per_run():
    for signed in (False, True):
        parties = _parties(signed)
        ask = _ask(parties, os.urandom(32))
        served = parties["p1"].handle(Message("fedbcd.psi_serve", SERVER, "p1", 0, ask))
        rebuilt = _parties(signed)["p1"]  # over Flower: rebuilt from its state for every message
        rebuilt.set_state(parties["p1"].get_state())
        for party in (parties["p1"], rebuilt):
            with pytest.raises(ProtocolError) as e:
                party.handle(Message("fedbcd.psi_serve", SERVER, "p1", 0, ask))
            assert "each setup step comes once" in str(e.value) and one_sentence(e.value)
        assert served.payload["response"]


def test_fedbcd_signed_alignment_end_to_end_and_a_forged_answer_is_refused():
    parties = _parties(signed=True)
    ask = _ask(parties, os.urandom(32))
    relay = {}
    for k in ("p1", "p2"):
        r = parties[k].handle(Message("fedbcd.psi_serve", SERVER, k, 0, ask)).payload
        relay.update({f"{f}.{k}": r[f] for f in ("setup", "response", "dh", "sig")})
    forged = {**relay, "setup.p2": psi.PSIServer(_ids("customer", range(300))).setup()}
    requested = parties["p0"].get_state()
    with pytest.raises(PeerAuthError) as e:
        parties["p0"].handle(Message("fedbcd.psi_result", SERVER, "p0", 0, forged))
    assert "'p2'" in str(e.value) and one_sentence(e.value)
    parties["p0"].set_state(requested)  # the refusal stopped it: the honest relay from its state before
    out = parties["p0"].handle(Message("fedbcd.psi_result", SERVER, "p0", 0, relay)).payload
    assert out["n_aligned"] == 60  # customer 40..99 are held by all three
