"""A plugin package whose plugin module fails to import."""
