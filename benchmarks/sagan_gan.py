"""`tzoo bench sagan-gan`: see :mod:`transformer_zoo.bench.sagan_gan` for what it measures and its options."""

from transformer_zoo.bench.sagan_gan import main

if __name__ == "__main__":
    main()
