"""`tzoo bench dense-threshold`: see :mod:`transformer_zoo.bench.dense_threshold` for what it measures and its options."""

from transformer_zoo.bench.dense_threshold import main

if __name__ == "__main__":
    main()
