"""``python -m somatile.eval --write-results RESULTS_MD EVAL_DIR`` or ``--merge OUT_DIR PART_DIR...``."""

import sys

from somatile.eval.cli import main

sys.exit(main())
