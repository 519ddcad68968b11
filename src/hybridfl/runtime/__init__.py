"""Runtime: messages and their codec, transports, the communication log, the simulation."""

from hybridfl.runtime.messages import Message, decode, encode
from hybridfl.runtime.transport import CommLog, InProcessTransport, Transport

__all__ = ["CommLog", "InProcessTransport", "Message", "Transport", "decode", "encode"]
