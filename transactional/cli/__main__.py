"""``python -m transactional.cli``: the ``transactional`` command."""

import sys

from transactional.cli import main

sys.exit(main())
