"""Tests against the built image (a package, so its conftest does not shadow
tests/unit/conftest)."""
