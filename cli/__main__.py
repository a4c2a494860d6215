"""`python -m cli …` is the `forgeflow` command."""

import sys

from cli.main import main

sys.exit(main())
