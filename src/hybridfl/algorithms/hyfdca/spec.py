"""HyFDCA's :class:`~hybridfl.algorithms.spec.AlgorithmSpec` (:data:`SPEC`): the one place HyFDCA
is built, consumed unchanged by the simulation and by Flower.

Keys (:mod:`hybridfl.privacy.keys`): the clients share one key pair made by a key dealer that is
not the server (:func:`deal_secrets`; in a deployment one client organisation runs ``hybridfl
he-keys``). Each client builds its backend from ``ClientData.secrets["he_secret"]`` and sends only
the public material in its hello (:func:`hello_payload`); the server checks that every client sent
the same and builds its encrypt/add-only backend from it (:func:`build_server`).

Encryption policy (the client's, never the server's): the run config a client gets in the hello
comes from the server, so a client holding a key pair takes its scheme from the key, not from the
config. It refuses a run asking for ``encryption: none`` or another scheme (no silent downgrade to
plaintext) and a key below the minimum size (:func:`hybridfl.privacy.keysize.check_key_size`; the
test-only ``HYBRIDFL_ALLOW_WEAK_KEYS=1`` in the client's environment allows smaller keys), with
:class:`~hybridfl.errors.EncryptionPolicyError`.

Evaluation: over Flower the server's public output model's test accuracy; in the simulation the
:class:`~hybridfl.algorithms.convex.monitor.Monitor` adds the objective, the reference
suboptimality and the dual certificate (it holds the training data and the shared key, and
decrypts the server's ``enc(alpha)``: privileged, outside the protocol).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.algorithms.convex.intercept import (
    INTERCEPT,
    check_no_intercept_block,
    client_with_intercept,
    intercept_array,
    server_with_intercept,
)
from hybridfl.algorithms.convex.model import linear_parts
from hybridfl.algorithms.convex.monitor import (
    Monitor,
    check_inputs,
    client_positive_set,
    holdout_accuracy,
    make_monitor,
    suboptimality_plots,
    time_columns,
)
from hybridfl.algorithms.hyfdca.client import HyFDCAClient
from hybridfl.algorithms.hyfdca.config import HyFDCAConfig
from hybridfl.algorithms.hyfdca.server import HyFDCAServer
from hybridfl.algorithms.spec import AlgorithmSpec, EvalContext, LabelRule, ReportContext, client_seed, register
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.export import ClientData, ServerData
from hybridfl.data.partition import Partition
from hybridfl.errors import DataError, EncryptionPolicyError
from hybridfl.inference.modeldir import ModelParts
from hybridfl.privacy.he import CKKSBackend, HEBackend, KeyDealer, PlainBackend, server_backend
from hybridfl.privacy.keys import backend_from_secret
from hybridfl.privacy.keysize import check_key_size
from hybridfl.privacy.roster import peer_auth_of
from hybridfl.privacy.secagg import own_threshold

SECRET = "he_secret"
"""The name of the clients' shared key pair in ``ClientData.secrets`` (and in checkpoints)."""


def check(split: DatasetSplit, partition: Partition, cfg: HyFDCAConfig) -> None:
    """Every input check before any training (:func:`~hybridfl.algorithms.convex.monitor.check_inputs`).

    Raises:
        DataError: labels not binary for the loss; PartitionError, UnknownBlockError: see there.
    """
    check_inputs(split, partition, cfg.loss, cfg.positive_classes, "HyFDCA")
    if cfg.fit_intercept:
        check_no_intercept_block(split.train.block_names, "HyFDCA")


def deal_secrets(cfg: HyFDCAConfig) -> dict[str, bytes] | None:
    """A new shared key pair of ``cfg.encryption`` for the clients (``{"he_secret": key pair
    bytes}``, :meth:`KeyDealer.to_bytes`), or ``None`` without encryption. The simulation plays
    the client organisation that makes it; the server never gets it."""
    if cfg.encryption == "none":
        return None
    dealer = KeyDealer(cfg.encryption, cfg.paillier_bits)
    return {SECRET: dealer.to_bytes()}


def dealer_of(secrets: Mapping[str, bytes] | None) -> KeyDealer | None:
    """The key pair held in ``secrets`` (``None`` when there is none: no encryption)."""
    if not secrets or SECRET not in secrets:
        return None
    return KeyDealer.from_bytes(bytes(secrets[SECRET]))


def _backend(cd: ClientData, cfg: HyFDCAConfig) -> tuple[HEBackend, bytes]:
    """A client's backend (with the secret key) and the public material it may send. A client
    holding a key pair uses its scheme whatever the run config (the server's) asks for.

    Raises:
        DataError: the run uses encryption but the client holds no key, or its key is unreadable.
        EncryptionPolicyError: the client holds a key pair and the run asks for no or another
            encryption; the key is below the minimum size.
    """
    secret = cd.secrets.get(SECRET)
    if secret is None:
        if cfg.encryption == "none":
            return PlainBackend(), b""
        raise DataError(
            f"client {cd.client_id!r} holds no HE secret key ({SECRET}), but the run uses {cfg.encryption} encryption."
        )
    scheme, backend, public = backend_from_secret(bytes(secret), f"the HE secret key of client {cd.client_id!r}")
    if scheme != cfg.encryption:
        asked = "no encryption" if cfg.encryption == "none" else f"{cfg.encryption} encryption"
        raise EncryptionPolicyError(
            f"client {cd.client_id!r} holds a {scheme} key pair and refuses a run whose config asks for {asked} "
            f"(the server cannot change a client's encryption)."
        )
    check_key_size(backend, f"client {cd.client_id!r}")
    return backend, public


def hello_payload(cd: ClientData, cfg: HyFDCAConfig) -> dict:
    """What a client adds to its hello: ``he_scheme`` and ``he_public`` (the public material of
    its key pair, ``b""`` without encryption); the secret key never leaves the client.

    Raises:
        DataError: the run uses encryption and the client's key is missing or unreadable.
        EncryptionPolicyError: the client holds a key pair and the run asks for no or another
            encryption; its key is below the minimum size.
    """
    return {"he_scheme": cfg.encryption, "he_public": _backend(cd, cfg)[1]}


def build_client(cd: ClientData, cfg: HyFDCAConfig, seed: int, layout: list | None = None) -> HyFDCAClient:
    """One client from its own data and the shared key pair (seed ``client_seed(seed, index)``);
    with ``fit_intercept`` the data gains the constant ``intercept`` block
    (:func:`~hybridfl.algorithms.convex.intercept.client_with_intercept`).

    Raises:
        PartitionError: the client has no labels.
        DataError: labels not binary for the loss; the run uses encryption and its key is missing
            or unreadable; a block already named ``intercept`` with ``fit_intercept``; an
            unreadable ``roster.json`` or credential key.
        ConfigError: a roster that does not list this client with its own credential key.
        EncryptionPolicyError: it holds a key pair and the run asks for no or another encryption;
            its key is below the minimum size; with a roster, a secure-aggregation threshold below
            its roster's majority (:func:`~hybridfl.privacy.secagg.own_threshold`).
    """
    if cfg.fit_intercept:
        cd = client_with_intercept(cd)
    pos = client_positive_set(cd, cfg.loss, cfg.positive_classes, "HyFDCA")
    he = _backend(cd, cfg)[0]
    if isinstance(he, CKKSBackend):  # SEAL's symmetric encryption: the same ciphertexts, less CPU
        he = he.with_secret_key_encryption()
    auth = peer_auth_of(cd.client_id, cd.path)  # a roster in its directory: signed PSI keys and blobs
    return HyFDCAClient(
        cd.client_id,
        cd.data,
        pos,
        he,
        client_seed(seed, cd.index),
        require_secagg=SECRET in cd.secrets,
        secagg_threshold=own_threshold(cfg.secagg_threshold, cd.client_id, auth),
        peer_auth=auth,
    )


def build_server(sd: ServerData, cfg: HyFDCAConfig, seed: int, hello: Mapping[str, dict] | None = None) -> HyFDCAServer:
    """The server from the public schema and the clients' hello payloads (its backend from their
    public material: it can add ciphertexts, never decrypt). With ``fit_intercept`` the schema
    gains the ``intercept`` block, last (:func:`~hybridfl.algorithms.convex.intercept.server_with_intercept`).

    Raises:
        DataError: a hello whose ``he_public`` is not bytes or ``he_scheme`` not a string; the
            clients sent different public material or another scheme (they must share one key
            pair), or no client sent any; public material that is not a public key of the scheme
            (unreadable, or a CKKS context holding a secret key); a block already named
            ``intercept`` with ``fit_intercept``.
    """
    if cfg.fit_intercept:
        sd = server_with_intercept(sd)
    hello = hello or {}
    for cid, h in hello.items():
        if not isinstance(h.get("he_public", b""), (bytes, bytearray)) or not isinstance(
            h.get("he_scheme", cfg.encryption), str
        ):
            raise DataError(f"client {cid!r} sent a hello whose he_public is not bytes or he_scheme not a string.")
    publics = {bytes(h.get("he_public", b"")) for h in hello.values()}
    schemes = {str(h.get("he_scheme", cfg.encryption)) for h in hello.values()}
    if len(publics) != 1:
        raise DataError(f"the clients hold different HE keys (every client needs the same {SECRET}.key).")
    if schemes != {cfg.encryption}:
        raise DataError(
            f"a client uses {sorted(schemes - {cfg.encryption})[0]} encryption, the server {cfg.encryption}."
        )
    try:
        backend = server_backend(cfg.encryption, publics.pop())
    except Exception as e:  # any malformed public material is one sentence
        reason = str(e) if isinstance(e, ValueError) and "secret key" in str(e) else "it cannot be read"
        raise DataError(f"the clients' {cfg.encryption} public material is not a public key: {reason}") from None
    return HyFDCAServer(sd.block_shapes, cfg, backend, seed)


def monitor(
    split: DatasetSplit,
    partition: Partition,
    cfg: HyFDCAConfig,
    seed: int,
    clients: Mapping[str, Any],
    secrets: Mapping[str, bytes] | None,
) -> Monitor:
    """The simulation's privileged evaluator: the federated problem in the clear, its reference
    optimum and the shared key pair (primal, dual, gaps; see :mod:`hybridfl.algorithms.convex.monitor`)."""
    return make_monitor(split, partition, cfg, "HyFDCA", dealer_of(secrets))


def evaluate(ctx: EvalContext) -> dict[str, float]:
    """After an evaluated round: every :class:`Monitor` metric in the simulation (its
    ``accuracy`` is on the same test set), else the ``accuracy`` of the output model on the
    server's test set (``{}`` without one)."""
    server: HyFDCAServer = ctx.server
    row = dict(ctx.monitor(server)) if ctx.monitor is not None else {}
    if "accuracy" not in row:
        cfg = ctx.config
        row.update(
            holdout_accuracy(
                server.output_w(), ctx.server_data.test, cfg.loss, cfg.positive_classes, "HyFDCA", cfg.fit_intercept
            )
        )
    return row


def report(ctx: ReportContext) -> tuple[dict, list]:
    """HyFDCA's summary keys and final table rows; adds the modelled time columns to
    ``ctx.history`` (in place). Objectives and the reference are ``None`` without a monitor."""
    cfg: HyFDCAConfig = ctx.config
    server: HyFDCAServer = ctx.server
    history = ctx.history
    time_columns(history, None)
    last = history[-1] if history else {}
    ref = ctx.monitor.ref if ctx.monitor is not None else None
    rounds_s = [float(r.get("seconds", 0.0)) for r in history]
    summary = {
        "loss": cfg.loss,
        "lambda": cfg.lam,
        "fit_intercept": cfg.fit_intercept,
        "intercept": float(intercept_array(server.output_w(), server.offsets)[0]),
        "encryption": cfg.encryption,
        "samples": int(server.N),
        "features": int(server.d),
        "participation": cfg.participation,
        "participation_mode": cfg.participation_mode,
        "failure_rate": cfg.failure_rate,
        "sigma": server.sigma,
        "local_steps_per_client": dict(server.local_steps),
        "primal_objective": last.get("primal"),
        "dual_objective": last.get("dual"),
        "duality_gap": last.get("duality_gap"),
        "relative_duality_gap": last.get("relative_duality_gap"),
        "model_gap": last.get("model_gap"),
        "reference_objective": ref.objective if ref else None,
        "reference_solver": ref.solver if ref else None,
        "reference": ref.meta() if ref else None,
        "reference_seconds_this_run": ctx.monitor.ref_seconds if ctx.monitor is not None else 0.0,
        "relative_suboptimality": last.get("relative_suboptimality"),
        "accuracy": last.get("accuracy"),
        "encryption_seconds": float(sum(r.get("encryption_seconds", 0.0) for r in history)),
        "setup": server.setup_stats,
        "round_seconds_mean": float(np.mean(rounds_s)) if rounds_s else 0.0,
        "time_model_total": last.get("time_model", 0.0),
        "time_model_no_encryption_total": last.get("time_model_no_encryption", 0.0),
        "averaged_rounds": server.avg_count,
        "last_iterate_relative_suboptimality": last.get(
            "last_iterate_relative_suboptimality", last.get("relative_suboptimality")
        ),
        "w": server.output_w().tolist() if server.w.size <= 2000 else None,
    }
    rows = [
        ["test accuracy (server model, all blocks)", summary["accuracy"], "percent"],
        ["primal objective P(w)", summary["primal_objective"], "sci"],
        [f"reference objective P* ({summary['reference_solver']})", summary["reference_objective"], "sci"],
        ["relative suboptimality (P(w) - P*) / P*", summary["relative_suboptimality"], "sci"],
        ["duality gap P(w(alpha)) - D(alpha)", summary["duality_gap"], "sci"],
        *(
            [
                [
                    f"last iterate's rel. suboptimality (output: mean of the last {server.avg_count} rounds)",
                    summary["last_iterate_relative_suboptimality"],
                    "sci",
                ]
            ]
            if server.avg_count
            else []
        ),
        [f"encryption seconds ({cfg.encryption}, all rounds)", summary["encryption_seconds"], "plain"],
        ["mean wall seconds per round (clients simulated in sequence)", summary["round_seconds_mean"], "plain"],
    ]
    return summary, rows


def plots(history: list[dict], cfg: HyFDCAConfig, title: str) -> list[Callable[[Path], None]]:
    """The suboptimality plot (``suboptimality.png``) of the run."""
    on = f" on {title.split(' on ', 1)[1]}" if " on " in title else ""
    return suboptimality_plots("HyFDCA", history, f"HyFDCA ({cfg.loss}, lambda={cfg.lam:g}, {cfg.encryption}){on}")


def final_arrays(server: HyFDCAServer) -> dict[str, np.ndarray]:
    """The final model: ``w`` ``(d,)`` float64 (the output model, :meth:`HyFDCAServer.output_w`),
    the weights of every block of the schema in its order (block ``b``'s flattened features at
    ``block_offsets(schema)[b]``), with ``fit_intercept`` the ``intercept`` block last (one weight,
    ``w[-1]``); and ``intercept``, a 1-element float64 array holding that weight (``[0.0]`` without
    ``fit_intercept``). A sample's score is ``x^T w[:-1] + intercept`` with ``fit_intercept``,
    ``x^T w`` without."""
    w = np.asarray(server.output_w())
    return {"w": w, INTERCEPT: intercept_array(w, server.offsets)}


def export_model(server: HyFDCAServer, clients: Mapping[str, Any] | None, cfg: HyFDCAConfig) -> ModelParts:
    """The output model ``w`` (:func:`final_arrays`) cut per block (the ``intercept`` block's
    weight as the intercept), with the loss and the positive classes
    (:func:`~hybridfl.algorithms.convex.model.linear_parts`)."""
    return linear_parts(final_arrays(server)["w"], server.offsets, cfg.loss, cfg.positive_classes)


def privacy_warning(cfg: HyFDCAConfig) -> str | None:
    """The one line a run prints when a privacy setting is off (``None`` when none is): what the
    server reads (docs/privacy.md, HyFDCA); ``alignment: plaintext`` is always mentioned."""
    line = _setting_warning(cfg)
    if cfg.alignment != "plaintext":
        return line
    ids = (
        "HyFDCA runs with alignment: plaintext: every client sends its sample IDs to the server; set "
        "alignment: psi to align them by private set intersection (docs/privacy.md)."
    )
    return ids if line is None else f"{line} Also, {ids[0].lower()}{ids[1:]}"


def _setting_warning(cfg: HyFDCAConfig) -> str | None:
    """The first privacy setting that is off (encryption, secure aggregation, local work), or ``None``."""
    if cfg.encryption == "none":
        if cfg.segment_inner_products == "masked":  # the inner products and Gram matrices are padded
            return (
                "HyFDCA runs without encryption: the server reads every client's dual changes (their signs are "
                "the labels) and squared norms; set encryption: ckks or paillier (docs/privacy.md)."
            )
        gram = ", per-batch Gram matrices" if cfg.dual_mode == "segment" else ""
        return (
            "HyFDCA runs without encryption: the server reads every client's dual changes (their signs are "
            f"the labels), squared norms{gram} and inner products; set encryption: ckks or paillier "
            "(docs/privacy.md)."
        )
    if not cfg.secure_aggregation:
        also = " and position share (step_average), each" if cfg.step_average else ","
        return (
            f"HyFDCA runs without secure aggregation: the server reads each client's primal share{also} a "
            "combination of its raw rows (docs/privacy.md)."
        )
    return None


SPEC = register(
    AlgorithmSpec(
        "hyfdca",
        HyFDCAConfig,
        "HyFDCA: secure primal-dual hybrid FL for convex models (hinge, logistic, squared)",
        build_server=build_server,
        build_client=build_client,
        check=check,
        labels=LabelRule("HyFDCA", "every"),  # each client trains on the rows it holds labels for
        evaluate=evaluate,
        report=report,
        hello_payload=hello_payload,
        deal_secrets=deal_secrets,
        monitor=monitor,
        final_arrays=final_arrays,
        export_model=export_model,
        plots=plots,
        privacy_warning=privacy_warning,
    )
)
"""HyFDCA's recipe (registered as ``hyfdca``)."""
