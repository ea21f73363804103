"""Kernel AST -> linear uops: lowering movement ops to index arithmetic, then linearizing loops."""
