"""The ``hybridfl`` command line: :mod:`hybridfl.cli.main` (``run``, ``partition``,
``algorithms``) and :mod:`hybridfl.cli.deploy` (``export-clients``, ``he-keys``, ``flower-app``, ``deploy-local``)."""
