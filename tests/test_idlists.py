"""The plaintext alignment's shared ID lists (:mod:`hybridfl.algorithms.hyfdca.idlists`): clients
with equal lists share one object, and the layout built on them is the one built client by client."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridfl.algorithms.hyfdca.align import plaintext_segments, segment_order
from hybridfl.algorithms.hyfdca.idlists import shared_lists


def _naive(holdings, clients):
    """Each sample's holder set, client by client, then grouped (the layout by definition)."""
    sets: dict[str, set] = {}
    for c in clients:
        for s in map(str, holdings[c]):
            sets.setdefault(s, set()).add(c)
    groups: dict[tuple, list] = {}
    for s, hs in sets.items():
        groups.setdefault(tuple(sorted(hs)), []).append(s)
    return [(k, sorted(groups[k])) for k in segment_order(groups, clients)]


lists = st.lists(st.sampled_from([f"s{i}" for i in range(12)]), unique=True, max_size=8)


@settings(max_examples=80, deadline=None)
@given(base=st.lists(lists, min_size=1, max_size=3), picks=st.lists(st.integers(0, 2), min_size=1, max_size=6))
def test_plaintext_segments_with_shared_lists_are_the_client_by_client_layout(base, picks):
    """Clients drawn from a few ID lists (so several hold equal lists, as a grid's do): the same
    segments and IDs as the layout built client by client; equal lists become one object, unequal
    ones stay apart; numpy arrays and lists of the same IDs count as equal."""
    clients = [f"c{k}" for k in range(len(picks))]
    holdings = {c: list(base[p % len(base)]) for c, p in zip(clients, picks)}
    got = plaintext_segments(holdings, clients)
    assert [(k, list(v)) for k, v in got] == _naive(holdings, clients)
    shared = shared_lists(holdings)
    for a in clients:
        for b in clients:
            assert (shared[a] is shared[b]) == (holdings[a] == holdings[b])
    arrays = {c: np.array(v, dtype=str) if k % 2 else v for k, (c, v) in enumerate(holdings.items())}
    assert [(k, list(v)) for k, v in plaintext_segments(arrays, clients)] == _naive(holdings, clients)


def test_ids_cross_as_one_byte_string_and_bad_ones_are_refused_by_name():
    """``pack_ids``/``unpack_ids``: any list of IDs (empty IDs, non-ASCII, none at all) comes back
    equal; the client refuses to send an ID with a NUL in one sentence; the server refuses, naming
    ``ids``, bytes that are not UTF-8, not NUL-ended, of another type, or with a repeated ID."""
    import pytest

    from hybridfl.algorithms.hyfdca.idlists import pack_ids, unpack_ids
    from hybridfl.errors import DataError
    from hybridfl.runtime.messages import SERVER, Message, decode, encode
    from hybridfl.runtime.validate import PayloadError

    def reply(v):
        return decode(encode(Message("hyfdca.hello", "c", SERVER, 0, {"ids": v})))

    for ids in ([], [""], ["a", "", "b"], ["é", "日本", "x y"], [str(i) for i in range(1000)]):
        assert unpack_ids(reply(pack_ids(ids)), "ids") == ids
    with pytest.raises(DataError, match="NUL"):
        pack_ids(["a", "b\x00c"])
    for bad, why in [
        (b"\xff\x00", "not UTF-8"),
        (b"a\x00b", "not a list of NUL-ended IDs"),
        (b"a\x00a\x00", "repeated value"),
        (["a", "b"], "not bytes"),
    ]:
        with pytest.raises(PayloadError, match=f"'ids'.*{why}"):
            unpack_ids(reply(bad), "ids")
