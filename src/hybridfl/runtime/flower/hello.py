"""The start of a run on a node: the hello (a proof of the client it holds, nothing of the run
stored) and the setup (the run's settings, sent by the server only to a proven node).

The server's hello carries only the run's ``session`` and a fresh ``nonce``; the node answers with
its client's name and an Ed25519 signature over both (:mod:`hybridfl.privacy.credentials`). Only
after that signature verified does the server send the setup (algorithm, config, seed, the layout
of client names, blocks and label holders, session), which the node validates and stores.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from hybridfl.algorithms.spec import deployable
from hybridfl.data.export import ClientData
from hybridfl.runtime.messages import Message, decode, encode

SETUP_KEYS = ("algorithm", "config", "seed", "layout", "session")
"""The payload keys of the setup a node stores (the run's settings)."""


def answer_hello(msg: Message, cd: ClientData, store: MutableMapping[str, bytes]) -> bytes:
    """The hello's answer: the client's name, its proof over the session and the nonce, and whether
    (``ready``) and how far (``seq``) this node holds the session's setup.

    Raises:
        ValueError: the hello's nonce or session is not well formed (nothing changes).
    """
    # the proof that this node is the organisation that prepared the client (its own key, from
    # data-dir): the server maps the client to this node, and sends it the run's setup, only if
    # it verifies. Nothing is stored: a hello changes nothing here
    from hybridfl.privacy.credentials import hello_proof, load_client_key

    p = msg.payload
    proof = hello_proof(load_client_key(cd.path), p.get("session"), p.get("nonce"), cd.client_id)
    ready = "setup" in store and "seq" in store and decode(store["setup"]).payload.get("session") == p["session"]
    return encode(
        msg.reply(client_id=cd.client_id, proof=proof, seq=int(store["seq"]) if ready else 0, ready=bool(ready))
    )


def answer_setup(msg: Message, cd: ClientData, store: MutableMapping[str, bytes], warm: Any) -> bytes:
    """The setup's answer (the client's public structure and its algorithm's hello payload), after
    storing the run's setup in ``store`` (a new session starts afresh; the same one resumes).

    Raises:
        ValueError: no session string; ConfigError/ValidationError: an unknown algorithm or config.
    """
    p = msg.payload
    if not isinstance(p.get("session"), str) or not 0 < len(p["session"]) <= 128:
        raise ValueError("the setup's session is not a string of 1 to 128 characters.")
    spec = deployable(str(p["algorithm"]))
    cfg = spec.config_model.model_validate_json(str(p["config"]))  # fail here, not at the first round
    extra = spec.hello_payload(cd, cfg) if spec.hello_payload else {}
    setup = {k: p[k] for k in SETUP_KEYS if k in p}
    # the same run's setup again (a restarted SuperNode whose state survived on disk): keep the
    # state and tell the server how far it got; otherwise a new run starts here
    resumed = "session" in setup and "setup" in store and "seq" in store and decode(store["setup"]).payload == setup
    if not resumed:
        store["setup"] = encode(Message("setup", cd.client_id, cd.client_id, 0, setup))
        for k in ("state", "request", "reply"):
            store.pop(k, None)
        store["seq"] = b"0"
        if warm is not None:
            warm.forget()
            warm.tasks.reset()  # a new run: no request of an earlier one counts
    return encode(
        msg.reply(
            client_id=cd.client_id,
            n_samples=cd.data.n_samples,
            blocks=cd.data.block_names,
            has_labels=cd.has_labels,
            seq=int(store["seq"]),
            **extra,
        )
    )
