"""``python -m hybridflow ...`` is the ``hybridflow`` command."""

import sys

from hybridflow.cli import main

sys.exit(main())
