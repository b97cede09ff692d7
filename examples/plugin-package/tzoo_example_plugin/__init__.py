"""An example transformer-zoo plugin: cosine and linear attention, and a variant that uses cosine attention.

The hooks live in :mod:`tzoo_example_plugin.plugin`, which the package's ``transformer_zoo``
entry point names; transformer-zoo imports it on first use.
"""
