"""`tzoo bench contention`: see :mod:`transformer_zoo.bench.contention` for what it measures and its options."""

from transformer_zoo.bench.contention import main

if __name__ == "__main__":
    main()
