"""An example transformer-zoo plugin: cosine attention and a variant that uses it."""
