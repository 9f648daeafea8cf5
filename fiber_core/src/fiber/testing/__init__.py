"""Test helpers that fiber ships for backend authors (see :mod:`fiber.testing.contract`)."""
