"""Groups of Tensor methods, one module per family; kiln.tensor.Tensor inherits them all.

Instance methods build new tensors through `self` (`self._wrap(uop)`, `type(self)(data)`, `self.arange(...)`), so no
module here imports kiln.tensor at load time.
"""
