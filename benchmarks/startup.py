"""`tzoo bench startup`: see :mod:`transformer_zoo.bench.startup` for what it measures and its options."""

from transformer_zoo.bench.startup import main

if __name__ == "__main__":
    main()
