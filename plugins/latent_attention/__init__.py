"""(being written)"""

from transformer_zoo.registry import hookimpl


@hookimpl
def tzoo_components():
    return []
