"""`python -m lmperf <cell> [args…]`: run one cell (lmperf.core.runner)."""

import sys

from lmperf.core.runner import main

sys.exit(main())
