"""Shared test fixtures."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A seeded generator: every random test is reproducible from its seed."""
    return np.random.default_rng(20261129)
