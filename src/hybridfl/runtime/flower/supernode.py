"""``python -m hybridfl.runtime.flower.supernode [--poll-interval S] <flower-supernode args>``.

Flower 1.41's SuperNode sleeps a fixed 3 s whenever a pull from the SuperLink finds no message
(``flwr/supernode/start_client_internal.py``) and waits 0.5 s between checks for the ClientApp's
reply; there is no option for either. This launcher runs the stock ``flower-supernode`` with those
two sleeps capped at ``--poll-interval`` seconds (default 0.05) and sets
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (Flower's own setting, default 1 s) for the SuperExec that
starts the ClientApp processes. Nothing else changes: same protocol, same processes. It polls the
SuperLink more often, which costs one small request per interval per node.
"""

from __future__ import annotations

import os
import sys
import time as _time


class _FastTime:
    """The ``time`` module with ``sleep`` capped at ``cap`` seconds."""

    def __init__(self, cap: float):
        self.cap = cap

    def sleep(self, s: float) -> None:
        _time.sleep(min(float(s), self.cap))

    def __getattr__(self, name: str):
        return getattr(_time, name)


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-supernode`` with ``argv`` (default ``sys.argv[1:]``) minus ``--poll-interval S``,
    its idle sleeps capped at ``S`` seconds (default 0.05).

    Raises:
        SystemExit: ``--poll-interval`` is outside ``[0.001, 3]`` seconds.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    cap = 0.05
    if "--poll-interval" in args:
        i = args.index("--poll-interval")
        cap = float(args[i + 1])
        del args[i : i + 2]
    if not 0.001 <= cap <= 3.0:
        raise SystemExit(f"--poll-interval must be between 0.001 and 3 seconds, got {cap}.")
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", str(max(cap, 0.01)))
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    import flwr.supernode.start_client_internal as sci
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sci.time = _FastTime(cap)  # type: ignore[assignment]
    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":
    main()
