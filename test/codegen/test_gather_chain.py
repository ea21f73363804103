"""Two tensor-index lookups in a row (`x[:, Tensor(i)][:, :, Tensor(j)]`, a nearest resize of both axes): the second
lookup's negative-index wrap reaches the kernel as a vector compare against a vector constant once the index loads
are upcast, and the value-range analysis took that constant's tuple for a number."""
import numpy as np
import pytest
from kiln import Tensor

def test_two_tensor_index_lookups_in_a_row_match_numpy():
  x = np.random.default_rng(0).standard_normal((1, 96, 6, 6)).astype(np.float32)
  rows, cols = np.array([0, 1, 1, 2, 3, 3, 4, 5, 5]), np.array([0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5, 5, 5])
  got = Tensor(x)[:, :, Tensor(rows)][:, :, :, Tensor(cols)].numpy()
  np.testing.assert_array_equal(got, x[:, :, rows][:, :, :, cols])
