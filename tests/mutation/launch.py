"""``python -m tests.mutation.launch ARGS``: the demo (``python -m examples.tweets
ARGS``) with the bugs named by ``PLANTED`` planted in it; how ``tests.processes`` starts
a demo process in a planted run."""

from __future__ import annotations

import os
import sys

from examples.tweets.cli import main as demo
from tests.mutation import PLANTED
from tests.mutation.bugs import planted

if __name__ == "__main__":
    with planted(os.environ[PLANTED]):
        code = demo(sys.argv[1:])
    sys.exit(code)
