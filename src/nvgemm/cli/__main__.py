"""``python -m nvgemm.cli``: the ``nvgemm`` command."""

import sys

from nvgemm.cli import main

sys.exit(main())
