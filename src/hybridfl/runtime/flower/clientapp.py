"""The Flower ClientApp of hybridfl (``hybridfl.runtime.flower.clientapp:app``).

Handles ``query.hybridfl`` messages: unwraps our encoded message, answers it with
:func:`hybridfl.runtime.flower.node.client_step` as the client whose exported directory is the
node config ``data-dir``, and keeps the client's state in ``context.state`` (which stays on the
node) between messages.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from hybridfl.runtime.flower.bridge import pack, unpack

STATE = "hybridfl.state"
app = ClientApp()


class _StateStore(MutableMapping[str, bytes]):
    """``context.state[STATE]`` (a ConfigRecord of bytes) as a mutable mapping."""

    def __init__(self, context: Context):
        if STATE not in context.state:
            context.state[STATE] = ConfigRecord()
        self.rec = context.state[STATE]

    def __getitem__(self, k: str) -> bytes:
        return self.rec[k]  # type: ignore[return-value]

    def __setitem__(self, k: str, v: bytes) -> None:
        self.rec[k] = v

    def __delitem__(self, k: str) -> None:
        del self.rec[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self.rec)

    def __len__(self) -> int:
        return len(self.rec)


@app.query("hybridfl")
def query(msg: Message, context: Context) -> Message:
    from hybridfl.runtime.flower.node import client_step

    data_dir = context.node_config.get("data-dir")
    raw = client_step(unpack(msg.content), str(data_dir) if data_dir else None, _StateStore(context))
    return Message(pack(raw), reply_to=msg)
