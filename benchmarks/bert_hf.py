"""`tzoo bench bert`: see :mod:`transformer_zoo.bench.bert_hf` for what it measures and its options."""

from transformer_zoo.bench.bert_hf import main

if __name__ == "__main__":
    main()
