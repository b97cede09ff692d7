"""`tzoo bench transformer`: see :mod:`transformer_zoo.bench.transformer_step` for what it measures and its options."""

from transformer_zoo.bench.transformer_step import main

if __name__ == "__main__":
    main()
