"""kiln: a small deep-learning framework and tensor compiler with tinygrad's API."""
from kiln.tensor import Tensor  # noqa: F401
from kiln.dtype import dtypes, DType  # noqa: F401
from kiln.device import Device  # noqa: F401
from kiln.helpers import Context, getenv, GlobalCounters, fetch  # noqa: F401
from kiln.uop.ops import UOp, Variable  # noqa: F401
from kiln.engine.jit import TinyJit  # noqa: F401
from kiln import nn  # noqa: F401
