"""`tzoo bench mfu`: see :mod:`transformer_zoo.bench.mfu` for what it measures and its options."""

from transformer_zoo.bench.mfu import main

if __name__ == "__main__":
    main()
