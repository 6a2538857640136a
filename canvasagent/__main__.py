import sys

from canvasagent.cli import main

sys.exit(main())
