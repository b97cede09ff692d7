"""`tzoo bench robustness`: see :mod:`transformer_zoo.bench.robustness` for what it tries and its options."""

from transformer_zoo.bench.robustness import main

if __name__ == "__main__":
    main()
