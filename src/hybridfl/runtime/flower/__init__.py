"""hybridfl on Flower: the same algorithm code across real processes and machines.

- :mod:`.bridge`: our encoded messages inside Flower messages; :class:`FlowerTransport`.
- :mod:`.node`: the client step and the server run, independent of Flower's process machinery;
  both build the algorithm only through its :class:`~hybridfl.algorithms.spec.AlgorithmSpec` and
  run the simulation's :class:`~hybridfl.runtime.loop.RoundLoop`.
- :mod:`.serverapp` / :mod:`.clientapp`: the Flower ServerApp and ClientApp.
- :mod:`.executor`: the warm ClientApp executor: answers every message of a SuperNode
  (``--isolation process``) keeping the client object in memory, instead of a new ClientApp process
  per message; in the SuperNode's own process (``supernode --inline``, the default) or as a
  long-lived process next to it (``hybridfl flower-executor``, ``supernode --warm``).
- :mod:`.local`: start a SuperLink and SuperNodes on 127.0.0.1 (tests, benchmarks, ``hybridfl``
  ``deploy-local``); :mod:`.supernode`: a SuperNode with a shorter, backing-off poll interval
  (``--inline`` or ``--warm``: with the warm executor).

The Flower app directory (its ``pyproject.toml``) is :data:`APP_DIR`.
"""

from pathlib import Path

APP_DIR = Path(__file__).resolve().parent / "app"
