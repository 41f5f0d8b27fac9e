"""``python -m treemail``: the same as the ``treemail`` command."""

import sys

from treemail.entrypoints.cli import main

sys.exit(main())
