"""`python -m toolserver`: the same as the `toolserver` command."""

import sys

from toolserver.cli import main

sys.exit(main())
