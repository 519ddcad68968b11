"""HyFDCA ``dual_mode: segment``: the protocol of the exact segment passes, the server's setup and
checks (:class:`SegmentServerMixin`, part of :class:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer`)
and the masked words' helpers. The client's steps: :mod:`.segment_client`; the server's round and
its passes: :mod:`.segment_pass`.

One ``alpha`` per sample, like consensus mode, but the holders of a segment make the **same
exact** SDCA steps, so averaging them changes nothing and no client ever acts on a wrong inner
product. The segment is cut once into fixed mini-batches of ``batch_size`` samples (the same
random split at every holder); at setup the holders' partial Gram matrices ``X_{k,B} X_{k,B}^T``
of each batch (upper triangles, all batches of a segment packed into one encrypted vector) are
added under encryption and returned, so every holder knows the batch's full
Gram ``X_B X_B^T`` (all blocks; a leak the other modes do not have: the holders learn the inner
products between pairs of their own samples in a batch; each holder keeps it in float32: the steps are
then exact to float32's rounding of the within-batch changes, :mod:`.gram`). Each round (``hyfdca.segstart``, then one
``hyfdca.sweep`` per batch) the holders walk the batches in a common random
order; before each batch the server adds their encrypted shares ``x_{k,i}^T (w_k + sigma' dw_k)``
(their block with the segment's changes so far) and every holder decrypts the exact inner
products; inside the batch the Gram matrix supplies the changes
(:func:`~hybridfl.algorithms.convex.losses.gram_steps`). A segment steps only when all its holders
are selected and answer (a failed holder costs the segment its pass; nothing partial is added).

PrimalAggregation (HyFDCA Alg. 4) rides on each client's last ``hyfdca.sweep`` of the pass (the
server marks it ``close``): the holders' steps are the same, so each knows the segment's new
aggregated ``alpha`` itself (the server's sum ``enc(alpha) + sum_h enc((nu/|B|) dalpha_h)``,
added in the server's order: the same floats in plaintext,
:meth:`~hybridfl.algorithms.hyfdca.primal.PrimalClientMixin.close_pass`) and its reply carries its
share of it (masked with secure aggregation as a one-shot exchange: pair masks of their own keys,
no self-mask, never unmasked, so no unmasking exchange follows: :mod:`hybridfl.privacy.secagg`). The server uses
these shares only if every segment of the pass was added; otherwise (a holder's reply missing)
it drops them unread (never unmasked) and sends ``hyfdca.primal`` with ``enc(alpha)`` as before
(one exchange more, the fallback), which replaces the clients' own copies.
``segment_schedule`` says how the active segments share a round:

* ``sequential`` (default): one pass per segment, one segment after another (random order), each
  followed by PrimalAggregation, so the next segment starts from the ``w`` the previous one left.
  A pass over a segment of one holder is one ``hyfdca.segstart`` with ``solo``: the holder's own
  inner products are the whole sum, so it walks every batch itself and replies as a closing sweep.
  The round is then *exactly* one epoch of centralised SDCA over the active segments' samples
  (``sigma' = 1``), whatever the number of segments. Cost: ``1 + ceil(n_s / b)`` exchanges per
  segment (the closing sweep's one-shot shares need no unmasking; 1 for a segment of one holder),
  the segments one after another.
* ``parallel``: all active segments at once, aggregated once: CoCoA+ over segments with an exact
  local solver, ``sigma'`` = number of active segments. ``1 + max ceil(n_s / b)`` exchanges per round,
  but the safe ``sigma'`` slows every segment down (``docs/results.md`` compares the two
  schedules on MNIST binary).

Either way the dual ascends every round (tested) and ``w = w(alpha)``.

``segment_inner_products`` says how the shares cross the server: ``encrypted`` (default, the
paper's SecureInnerProduct under the run's encryption: one ciphertext per holder and batch) or
``masked`` (our option, :mod:`hybridfl.privacy.segmask`): at setup every holder seals a segment key
for the other holders (``seg_keys`` in the ``hyfdca.init`` reply, relayed in ``hyfdca.norms``) and
the batch Gram vectors travel as padded ``uint64`` words (exchange tag 0); every ``hyfdca.segstart``
and ``hyfdca.sweep`` carries a fresh ``tag``, the shares and sums are padded words (one array per
message, the listed segments one after another), and every holder removes all holders' pads from
the sum. The duals (``dalpha``, ``alpha``) stay under the run's encryption.

``output: step_average`` (our option, :mod:`hybridfl.algorithms.hyfdca.output`): ``hyfdca.init`` carries
``seg_step_average``; during a pass every holder also sums each step's change times its place in
the pass, and its closing sweep's reply carries the position share of its pass's segments (the
fallback ``hyfdca.primal`` names in ``avg_segs`` the client's segments whose pass the server
added) (masked together with the share under secure aggregation, ``position_share`` without),
from which the server forms the round's mean iterate.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np

from hybridfl.algorithms.hyfdca import gram
from hybridfl.privacy.segmask import SEALED_BYTES
from hybridfl.runtime import secagg_messages as sm
from hybridfl.runtime import validate
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError


def int_list(msg: Message, key: str) -> list[int]:
    """The list (or integer array) of integers ``msg.payload[key]``.

    Raises:
        PayloadError: missing or not a list of integers.
    """
    v = msg.payload.get(key)
    if isinstance(v, np.ndarray) and v.dtype.kind in "iu" and v.ndim == 1:
        return [int(x) for x in v]
    if not isinstance(v, list) or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
        raise PayloadError(msg, key, "not a list of integers")
    return [int(x) for x in v]


def concat_words(parts: list[np.ndarray]) -> np.ndarray:
    """Masked words of several segments as one ``uint64`` array (one after another)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def split_words(words: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """``words`` cut into consecutive parts of ``sizes``."""
    return np.split(words, np.cumsum(sizes)[:-1]) if sizes else []


def wrap_sum(parts: list[np.ndarray]) -> np.ndarray:
    """The sum of ``uint64`` word arrays modulo ``2^64`` (the masks' ring)."""
    out = parts[0].copy()
    for v in parts[1:]:
        out += v
    return out


class SegmentServerMixin:
    """The server steps of ``dual_mode: segment`` (mixed into ``HyFDCAServer``, whose attributes
    they use: ``config``, ``rng``, ``he``, ``w``, ``feat``, ``enc_alpha``, ``seg_n``,
    ``seg_holders``, ``client_segs``, ``last_round``)."""

    @property
    def masked(self) -> bool:
        """Whether the segment passes mask the inner products (``segment_inner_products: masked``,
        :mod:`hybridfl.privacy.segmask`) instead of encrypting them."""
        return self.config.segment_inner_products == "masked"  # the config allows it in segment mode only

    def _segment_init_payload(self, segs: list[int], batch_seed: int) -> dict[str, Any]:
        """The segment-mode entries of one client's ``hyfdca.init``: ``batch_size``, the global
        segment IDs ``seg_global`` and the ``batch_seed`` of the fixed mini-batches; masked, also
        ``seg_masked`` and ``seg_holders`` (per segment a JSON list of its holders' names, sorted);
        ``gram_dtype``, the precision of the batch Gram matrices, declared (every holder of a
        segment must round the same sums alike to make the same steps, so each computes in its own
        :data:`.gram.GRAM_DTYPE` and refuses an init declaring another)."""
        out: dict[str, Any] = {
            "batch_size": self.config.batch_size,
            "seg_global": list(segs),
            "batch_seed": batch_seed,
            "gram_dtype": gram.GRAM_DTYPE,
        }
        if self.config.step_average:
            out["seg_step_average"] = True
        if self.masked:
            out["seg_masked"] = True
            out["seg_holders"] = [json.dumps(sorted(self.seg_holders[g])) for g in segs]
        return out

    def _check_segment_init(self, r: Message) -> None:
        """A segment-mode ``hyfdca.init`` reply's ``gram`` (one ciphertext per segment of its
        packed length, or masked: ``uint64`` words of the total length) and, masked, ``seg_keys``
        (one sealed key per segment and other holder).

        Raises:
            PayloadError: any of these fails.
        """
        segs = self.client_segs[r.sender]
        if not self.masked:
            self.check_ciphertexts(r, "gram", [self.gram_length(g) for g in segs])
            return
        sm.uint64_array(r, "gram", sum(self.gram_length(g) for g in segs))
        count = sum(len(self.seg_holders[g]) - 1 for g in segs)
        for blob in validate.blobs(r, "seg_keys", count, max_bytes=SEALED_BYTES):
            if len(blob) != SEALED_BYTES:
                raise PayloadError(r, "seg_keys", f"holding a sealed key of {len(blob)} bytes, not {SEALED_BYTES}")

    def _segment_norms_payloads(self, replies: list[Message]) -> dict[str, dict[str, Any]]:
        """Setup, segment mode: each client's ``hyfdca.norms`` entries: ``gram``, the holders'
        partial Gram matrices added per segment (encrypted: one packed ciphertext per segment,
        :meth:`~hybridfl.algorithms.hyfdca.segment_client.SegmentClientMixin._segment_init`; masked: the ``uint64`` sums modulo ``2^64``, its
        segments one after another) and, masked, ``seg_keys``: the keys the other holders of its
        segments sealed for it (per segment, holders in sorted order), relayed unopened."""
        gparts: dict[int, list[Any]] = defaultdict(list)
        sealed: dict[tuple[str, str, int], bytes] = {}
        for r in replies:
            segs = self.client_segs[r.sender]
            if self.masked:
                parts = split_words(r.payload["gram"], [self.gram_length(g) for g in segs])
                it = iter(r.payload["seg_keys"])
                for g in segs:
                    for h in sorted(self.seg_holders[g]):
                        if h != r.sender:
                            sealed[(r.sender, h, g)] = next(it)
            else:
                parts = r.payload["gram"]
            for g, c in zip(segs, parts):
                gparts[g].append(c)
        # each segment's sum once, the same for all its holders (not once per holder)
        sums = {g: wrap_sum(parts) if self.masked else self.he.add(parts) for g, parts in gparts.items()}
        for v in sums.values():
            if isinstance(v, np.ndarray):  # masked: one array in the messages of all the segment's holders
                v.setflags(write=False)
        out = {}
        for cid in self.client_ids:
            segs = self.client_segs[cid]
            if not self.masked:
                out[cid] = {"gram": [sums[g] for g in segs]}
                continue
            out[cid] = {
                "gram": sums[segs[0]] if len(segs) == 1 else concat_words([sums[g] for g in segs]),
                "seg_keys": [sealed[(h, cid, g)] for g in segs for h in sorted(self.seg_holders[g]) if h != cid],
            }
        return out

    def _next_mask_tag(self) -> dict[str, int]:
        """Masked: ``{"tag": t}`` with a fresh exchange number (the segment passes' counter,
        part of the server's state); ``{}`` otherwise."""
        if not self.masked:
            return {}
        self.seg_tag = int(self.seg_tag) + 1
        return {"tag": self.seg_tag}

    def _check_shares(self, r: Message, key: str, sizes: list[int]) -> None:
        """A reply's inner-product shares ``key``: one ciphertext per size, or masked, ``uint64``
        words of the total size.

        Raises:
            PayloadError: otherwise.
        """
        if self.masked:
            sm.uint64_array(r, key, sum(sizes))
        else:
            self.check_ciphertexts(r, key, sizes)

    def _shares_of(self, r: Message, key: str, sizes: list[int]) -> list[Any]:
        """The per-segment shares of a checked reply (:meth:`_check_shares`)."""
        return split_words(r.payload[key], sizes) if self.masked else list(r.payload[key])

    def _add_shares(self, parts: list[Any]) -> Any:
        """The holders' shares added: under encryption, or masked words modulo ``2^64``."""
        return wrap_sum(parts) if self.masked else self.he.add(parts)

    def gram_length(self, g: int) -> int:
        """The length of segment ``g``'s packed Gram vector: ``sum_B b_B (b_B + 1) / 2`` over its batches."""
        sizes = [len(self.seg_batches_of(g, m)) for m in range(self.seg_batch_counts[g])]
        return sum(b * (b + 1) // 2 for b in sizes)

    def seg_batches_of(self, g: int, m: int) -> range:
        """The positions of batch ``m`` of global segment ``g`` (its size is what the server checks)."""
        b = self.config.batch_size
        return range(m * b, min((m + 1) * b, self.seg_n[g]))

    def _check_sweep(self, r: Message, sent: list[int], orders: dict[int, list[int]], step: int) -> None:
        """A ``hyfdca.sweep`` reply: ``ip_segs`` and ``dalpha_segs`` split the segments it was sent
        (local indices, each once); ``ip`` holds one ciphertext of the next batch's length per
        ``ip_segs`` entry (a segment whose pass goes on), ``dalpha`` one of the segment's length
        per ``dalpha_segs`` entry (a finished pass). A closing sweep's share is checked by the
        caller (:class:`~hybridfl.algorithms.hyfdca.segment_pass.SegmentPass`).

        Raises:
            PayloadError: any of these fails.
        """
        segs = self.client_segs[r.sender]
        ip_segs, dal_segs = int_list(r, "ip_segs"), int_list(r, "dalpha_segs")
        if sorted(ip_segs + dal_segs) != sorted(sent):
            raise PayloadError(r, "ip_segs", "not splitting the segments it was sent")
        for j in ip_segs:
            if step >= len(orders[segs[j]]):
                raise PayloadError(r, "ip_segs", "continuing a pass that is over")
        for j in dal_segs:
            if step != len(orders[segs[j]]):
                raise PayloadError(r, "dalpha_segs", "ending a pass that is not over")
        self._check_shares(r, "ip", [len(self.seg_batches_of(segs[j], orders[segs[j]][step])) for j in ip_segs])
        self.check_ciphertexts(r, "dalpha", [self.seg_n[segs[j]] for j in dal_segs])
