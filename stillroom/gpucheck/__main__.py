"""``python -m stillroom.gpucheck``: the GPU check (harness.py)."""

import sys

from .harness import main

sys.exit(main())
