"""Environments of other ecosystems served as ORS environments, unchanged.

Each module is an adapter with an extra of its own (``pip install
'.[reasoning-gym]'``, ``'.[openenv]'`` in the checkout), named by ``ors-grpc
serve`` through the ``ors_grpc.environment_sources`` entry points
(``reasoning-gym:leg_counting``, ``openenv:pkg.module:Class``); the rest of
``ors_grpc`` never imports them. docs/ecosystems.md says what maps to what."""
