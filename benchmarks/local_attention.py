"""`tzoo bench attention-kernels`: see :mod:`transformer_zoo.bench.local_attention` for what it measures and its options."""

from transformer_zoo.bench.local_attention import main

if __name__ == "__main__":
    main()
