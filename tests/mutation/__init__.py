"""Planted bugs: the evidence shown to fail.

Each bug of ``tests.mutation.bugs`` is a plausible protocol bug, planted only from the
tests: ``planted(name)`` patches the product in the running process, and nothing in
the product knows of it. A planted run is pytest with this package's plugin
(``-p tests.mutation.plugin --plant NAME``): the bug is in the pytest process, and in
every demo process a test starts, which ``tests.processes`` then runs through
``python -m tests.mutation.launch`` (the name travels in ``PLANTED``). ``python -m
tests.mutation`` (``make mutation``) runs each bug against its tests and writes
``tests/MUTATION.md``: which test caught it, after how many demo runs and kills.
"""

#: The environment variable naming the bug planted in a test run's demo processes.
PLANTED = "TESTS_PLANTED_BUG"
