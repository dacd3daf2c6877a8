"""``python -m examples.tweets``."""

import sys

from examples.tweets.cli import main

sys.exit(main())
