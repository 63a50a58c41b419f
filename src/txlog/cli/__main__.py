"""``python -m txlog.cli``: the ``txlog`` command."""

import sys

from .main import main

sys.exit(main())
