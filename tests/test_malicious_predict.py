"""A malicious server against federated prediction (issue 28: "every X25519 key used for secure
aggregation, masked inner products or PSI is signed with its owner's credential and checked by the
peers"). The server relays every message of a prediction (``hybridfl.inference.federated``); each
test plays one active attack on the relayed keys or PSI blobs, with the organisations' own rosters
(``in_memory_auths``: what ``peer_auth_of`` gives a client directory holding ``roster.json``).

Before this change no key was signed: ``test_a_substituted_key_reads_the_plan_unsigned`` plays the
attack without rosters (the server, holding the key it put in ``b``'s place, opens the plan the
receiver sealed for ``b``: the positions and keyed tags of the receiver's rows); the other tests
failed on the code before (main at 07442ba, checked with this file: 6 of the 9 fail there) and pass now: the organisations
refuse the server's key before anything is sealed under it.
"""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.errors import HybridFLError
from hybridfl.inference import load_model
from hybridfl.inference.federated import PLAN_CONTEXT, build_orgs, run_prediction
from hybridfl.privacy.roster import in_memory_auths
from hybridfl.privacy.secagg import SecAggClient, from_fixed
from hybridfl.runtime.transport import InProcessTransport
from tests.test_predict import _org_tables, raw_table, runs  # noqa: F401  (the module fixture)


def _orgs(runs, signed: bool):  # noqa: F811
    d, _, cfg = runs["hyfdca"]
    model = load_model(d / "model")
    tables = _org_tables(raw_table(cfg.dataset, cfg.seed, "test"))
    auths = in_memory_auths(list(tables), ["a"]) if signed else None
    orgs, _ = build_orgs(model, tables, "a", auths=auths)
    return model, orgs


class KeySwap(InProcessTransport):
    """The server's own X25519 key in the place of ``b``'s in every ``predict.keys`` (and ``b``'s
    signature kept: it has no credential to sign its own key); it keeps what it then reads."""

    def __init__(self, orgs):
        super().__init__(orgs)
        self.mitm = SecAggClient("b", ["scores"], [1], double_masking=False)
        self.read: dict[str, object] = {}
        self.sent_keys: dict[str, object] = {}

    def send_and_receive(self, messages):
        for m in messages:
            if m.kind == "predict.keys" and "pk.b" in m.payload:
                m.payload["pk.b"] = self.mitm.public_bytes()
                self.sent_keys[m.receiver] = m
            if m.kind == "predict.score" and m.receiver == "b":
                self.read["plan"] = m.payload["plan"]
        replies = super().send_and_receive(messages)
        for r in replies:
            if r.kind == "predict.score" and r.sender == "b":
                self.read["masked"] = r.payload.get("masked")
        return replies


def test_a_substituted_key_reads_the_plan_unsigned(runs):  # noqa: F811
    """Without rosters the attack works (what the signatures stop): the server, holding the key it
    put in ``b``'s place, derives the receiver's pair key with ``b`` and opens ``b``'s plan."""
    from hybridfl.inference.federated import _open

    model, orgs = _orgs(runs, signed=False)
    t = KeySwap(orgs)
    with pytest.raises(HybridFLError):  # b cannot open a plan sealed under the server's key: the request stops
        run_prediction(t, list(orgs), "a", model.blocks)
    t.mitm.set_peers({"a": (orgs["a"].secagg.public_bytes(), ["scores"])})
    plan = _open(t.mitm.pair_key("a", PLAN_CONTEXT), t.read["plan"], "the plan")  # the server reads it
    assert b"predict.plan" in plan


def test_a_substituted_key_is_refused_with_rosters(runs):  # noqa: F811
    """With rosters every organisation checks ``b``'s key against ``b``'s credential: the server's
    key does not verify, the organisations refuse ``predict.keys`` in one sentence and stop; no plan
    is made, nothing crosses under the server's key."""
    model, orgs = _orgs(runs, signed=True)
    t = KeySwap(orgs)
    with pytest.raises(HybridFLError, match="refuses a prediction key of 'b' whose signature does not verify"):
        run_prediction(t, list(orgs), "a", model.blocks)
    assert orgs["a"].stopped == "'predict.keys'" and "plan" not in t.read
    c = orgs["c"]  # every organisation refuses it alike (in process the first refusal ends the request)
    with pytest.raises(HybridFLError, match="refuses a prediction key of 'b'"):
        InProcessTransport({"c": c}).send_and_receive([t.sent_keys["c"]])
    assert c.stopped == "'predict.keys'"


def test_signed_prediction_equals_unsigned(runs):  # noqa: F811
    """The honest run with rosters gives the same scores as without (the signatures change no number)."""
    model, plain = _orgs(runs, signed=False)
    run_prediction(InProcessTransport(plain), list(plain), "a", model.blocks)
    _, signed = _orgs(runs, signed=True)
    run_prediction(InProcessTransport(signed), list(signed), "a", model.blocks)
    np.testing.assert_array_equal(plain["a"].scored, signed["a"].scored)
    np.testing.assert_allclose(plain["a"].raw, signed["a"].raw, rtol=0, atol=1e-9)


class Rewrite(InProcessTransport):
    """Changes the relayed payload of one message kind (to ``to``, or to everyone) with ``fn(payload)``."""

    def __init__(self, orgs, kind: str, fn, to: str | None = None):
        super().__init__(orgs)
        self.kind, self.fn, self.to = kind, fn, to

    def send_and_receive(self, messages):
        for m in messages:
            if m.kind == self.kind and self.to in (None, m.receiver):
                self.fn(m.payload)
        return super().send_and_receive(messages)


def _inflate_n(p):
    p["n"] = p["n"] + 1000  # a larger row count bounds a larger PSI response


def _server_request(p):
    from hybridfl.privacy.psi import PSIClient

    p["request"] = PSIClient([f"guess{i}" for i in range(50)], workers=1).request()  # the server's own guesses


def _drop_request_sig(p):
    p.pop("request_sig", None)


def _short_run(p):
    p["run"] = p["run"][:8]  # a label the organisations could not bind their signatures to


def _server_response(p):
    from hybridfl.privacy.psi import PSIServer

    p["setup.c"] = PSIServer(["c-guess-0", "c-guess-1"], workers=1).setup()  # the server answers in c's place


@pytest.mark.parametrize(
    "kind,to,fn,match",
    [
        ("predict.hello", None, _short_run, "'run' missing or not 32 bytes"),
        ("predict.keys", "b", _inflate_n, "refuses a prediction key of 'a' whose signature does not verify"),
        ("predict.psi_serve", None, _server_request, "refuses a prediction PSI request of 'a' whose signature"),
        ("predict.psi_serve", None, _drop_request_sig, "refuses an unsigned prediction PSI request of 'a'"),
        ("predict.plan", None, _server_response, "refuses a prediction PSI response of 'c' whose signature"),
    ],
    ids=["short-run-label", "row-count-lie", "server-request", "unsigned-request", "server-response"],
)
def test_relayed_psi_and_counts_are_checked_against_the_roster(runs, kind, to, fn, match):  # noqa: F811
    """The server sends a run label of 8 bytes, inflates the receiver's row count (which bounds every PSI response), sends its own
    PSI request (its guesses) in the receiver's name, drops the receiver's signature, or answers in
    ``c``'s place: each is refused in one sentence by the organisation that receives it, naming the
    signer, and that organisation stops."""
    model, orgs = _orgs(runs, signed=True)
    with pytest.raises(HybridFLError, match=match) as e:
        run_prediction(Rewrite(orgs, kind, fn, to), list(orgs), "a", model.blocks)
    assert "\n" not in str(e.value)
    assert any(o.stopped == repr(kind) for o in orgs.values())


def test_unsigned_peer_key_is_refused_by_an_organisation_with_a_roster(runs):  # noqa: F811
    """An organisation with a roster refuses a peer key without a signature (the server leaves a
    signature out): one sentence naming the peer."""
    model, orgs = _orgs(runs, signed=True)

    def strip(p):
        p.pop("sig.c", None)

    with pytest.raises(HybridFLError, match="refuses an unsigned prediction key of 'c'"):
        run_prediction(Rewrite(orgs, "predict.keys", strip), list(orgs), "a", model.blocks)
    assert orgs["a"].stopped == "'predict.keys'"  # the first to get it refuses and stops


def test_masked_scores_stay_masked_for_the_server(runs):  # noqa: F811
    """With signed keys the server relays only masked partial scores: b's vector, unmasked with any
    key the server holds, is not b's partial scores (they are random words to it)."""
    model, orgs = _orgs(runs, signed=True)
    wire = []
    t = InProcessTransport(orgs, wire.append)
    run_prediction(t, list(orgs), "a", model.blocks)
    from hybridfl.runtime.messages import decode

    masked = [decode(w) for w in wire]
    masked = [m.payload["masked"] for m in masked if m.kind == "predict.score" and "masked" in m.payload]
    assert masked and all(np.abs(from_fixed(v)).max() > 1e6 for v in masked)
