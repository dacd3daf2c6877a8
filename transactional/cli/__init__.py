"""The ``transactional`` command's commands: run a topology, look at a topology's state
(its grammar and usage: ``transactional.cli._parser``). Settings come from a ``--config``
TOML file, ``TRANSACTIONAL_*`` variables and flags, each overriding the one before
(``transactional.cli.settings``); only this edge reads the environment.

The package is the command line's edge, and no library module imports it. Public:
``main`` (the ``transactional`` command), ``settings`` (every setting declared once:
flag, ``TRANSACTIONAL_*`` variable, config key), ``progress`` (the live line of a run),
``interrupt`` (a first signal stops a run cleanly) and ``logs`` (the commands' logging),
which the demo's own command line is built from. The rest is underscored: the parser,
the factories a ``module:function`` names, and the ``status``, ``query`` and ``rewind``
views.
"""

from transactional.cli._commands import main

__all__ = ["main"]
