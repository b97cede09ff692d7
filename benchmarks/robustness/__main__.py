"""``python -m benchmarks.robustness``: the audit, as ``tzoo bench robustness``."""

from . import main

main()
