"""Built-in plugins: one subpackage per family, plus the generic components.

They are loaded exactly as third-party plugins are: through the hooks of
:mod:`transformer_zoo.registry.hookspecs`.
"""
