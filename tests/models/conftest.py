"""Fixtures for the model tests."""

from __future__ import annotations

import pytest
import torch
from models.model_test_utils import padded_batch


@pytest.fixture
def batch() -> torch.Tensor:
    return padded_batch(6, 10)
