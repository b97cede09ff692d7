"""``python -m benchmarks [NAME [ARGS]]``: ``tzoo bench`` from a checkout's root."""

import sys

from . import BENCHMARKS, run

if len(sys.argv) < 2:
    for name, bench in BENCHMARKS.items():
        print(f"{name:18} {bench.measures} ({bench.takes})")
else:
    run(sys.argv[1], sys.argv[2:])
