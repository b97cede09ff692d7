"""`tzoo bench ut-act`: see :mod:`transformer_zoo.bench.ut_act` for what it measures and its options."""

from transformer_zoo.bench.ut_act import main

if __name__ == "__main__":
    main()
