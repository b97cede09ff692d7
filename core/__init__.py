"""The core: the interfaces and building blocks every family composes.

What lives here: the options models and their validation (:mod:`.options`), the attention module
and the kernels more than one family uses (:mod:`.attention`, :mod:`.local_attention`), positions,
norms, feed-forwards, stacks and heads, the base :class:`~.model.EncoderDecoder` and its config,
masks, decoding, the task contract (:mod:`.tasks`), weights on disk (:mod:`.weights`) and errors.

What it may import: nothing else of the package. The registry, the plugins, training and
comparing build on it; a kernel that one family alone uses lives beside that family's plugin.
"""
