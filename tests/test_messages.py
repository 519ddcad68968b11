"""The message codec: encode -> decode round-trips any payload, and decode trusts no byte.

Any byte string either decodes to a message whose re-encoding decodes to the same message, or
raises :class:`MessageError` (one sentence, without the data); never another exception, and never
more memory than the input (the overlapping-entries blow-up).
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hybridfl.errors import HybridFLError, MessageError
from hybridfl.runtime import messages
from hybridfl.runtime.messages import MAX_MESSAGE_BYTES, Message, decode, decode_parts, encode, encode_parts

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# the bytes the encoder wrote before the decoder was hardened: files and checkpoints written then
# must still decode, and the encoder must still write exactly these bytes
GOLDEN = bytes.fromhex(
    "0000015c7b226b696e64223a2264656d6f2e666974222c2266726f6d223a22736572766572222c22746f223a22636c69656e"
    "742d30222c22726f756e64223a372c2276223a7b226e6f6e65223a5b5d2c226c72223a302e352c22696473223a5b2261222c"
    "2262225d2c226e223a332c226f6b223a747275652c2278223a6e756c6c7d2c2265223a5b7b226b223a2277222c2274223a22"
    "61222c2264223a223c6634222c2273223a5b322c335d2c226f223a302c226e223a32347d2c7b226b223a226d61736b222c22"
    "74223a2261222c2264223a227c6231222c2273223a5b325d2c226f223a32342c226e223a327d2c7b226b223a22626c6f6222"
    "2c2274223a2262222c226f223a32362c226e223a327d2c7b226b223a22637473222c2274223a226c222c2269223a302c226f"
    "223a32382c226e223a327d2c7b226b223a22637473222c2274223a226c222c2269223a312c226f223a33302c226e223a317d"
    "5d7d000000000000803f0000004000004040000080400000a04001000001616263"
)
GOLDEN_MSG = Message(
    "demo.fit",
    "server",
    "client-0",
    7,
    {
        "w": np.arange(6, dtype="<f4").reshape(2, 3),
        "mask": np.array([True, False]),
        "blob": b"\x00\x01",
        "cts": [b"ab", b"c"],
        "none": [],
        "lr": 0.5,
        "ids": ["a", "b"],
        "n": 3,
        "ok": True,
        "x": None,
    },
)


def same(a, b) -> bool:
    """Payload values equal, arrays by dtype, shape and bytes, floats with NaN equal to NaN."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def same_message(a: Message, b: Message) -> bool:
    """Two messages with the same fields and payload (see :func:`same`)."""
    return (
        (a.kind, a.sender, a.receiver, a.round) == (b.kind, b.sender, b.receiver, b.round)
        and a.payload.keys() == b.payload.keys()
        and all(same(a.payload[k], b.payload[k]) for k in a.payload)
    )


def frame(header: dict, body: bytes = b"") -> bytes:
    """A raw message with this header and body (no checks: for building hostile input)."""
    h = json.dumps(header).encode()
    return struct.pack(">I", len(h)) + h + body


def header(entries: list, v: dict | None = None, **over) -> dict:
    return {"kind": "k", "from": "a", "to": "b", "round": 0, "v": v or {}, "e": entries, **over}


# ---- strategies ----------------------------------------------------------------------------------
dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="="),
    hnp.unsigned_integer_dtypes(endianness="="),
    hnp.floating_dtypes(endianness="="),
    hnp.complex_number_dtypes(endianness="="),
    st.sampled_from([np.dtype(">f8"), np.dtype(">i4")]),
)
# (a 0-d array travels as shape (1,): np.ascontiguousarray in encode; see test_zero_dim_array)
arrays = dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))
flat = st.lists(st.one_of(st.booleans(), st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=6)), max_size=4)
values = st.one_of(arrays, st.binary(max_size=40), st.lists(st.binary(max_size=12), max_size=3), scalars, flat)
payloads = st.dictionaries(st.text(max_size=6), values, max_size=6)
msgs = st.builds(
    Message,
    kind=st.text(max_size=12),
    sender=st.text(max_size=6),
    receiver=st.text(max_size=6),
    round=st.integers(-5, 10**6),
    payload=payloads,
)


@PROPS
@given(msg=msgs)
def test_round_trip(msg):
    """Any payload of arrays, bytes, lists of bytes, scalars and flat lists comes back equal, and
    its re-encoding is the same bytes."""
    raw = encode(msg)
    back = decode(raw)
    assert same_message(msg, back)
    assert encode(back) == raw
    for v in back.payload.values():
        if isinstance(v, np.ndarray):
            assert v.flags.writeable and v.flags.owndata  # a copy, not a view of the input


@PROPS
@given(msg=msgs)
def test_pieces_decode_to_the_message_of_their_join(msg):
    """:func:`decode_parts` of :func:`encode_parts`'s pieces is :func:`decode` of their join (which
    is :func:`encode`'s bytes): the same message; a ``bytes`` value comes back as the sender's own
    object (it cannot change), an array as a writable copy that shares no memory with the sender's."""
    head, bodies = encode_parts(msg)
    raw = b"".join([head, *bodies])
    assert raw == encode(msg)
    back = decode_parts(head, bodies)
    assert same_message(back, decode(raw)) and same_message(back, msg)
    for k, v in back.payload.items():
        if isinstance(v, np.ndarray):
            assert v.flags.writeable and v.flags.owndata and not np.shares_memory(v, msg.payload[k])
        elif isinstance(v, bytes):
            assert v is msg.payload[k]
        elif isinstance(v, list) and v and all(isinstance(x, bytes) for x in v):
            assert all(a is b for a, b in zip(v, msg.payload[k], strict=True))


def test_mutable_bodies_are_copied_and_malformed_pieces_refused():
    """A ``bytearray`` value is copied (the sender may change it later); pieces that do not make
    one message are refused with one sentence: a body missing or extra, a body of another length,
    a header piece with more than its header, a body that is not a byte buffer."""
    buf = bytearray(b"abcdef")
    msg = Message("k", "a", "b", 1, {"x": np.arange(3.0), "blob": buf, "ids": [b"u", b"vw"]})
    head, bodies = encode_parts(msg)
    back = decode_parts(head, bodies)
    buf[0] = ord("z")
    assert back.payload["blob"] == b"abcdef" and type(back.payload["blob"]) is bytes
    cases = {
        "bodies for": (head, bodies[:-1]),
        "another length": (head, [*bodies[:-2], b"uv", b"w"]),  # the same bytes in all
        "past the end": (head, [*bodies[:-1], b"v"]),
        "header piece": (head + b"x", bodies),
        "contiguous byte buffer": (head, [*bodies[:-1], 7]),
    }
    for why, (h, b) in cases.items():
        with pytest.raises(MessageError, match=why):
            decode_parts(h, b)
    with pytest.raises(MessageError):
        decode_parts(head[:-3], bodies)  # a truncated header


def test_zero_dim_array():
    """A 0-d array comes back as shape (1,) (the encoder's long-standing behaviour, kept so the
    bytes of existing files do not change); a 0-d array entry written by hand decodes as 0-d."""
    back = decode(encode(Message("k", "a", "b", 0, {"x": np.array(2.5)})))
    assert back.payload["x"].shape == (1,) and back.payload["x"][0] == 2.5
    e = {"k": "x", "t": "a", "d": "<f8", "s": [], "o": 0, "n": 8}
    assert decode(frame(header([e]), np.float64(2.5).tobytes())).payload["x"].shape == ()


def _accept_or_message_error(raw) -> None:
    try:
        m = decode(raw)
    except MessageError as e:
        text = str(e)
        assert text.endswith(".") and "\n" not in text and len(text) < 300
        return
    again = encode(m)  # what decodes also re-encodes (no TypeError) ...
    assert same_message(decode(again), m)  # ... to a message that decodes to the same
    assert sum(v.nbytes for v in m.payload.values() if isinstance(v, np.ndarray)) <= len(raw)


def _mutate(raw: bytes, data) -> bytes:
    how = data.draw(st.sampled_from(["truncate", "flip", "insert", "append", "splice", "header"]))
    n = len(raw)
    if n == 0:
        return data.draw(st.binary(max_size=8))
    if how == "truncate":
        return raw[: data.draw(st.integers(0, n))]
    if how == "flip":
        b = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 4))):
            b[data.draw(st.integers(0, n - 1))] = data.draw(st.integers(0, 255))
        return bytes(b)
    if how == "insert":
        i = data.draw(st.integers(0, n))
        return raw[:i] + data.draw(st.binary(min_size=1, max_size=8)) + raw[i:]
    if how == "append":
        return raw + data.draw(st.binary(min_size=1, max_size=8))
    if how == "splice":
        i = data.draw(st.integers(0, n))
        j = data.draw(st.integers(i, n))
        return raw[:i] + raw[j:]
    # rewrite one field of the JSON header (entries' offsets, lengths, dtypes, shapes, indices)
    try:
        (hlen,) = struct.unpack(">I", raw[:4])
        h = json.loads(raw[4 : 4 + hlen])
        assert isinstance(h, dict) and isinstance(h.get("e"), list) and all(isinstance(e, dict) for e in h["e"])
    except (struct.error, ValueError, AssertionError):  # an earlier mutation broke the header already
        return raw
    junk = st.one_of(
        st.integers(-(2**40), 2**40),
        st.integers(-3, 64),
        st.text(max_size=6),
        st.none(),
        st.booleans(),
        st.floats(),
        st.lists(st.integers(-2, 2**33), max_size=3),
        st.sampled_from(["<f8", "|O", "<U3", "|V8", "<M8[s]", "(2,)<i4", "[('a','<i4')]", "float64", "|b1"]),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    )
    if h["e"] and data.draw(st.booleans()):
        e = h["e"][data.draw(st.integers(0, len(h["e"]) - 1))]
        e[data.draw(st.sampled_from(["k", "t", "d", "s", "o", "n", "i", "x"]))] = data.draw(junk)
    else:
        key = data.draw(st.sampled_from(["kind", "from", "to", "round", "v", "e", "extra"]))
        h[key] = data.draw(st.one_of(junk, st.lists(junk, max_size=2)))
    if data.draw(st.booleans()):
        h["e"] = data.draw(st.permutations(h["e"])) if isinstance(h["e"], list) else h["e"]
    return frame(h, raw[4 + hlen :])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=msgs, data=st.data())
def test_fuzz_mutations_decode_or_raise_message_error(msg, data):
    """Truncated, flipped, inserted, appended, spliced bytes and rewritten header fields of a valid
    message: decode either gives a message that re-encodes validly, or raises MessageError."""
    raw = encode(msg)
    for _ in range(data.draw(st.integers(1, 3))):
        raw = _mutate(raw, data)
    _accept_or_message_error(raw)
    # the same bytes as pieces: the claimed header, then the rest cut where a piece may end
    hlen = struct.unpack(">I", raw[:4])[0] if len(raw) >= 4 else 0
    cut = min(len(raw), 4 + hlen)
    rest = raw[cut:]
    ends = sorted(data.draw(st.lists(st.integers(0, len(rest)), max_size=3)))
    pieces = [rest[a:b] for a, b in zip([0, *ends], [*ends, len(rest)])]
    try:
        m = decode_parts(raw[:cut], pieces)
    except MessageError as e:
        assert str(e).endswith(".") and "\n" not in str(e)
    else:
        assert same_message(m, decode(raw))  # pieces that make a message make the join's


@PROPS
@given(raw=st.one_of(st.binary(max_size=200), st.binary(max_size=40).map(lambda b: struct.pack(">I", len(b)) + b)))
def test_fuzz_random_bytes(raw):
    """Arbitrary bytes (also with a matching header length) decode or raise MessageError."""
    _accept_or_message_error(raw)


def test_old_files_still_decode_and_encode_is_unchanged():
    """The wire format is unchanged: bytes written by the earlier encoder decode to the same
    message, and encoding it gives the same bytes."""
    assert same_message(decode(GOLDEN), GOLDEN_MSG)
    assert encode(GOLDEN_MSG) == GOLDEN
    assert same_message(decode(bytearray(GOLDEN)), GOLDEN_MSG)
    assert same_message(decode(memoryview(GOLDEN)), GOLDEN_MSG)


def test_the_header_scan_keeps_the_decoders_whitespace_and_refusals():
    """The header is scanned by the C scanner straight away and handed to the full JSON decoder
    only when the scan does not end at its end: whitespace around the JSON object is accepted as
    before, and a second value, trailing garbage or a truncated object is refused."""
    n = struct.unpack(">I", GOLDEN[:4])[0]
    head, body = GOLDEN[4 : 4 + n], GOLDEN[4 + n :]
    for spaced in (b" " + head, head + b"\n", b"\t" + head + b"  "):
        assert same_message(decode(struct.pack(">I", len(spaced)) + spaced + body), GOLDEN_MSG)
    for bad in (head + b"{}", head + b"x", head[:-1], b"[" + head + b"]"):
        with pytest.raises(MessageError):
            decode(struct.pack(">I", len(bad)) + bad + body)


def test_overlapping_entries_are_refused():
    """The blow-up: 300 array entries all pointing at the same 1 MiB body (a 1.02 MiB message
    that decoded to 300 MiB of arrays) is refused."""
    body = np.zeros(128 * 1024, dtype="<f8").tobytes()
    e = [{"k": f"x{i}", "t": "a", "d": "<f8", "s": [128 * 1024], "o": 0, "n": len(body)} for i in range(300)]
    raw = frame(header(e), body)
    assert len(raw) < 1.1 * 2**20
    with pytest.raises(MessageError, match="overlaps"):
        decode(raw)
    # partial overlap of two bytes entries
    e2 = [{"k": "a", "t": "b", "o": 0, "n": 6}, {"k": "b", "t": "b", "o": 4, "n": 6}]
    with pytest.raises(MessageError, match="overlaps"):
        decode(frame(header(e2), b"0123456789"))


def test_truncation_is_refused_at_every_length():
    """Every proper prefix of a valid message raises MessageError."""
    for i in range(len(GOLDEN)):
        with pytest.raises(MessageError):
            decode(GOLDEN[:i])


def test_negative_offset_and_length_are_refused():
    for e in ({"k": "a", "t": "b", "o": -2, "n": 2}, {"k": "a", "t": "b", "o": 0, "n": -1}):
        with pytest.raises(MessageError, match="negative"):
            decode(frame(header([e]), b"ab"))


def test_trailing_garbage_gaps_and_entries_past_the_end_are_refused():
    with pytest.raises(MessageError, match="trailing"):
        decode(GOLDEN + b"x")
    with pytest.raises(MessageError, match="trailing"):
        decode(frame(header([]), b"junk"))
    with pytest.raises(MessageError, match="gap"):
        decode(frame(header([{"k": "a", "t": "b", "o": 1, "n": 1}]), b"ab"))
    with pytest.raises(MessageError, match="past the end"):
        decode(frame(header([{"k": "a", "t": "b", "o": 0, "n": 3}]), b"ab"))
    with pytest.raises(MessageError, match="truncated"):
        decode(struct.pack(">I", 1000) + b"{}")


@pytest.mark.parametrize("dtype", ["|O", "<U2", "|S8", "|V8", "<M8[s]", "<m8[s]", "(2,)<i4", "float64", "nope", 3])
def test_dtypes_other_than_numeric_or_bool_are_refused(dtype):
    """Object, string, void/structured, datetime, sub-array and non-canonical dtypes are refused."""
    e = {"k": "a", "t": "a", "d": dtype, "s": [1], "o": 0, "n": 8}
    with pytest.raises(MessageError, match="dtype"):
        decode(frame(header([e]), b"\0" * 8))
    structured = {"k": "a", "t": "a", "d": [["a", "<i4"], ["b", "<i4"]], "s": [1], "o": 0, "n": 8}
    with pytest.raises(MessageError, match="dtype"):
        decode(frame(header([structured]), b"\0" * 8))


def test_encode_refuses_what_decode_refuses():
    for a in (np.array(["ab"]), np.array([b"ab"]), np.zeros(2, dtype=[("a", "<i4")]), np.array([1], dtype=object)):
        with pytest.raises(TypeError):
            encode(Message("k", "a", "b", 0, {"x": a}))


def test_array_size_must_match_shape_and_dtype():
    e = {"k": "a", "t": "a", "d": "<f8", "s": [2], "o": 0, "n": 8}
    with pytest.raises(MessageError, match="does not match its shape"):
        decode(frame(header([e]), b"\0" * 8))
    for shape in ([-1], [0, 2**62], "2", [1.0], [True], [1] * 40):
        e = {"k": "a", "t": "a", "d": "<f8", "s": shape, "o": 0, "n": 0}
        with pytest.raises(MessageError, match="shape"):
            decode(frame(header([e])))


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack(">I", 3) + b"\xff\xfe\xfd",  # not UTF-8
        struct.pack(">I", 5) + b"[1,2]",  # not an object
        frame({"kind": "k", "from": "a", "to": "b", "round": 0, "v": {}}),  # missing key
        frame({**header([]), "extra": 1}),  # extra key
        frame(header([], round="1")),  # round not an integer
        frame(header([], round=True)),
        frame(header([], kind=3)),
        frame({**header([]), "v": []}),
        frame(header([], v={"x": {"nested": 1}})),
        frame(header([], v={"x": [None]})),
        frame(header([], v={"x": [[1]]})),
        frame(header({})),
        frame(header([{"k": "a", "t": "b", "o": 0, "n": 0, "x": 1}])),  # extra entry key
        frame(header([{"k": "a", "t": "z", "o": 0, "n": 0}])),  # unknown entry type
        frame(header([{"k": 1, "t": "b", "o": 0, "n": 0}])),  # key not a string
        frame(header([{"k": "a", "t": "b", "o": 0.0, "n": 0}])),  # offset not an integer
        frame(header([{"k": "a", "t": "b", "o": False, "n": 0}])),
        frame(header([["k", "a"]])),
        struct.pack(">I", 2) + b"{}",
        struct.pack(">I", 30) + b'{"kind":"k","kind":"k","x":1}',  # duplicate key
        struct.pack(">I", 2000) + b"[" * 1000 + b"]" * 1000,  # deep nesting
    ],
)
def test_bad_headers_raise_message_error(raw):
    with pytest.raises(MessageError):
        decode(raw)


def test_repeated_keys_and_list_order_are_refused():
    two = [{"k": "a", "t": "b", "o": 0, "n": 1}, {"k": "a", "t": "b", "o": 1, "n": 1}]
    with pytest.raises(MessageError, match="repeats"):
        decode(frame(header(two), b"ab"))
    with pytest.raises(MessageError, match="repeats"):
        decode(frame(header(two[:1], v={"a": 1}), b"a"))
    lst = [{"k": "a", "t": "l", "i": 1, "o": 0, "n": 1}, {"k": "a", "t": "l", "i": 0, "o": 1, "n": 1}]
    with pytest.raises(MessageError, match="out of order"):
        decode(frame(header(lst), b"ab"))


def test_size_cap_and_non_bytes(monkeypatch):
    assert MAX_MESSAGE_BYTES == 2 * 1024**3
    monkeypatch.setattr(messages, "MAX_MESSAGE_BYTES", 100)
    with pytest.raises(MessageError, match="over the limit"):
        decode(encode(Message("k", "a", "b", 0, {"x": np.zeros(20)})))
    with pytest.raises(MessageError, match="over the limit"):
        encode(Message("k", "a", "b", 0, {"x": np.zeros(20)}))
    for bad in ("text", None, 3, [1, 2]):
        with pytest.raises(MessageError, match="must be bytes"):
            decode(bad)  # type: ignore[arg-type]


def test_one_exception_type_for_every_user_facing_caller(tmp_path):
    """MessageError is a HybridFLError (the CLI prints its one sentence), and the callers that read
    message files turn it into their own one sentence."""
    from hybridfl.errors import DataError
    from hybridfl.privacy.keys import backend_from_secret
    from hybridfl.runtime.checkpoint import load_checkpoint

    assert issubclass(MessageError, HybridFLError)
    ck = tmp_path / "checkpoint.hfl"
    for raw in (GOLDEN + b"x", GOLDEN[:-3], b"\0\0\0\0", frame(header([{"k": "a", "t": "b", "o": -1, "n": 1}]), b"a")):
        ck.write_bytes(raw)
        with pytest.raises(HybridFLError, match="is unreadable") as e:
            load_checkpoint(ck)
        assert type(e.value) is HybridFLError
        with pytest.raises(DataError, match="is not a hybridfl HE secret key file"):
            backend_from_secret(raw, "the test key")


def test_a_header_of_many_small_values_is_refused_before_it_is_parsed(monkeypatch):
    """The inflation attack: a 2.7 MB header holding 450,000 two-letter strings in one list
    decoded to 29 MB of Python objects (peak, tracemalloc) before any check; now it is refused on
    its comma count before the JSON is parsed (json.loads is never called)."""
    hostile = frame(header([], v={"peers": ["ab"] * 450_000}))
    assert len(hostile) < 3 * 2**20

    def no_parse(*a, **k):
        raise AssertionError("the header was parsed")

    monkeypatch.setattr(messages.json, "loads", no_parse)
    with pytest.raises(MessageError, match="over the limit of 300000"):
        decode(hostile)


def test_a_header_over_its_byte_limit_is_refused_and_not_written():
    big = "x" * (messages.MAX_HEADER_BYTES + 1)
    with pytest.raises(MessageError, match="bytes, over the limit"):
        decode(frame(header([], v={"s": big})))
    with pytest.raises(MessageError, match="header is .* bytes, over the limit"):
        encode(Message("k", "a", "b", 0, {"s": big}))
    with pytest.raises(MessageError, match="long lists go in the body"):
        encode(Message("k", "a", "b", 0, {"ids": list(range(messages.MAX_HEADER_ITEMS + 5))}))


def test_the_largest_accepted_header_stays_small_in_memory():
    """The worst header within both bounds (as many two-letter strings as the comma limit allows)
    takes at most 40 MB while decoded, and an array of the same count travels in the body at its
    byte size."""
    import tracemalloc

    n = messages.MAX_HEADER_ITEMS - 10
    ok = frame(header([], v={"peers": ["ab"] * n}))
    tracemalloc.start()
    try:
        m = decode(ok)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(m.payload["peers"]) == n
    assert peak < 40 * 2**20, peak
    arr = decode(encode(Message("k", "a", "b", 0, {"x": np.arange(n, dtype=np.int32)})))
    assert arr.payload["x"].nbytes == 4 * n


def _old_encode(msg: Message) -> bytes:
    """The encoder as it was before it stopped copying the bodies twice and checked long flat lists
    at C speed: the oracle that the bytes and the accepted types did not change."""
    entries, values, bodies, offset = [], {}, [], 0
    for key, v in msg.payload.items():
        if isinstance(v, np.ndarray):
            arr = np.ascontiguousarray(v)
            if arr.dtype == object or arr.dtype.kind not in "biufc" or arr.dtype.fields is not None:
                raise TypeError(key)
            raw = arr.tobytes()
            entries.append({"k": key, "t": "a", "d": arr.dtype.str, "s": list(arr.shape), "o": offset, "n": len(raw)})
        elif isinstance(v, (bytes, bytearray)):
            raw = bytes(v)
            entries.append({"k": key, "t": "b", "o": offset, "n": len(raw)})
        elif isinstance(v, (bool, int, float, str, np.integer, np.floating)) or v is None:
            values[key] = v.item() if isinstance(v, (np.integer, np.floating)) else v
            continue
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in v):
            values[key] = list(v)
            continue
        elif isinstance(v, list) and all(isinstance(x, (bytes, bytearray)) for x in v):
            for j, x in enumerate(v):
                bodies.append(bytes(x))
                entries.append({"k": key, "t": "l", "i": j, "o": offset, "n": len(x)})
                offset += len(x)
            if not v:
                values[key] = []
            continue
        else:
            raise TypeError(key)
        bodies.append(raw)
        offset += len(raw)
    head = {"kind": msg.kind, "from": msg.sender, "to": msg.receiver, "round": msg.round, "v": values, "e": entries}
    header = json.dumps(head, separators=(",", ":")).encode()
    return struct.pack(">I", len(header)) + header + b"".join(bodies)


class _Str(str):
    pass


odd_items = st.one_of(
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.builds(np.float64, st.floats(-1, 1)),  # a float subclass: accepted
    st.builds(np.bool_, st.booleans()),  # not a bool subclass: refused
    st.builds(np.int64, st.integers(-5, 5)),  # not an int subclass: refused
    st.builds(_Str, st.text(max_size=3)),
    st.binary(max_size=3),
    st.builds(bytearray, st.binary(max_size=3)),
    st.none(),
)
wide_values = st.one_of(
    values,
    st.builds(bytearray, st.binary(max_size=20)),
    arrays.map(lambda a: a[::2] if a.ndim else a),  # not contiguous
    arrays.map(lambda a: a.T),
    st.lists(odd_items, max_size=5),
    st.lists(odd_items, max_size=5).map(tuple),
    st.lists(st.one_of(st.binary(max_size=4), st.builds(bytearray, st.binary(max_size=4))), max_size=3),
    st.builds(np.float32, st.floats(-1, 1, width=32)),
    st.builds(np.int16, st.integers(-5, 5)),
)


@PROPS
@given(
    msg=st.builds(
        Message,
        kind=st.text(max_size=4),
        sender=st.just("a"),
        receiver=st.just("b"),
        round=st.just(1),
        payload=st.dictionaries(st.text(max_size=4), wide_values, max_size=5),
    )
)
def test_encode_writes_the_bytes_and_refuses_the_types_of_the_old_encoder(msg):
    """The encoder's bytes (one copy of the bodies now) and the payload types it accepts (long
    flat lists now checked by their types' set) are those of the earlier encoder, for arrays that
    are not contiguous, bytearrays, tuples, NumPy scalars and lists of mixed or subclassed items."""
    try:
        want = _old_encode(msg)
    except TypeError:
        with pytest.raises(TypeError):
            encode(msg)
        return
    assert encode(msg) == want


def test_a_long_list_of_ids_is_checked_whole():
    """A list of 100,000 IDs is sent; one item of another type anywhere in it (a bool in a list of
    strings is a scalar; bytes, None or a NumPy integer are not) is found."""
    ids = [f"id-{i}" for i in range(100_000)]
    assert decode(encode(Message("k", "a", "b", 0, {"ids": ids}))).payload["ids"] == ids
    for bad in (b"x", None, np.int64(3), [1]):
        with pytest.raises(TypeError, match="'ids'"):
            encode(Message("k", "a", "b", 0, {"ids": [*ids[:70_000], bad, *ids[70_000:]]}))
    mixed = [*ids[:5], True, 3, 2.5, _Str("s")]
    assert decode(encode(Message("k", "a", "b", 0, {"ids": mixed}))).payload["ids"] == [*ids[:5], True, 3, 2.5, "s"]
    for bad in (None, [1], {"a": 1}):
        raw = frame(header([], v={"ids": [*ids[:1000], bad]}))
        with pytest.raises(MessageError, match="not a number, string, bool, null or flat list"):
            decode(raw)
