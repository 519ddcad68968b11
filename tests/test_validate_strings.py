"""``validate.strings``: a list of strings from an untrusted message, checked whole (long lists of
sample IDs by their types' set at C speed, anything else item by item)."""

import pytest

from hybridfl.runtime import validate
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError


class _Str(str):
    pass


def _msg(v):
    return Message("k", "a", "b", 0, {"ids": v})


def test_a_long_list_of_strings_is_accepted_and_one_bad_item_anywhere_refused():
    ids = [f"id-{i}" for i in range(100_000)]
    assert validate.strings(_msg(ids), "ids") == ids
    assert validate.strings(_msg([*ids[:3], _Str("x")]), "ids") == [*ids[:3], "x"]  # a str subclass is a string
    for bad in (True, 1, b"x", None, ["a"]):
        with pytest.raises(PayloadError, match="not a list of strings"):
            validate.strings(_msg([*ids[:60_000], bad, *ids[60_000:]]), "ids")
    with pytest.raises(PayloadError, match="not a list of strings"):
        validate.strings(_msg(tuple(ids[:3])), "ids")
    with pytest.raises(PayloadError, match="repeated value"):
        validate.strings(_msg([*ids, ids[5]]), "ids")


def test_allowed_values():
    assert validate.strings(_msg(["b", "a"]), "ids", allowed=["a", "b", "c"]) == ["b", "a"]
    with pytest.raises(PayloadError, match="unknown value 'd'"):
        validate.strings(_msg(["a", "d", "e"]), "ids", allowed=("a", "b"))
