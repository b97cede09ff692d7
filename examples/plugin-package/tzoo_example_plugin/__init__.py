"""An example transformer-zoo plugin: cosine attention and a variant that uses it.

The hooks live in :mod:`tzoo_example_plugin.plugin`, which the package's ``transformer_zoo``
entry point names; transformer-zoo imports it on first use.
"""
