"""Handler tables: a client answers a message with the step its kind names in a table, never
through a fall-through branch.

Each algorithm defines its message kinds once as constants in its ``kinds`` module (client and
server both import them) and its client keeps a table ``{KIND: method}``; :func:`dispatch` looks
the kind up and refuses an unknown one in one sentence. A client takes messages from the server
only (:data:`~hybridfl.runtime.messages.SERVER`): one naming another sender is refused too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import SERVER, Message

Handler = Callable[[Message], Message]
"""One step of a client: a server message in, its reply out."""

Step = TypeVar("Step")


def handler(
    table: Mapping[str, Handler], msg: Message, who: str, wording: str = "a message of unknown kind"
) -> Handler:
    """The step of ``table`` for ``msg.kind``.

    Args:
        table: message kind -> step (a :data:`Handler`, or whatever an algorithm calls with the message).
        msg: the (decoded) message; its ``kind`` is a string (:func:`~hybridfl.runtime.messages.decode`).
        who: the receiver, as the refusal names it (e.g. ``"FedBCD party 'a'"``).
        wording: how the refusal names the kind after ``got`` (kept per algorithm so its
            sentence stays the one it always was).

    Raises:
        ProtocolError: ``msg.sender`` is not the server, or ``msg.kind`` is not in ``table``
            ("<who> got <wording> '<kind>'.").
    """
    if msg.sender != SERVER:
        raise ProtocolError(f"{who} refuses a message from {msg.sender!r}, which is not the server.")
    step = table.get(msg.kind) if isinstance(msg.kind, str) else None
    if step is None:
        raise ProtocolError(f"{who} got {wording} {msg.kind!r}.")
    return step


def dispatch(
    table: Mapping[str, Handler], msg: Message, who: str, wording: str = "a message of unknown kind"
) -> Message:
    """Answer ``msg`` with the step of ``table`` for its kind (:func:`handler`).

    Raises:
        ProtocolError: a sender other than the server or an unknown kind (one sentence naming
            it), or whatever the step raises.
    """
    return handler(table, msg, who, wording)(msg)
