"""The IR: Ops, UOp, patterns and rewrites, symbolic simplification, specs."""
from kiln.uop.ops import Ops, UOp, GroupOp, Variable  # noqa: F401
from kiln.uop.pattern import UPat, PatternMatcher, graph_rewrite  # noqa: F401
