"""`tzoo bench decoding`: see :mod:`transformer_zoo.bench.decoding` for what it measures and its options."""

from transformer_zoo.bench.decoding import main

if __name__ == "__main__":
    main()
