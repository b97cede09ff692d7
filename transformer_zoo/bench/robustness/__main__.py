"""``python -m transformer_zoo.bench.robustness``: the audit, as ``tzoo bench robustness``."""

from . import main

main()
