"""``python -m app.cli``: the ``arbiter`` command."""

import sys

from app.cli import main

sys.exit(main())
