"""`tzoo bench throughput`: see :mod:`transformer_zoo.bench.throughput` for what it measures and its options."""

from transformer_zoo.bench.throughput import main

if __name__ == "__main__":
    main()
