"""The core: the interfaces and building blocks every family composes.

What lives here: the options models and configs (:mod:`.options`, validated by
:mod:`.validation`; the base config and the builders it unpacks into, :mod:`.config`), the inputs and positions
(:mod:`.embedding`, :mod:`.relative`), attention and its kernels (:mod:`.attention`,
:mod:`.local_attention`), layers and stacks (:mod:`.layers`, :mod:`.recurrent`, :mod:`.moe`),
the base :class:`~.model.EncoderDecoder`, its heads and its output (:mod:`.model`, :mod:`.heads`, :mod:`.output`), decoding
and its caches (:mod:`.decoding`, :mod:`.cache`), the task contract (:mod:`.tasks`), folders on
disk (:mod:`.weights`, :mod:`.hf`) and errors.

What it may import: nothing else of the package. The registry, the plugins, training and
comparing build on it; a kernel that one family alone uses lives beside that family's plugin.
"""
