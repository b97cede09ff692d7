"""Built-in plugins: one subpackage per family (transformer, bert, universal_transformer,
local_global, image), the generic components every family composes (components), kinds usable in
any family (relative: T5's and Shaw et al.'s relative positions; talking_heads; efficient: linear,
Performer and Linformer attention) and the tasks (tasks).

They are loaded exactly as third-party plugins are: through the hooks of
:mod:`transformer_zoo.registry.hookspecs`. What they may import: :mod:`transformer_zoo.core`,
the registry's ``hookimpl`` and the public :mod:`transformer_zoo.api`, as any third-party plugin
may; never training, comparing or the command line.
"""
