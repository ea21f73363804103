#!/usr/bin/env python3
"""Write docs/tensor.md: every public Tensor method, grouped as in SYSTEM.md §1, with its one-line description and
the first example of its docstring.

  python tools/gen_tensor_docs.py          # rewrite docs/tensor.md
  python tools/gen_tensor_docs.py --check  # exit 1 if docs/tensor.md is out of date or a method has no group

The groups below are the only hand-written part: a new public method must be added to one of them (the check fails
until it is), and a name listed here that Tensor lacks fails the check too.
"""
from __future__ import annotations
import argparse, doctest, functools, inspect, pathlib, sys

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
TENSOR_DOCS = REPO_ROOT / "docs" / "tensor.md"

GROUPS: dict[str, str] = {
  "Creation": """empty zeros ones full full_like zeros_like ones_like const_like arange linspace eye rand randn randint
    normal uniform scaled_uniform glorot_uniform kaiming_uniform kaiming_normal randperm multinomial rand_like randn_like
    manual_seed from_blob from_url""",
  "Properties and conversion": """uop shape dtype device ndim size numel element_size nbytes is_floating_point
    requires_grad requires_grad_ grad T realize realize_all contiguous contiguous_backward detach clone numpy item
    tolist data to to_ shard shard_ cast bitcast float half int bool bfloat16 double long short assign replace schedule kernelize
    fuse""",
  "Movement": """reshape view expand permute flip shrink pad squeeze unsqueeze flatten unflatten transpose repeat
    repeat_interleave roll split chunk cat stack meshgrid diag diagonal tril triu unfold rearrange""",
  "Indexing": """__getitem__ __setitem__ gather scatter scatter_reduce masked_fill masked_select nonzero where""",
  "Arithmetic, comparison and bitwise": """add sub mul div idiv floordiv mod pow maximum minimum neg eq ne
    bitwise_and bitwise_or bitwise_xor bitwise_not logical_not lshift rshift""",
  "Elementwise math": """reciprocal sqrt rsqrt exp exp2 log log2 sin cos tan asin acos atan sinh cosh tanh asinh acosh
    atanh erf abs sign trunc ceil floor round isinf isnan isfinite isclose lerp clamp clip square copysign""",
  "Activations": """relu relu6 leaky_relu elu celu selu gelu quick_gelu silu swish mish softplus softsign hardswish
    hardsigmoid hardtanh sigmoid logsigmoid""",
  "Reductions": """sum prod max min mean var std var_mean std_mean argmax argmin any all logsumexp cumsum cumprod cummax
    logcumsumexp softmax log_softmax""",
  "Linear algebra and nn functional": """dot matmul einsum linear sequential conv2d conv_transpose2d avg_pool2d
    max_pool2d max_unpool2d interpolate batchnorm layernorm dropout one_hot scaled_dot_product_attention
    binary_crossentropy binary_crossentropy_logits sparse_categorical_crossentropy cross_entropy nll_loss sort topk
    argsort qr svd newton_schulz""",
  "Bytes": """keccak hash""",
  "Autograd": """backward gradient train test training""",
}
OPERATORS = ("`+ - * / // % **` (`add sub mul div floordiv mod pow`), `== != < > <= >=`, `& | ^ ~ << >>`, `@` "
             "(`matmul`); `+= -= *= /=` assign in place.")

@functools.cache
def public_names() -> frozenset[str]:
  """Every public attribute of Tensor (dunders other than item access excluded)."""
  from kiln import Tensor
  return frozenset({name for name in dir(Tensor) if not name.startswith("_")} | {"__getitem__", "__setitem__"} & set(dir(Tensor)))

def grouped_names() -> dict[str, list[str]]:
  return {group: names.split() for group, names in GROUPS.items()}

def problems() -> list[str]:
  """Public methods no group lists, and listed names Tensor does not have."""
  listed = [name for names in grouped_names().values() for name in names]
  public = public_names()
  out = [f"Tensor.{name} is public but not in any group of tools/gen_tensor_docs.py" for name in sorted(public - set(listed))]
  out += [f"{name} is listed in tools/gen_tensor_docs.py but Tensor has no such attribute"
          for name in listed if name not in public]
  out += [f"{name} is listed twice" for name in sorted({n for n in listed if listed.count(n) > 1})]
  return out

def describe(name: str) -> tuple[str, str]:
  """(one-line description, first docstring example as text) of Tensor.<name>."""
  from kiln import Tensor
  attr = inspect.getattr_static(Tensor, name)
  target = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
  doc = inspect.getdoc(target) if callable(target) or isinstance(attr, property) else None
  if not doc: return "", ""
  summary = doc.strip().split("\n\n")[0].replace("\n", " ")
  examples = doctest.DocTestParser().get_examples(doc)
  example = "" if not examples else f">>> {examples[0].source.strip()}" + (f"\n{examples[0].want.rstrip()}" if examples[0].want else "")
  return summary, example

def signature(name: str) -> str:
  from kiln import Tensor
  attr = inspect.getattr_static(Tensor, name)
  if isinstance(attr, property) or not callable(getattr(Tensor, name)): return name
  try: params = list(inspect.signature(getattr(attr, "__func__", attr)).parameters.values())
  except (TypeError, ValueError): return name
  parts = [p.replace(annotation=inspect.Parameter.empty) for p in params if p.name not in ("self", "cls")]
  sig = str(inspect.Signature(parts))
  shown = {"__getitem__": "t[index]", "__setitem__": "t[index] = value"}
  return shown.get(name, f"{name}{sig}")

def generate() -> str:
  """The text of docs/tensor.md."""
  sys.path.insert(0, str(REPO_ROOT))
  lines = ["# Tensor API", "",
           "Every public `Tensor` method, grouped as in SYSTEM.md §1. Generated from the docstrings by",
           "`python tools/gen_tensor_docs.py`; a test keeps it current. Everything is lazy: a method builds graph and",
           "work happens at `realize()`, `numpy()`, `item()`, `tolist()` or `data()`. Methods marked *synchronizes*",
           "need the data to know their result's size and realize their input first.", "",
           f"Operators: {OPERATORS}", ""]
  for group, names in grouped_names().items():
    lines += [f"## {group}", ""]
    for name in (n for n in names if n in public_names()):
      summary, example = describe(name)
      lines.append(f"- `{signature(name)}`: {summary or '(no description)'}")
      if example: lines += ["  ```python", *("  " + line for line in example.splitlines()), "  ```"]
    lines.append("")
  return "\n".join(lines)

def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="exit 1 if docs/tensor.md is stale or incomplete")
  args = parser.parse_args()
  text = generate()
  issues = problems()
  for issue in issues: print(f"gen_tensor_docs: {issue}", file=sys.stderr)
  if args.check:
    stale = (TENSOR_DOCS.read_text() if TENSOR_DOCS.exists() else "") != text
    if stale: print(f"{TENSOR_DOCS.relative_to(REPO_ROOT)} is out of date: run python tools/gen_tensor_docs.py", file=sys.stderr)
    return 1 if stale or issues else 0
  TENSOR_DOCS.write_text(text)
  print(f"wrote {TENSOR_DOCS.relative_to(REPO_ROOT)}")
  return 1 if issues else 0

if __name__ == "__main__":
  sys.exit(main())
