"""Algorithms, each written once as client-side and server-side steps exchanging messages.

Every algorithm is a package whose files name its parts (``config``, ``client``, ``server``,
``spec``) and registers one :class:`~hybridfl.algorithms.spec.AlgorithmSpec`, the only way it is
built, by the simulation and by Flower alike: ``hyfem``, ``hyfdca``, ``fedbcd``, ``hybrid_fedavg``
and the (not federated) ``centralized`` solver. See ``docs/architecture.md``.
"""
