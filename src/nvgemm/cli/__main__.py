"""``python -m nvgemm.cli``: the ``nvgemm`` command."""

import sys

from . import main

sys.exit(main())
