"""Fails on import, as a plugin with a missing dependency would."""

import a_dependency_that_is_not_installed  # noqa: F401
