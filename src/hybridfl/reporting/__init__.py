"""A run's results files (:mod:`hybridfl.reporting.results`: ``results.json``, ``metrics.csv``)
and plots (:mod:`hybridfl.reporting.plots`: accuracy vs round, partition coverage)."""
