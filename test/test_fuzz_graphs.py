"""A seeded fuzzer of small op graphs, run forward and backward by kiln and by PyTorch (float32) and compared.

Each program starts from a few leaves built by creation calls (`Tensor.zeros`, `ones`, `full`, `arange`,
`Tensor(array)`), drawn from a small pool so the same call is often made twice: the two results must stay two tensors
(two gradients), however alike their values. Some leaves require grad. The program then applies 3-9 random ops:
elementwise math, broadcasting binary ops, where, reductions, movement ops (reshape, permute, pad, shrink, strided
slices, flip, expand), cat, matmul, detach, realizing an intermediate, and assign into a realized buffer. Every value
no line reads is an output; the loss weights the outputs by fixed values, and every gradient leaf's gradient is
compared (None counts as zeros). A failure prints the program as the Python lines that build it in kiln and in torch.

CI runs a few hundred programs on CPU and PYTHON; `KILN_FUZZ_LONG=1` runs 25x as many, `KILN_FUZZ_SEED=n` shifts the
seeds (to explore new programs): `KILN_FUZZ_LONG=1 python -m pytest test/test_fuzz_graphs.py -q`.
"""
from __future__ import annotations
import os, re
from dataclasses import dataclass, field
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kiln import Tensor, dtypes

LONG = bool(int(os.environ.get("KILN_FUZZ_LONG", "0")))
SEED_OFFSET = int(os.environ.get("KILN_FUZZ_SEED", "0"))
# (device, programs per chunk, chunks): a CPU program compiles its kernels, PYTHON interprets them (cheaper here)
PLAN = [("CPU", 25, 4), ("PYTHON", 50, 4)]
MAX_NUMEL = 96    # larger values make the PYTHON device slow and add nothing the shapes below don't cover
MAX_REPORTED = 3  # failing programs printed per chunk (all are counted)

@dataclass
class Value:
  """A tensor of the program: its variable name (the same in both languages) and its shape."""
  name: str
  shape: tuple[int, ...]

@dataclass
class Program:
  """A program as parallel kiln and torch source lines; the gradients of `grad_leaves` and the values of `outputs`
  (the values no other line reads) are compared."""
  device: str
  kiln_lines: list[str] = field(default_factory=list)
  torch_lines: list[str] = field(default_factory=list)
  values: list[Value] = field(default_factory=list)
  leaves: list[str] = field(default_factory=list)        # every leaf, in order
  grad_leaves: list[str] = field(default_factory=list)   # the leaves that require grad
  outputs: list[str] = field(default_factory=list)
  op_count: int = 0

  def emit(self, kiln_expr: str, torch_expr: str, shape: tuple[int, ...]) -> Value:
    """A new variable: `t<n> = <expr>` in both languages."""
    value = Value(f"t{len(self.values)}", tuple(shape))
    self.kiln_lines.append(f"{value.name} = {kiln_expr}")
    self.torch_lines.append(f"{value.name} = {torch_expr}")
    self.values.append(value)
    return value

  def source(self) -> str:
    """Both programs, readable and runnable (numpy as np, kiln's Tensor/dtypes, torch and F in scope)."""
    kiln = "\n".join(["from kiln import Tensor, dtypes", "import numpy as np"] + self.kiln_lines)
    torch_src = "\n".join(["import torch, torch.nn.functional as F", "import numpy as np"] + self.torch_lines)
    return f"# kiln, device {self.device}\n{kiln}\n# torch reference\n{torch_src}"

# ---------------- leaves: a small pool of creation calls, so the same call recurs ----------------
def array_literal(rng: np.random.Generator, shape: tuple[int, ...]) -> str:
  """A float32 array of multiples of 0.25 in [-2, 2] (exact in float32), written as a NumPy literal."""
  values = (rng.integers(-8, 9, shape) * 0.25).astype(np.float32)
  return f"np.array({values.tolist()!r}, dtype=np.float32)"

def creation_pool(rng: np.random.Generator) -> list[tuple[str, str, tuple[int, ...]]]:
  """Creation calls as (kiln call format, torch call format, shape); `{opts}` takes requires_grad and device."""
  pool = []
  for shape in [(3, 4), (4,), (3, 1), (2, 3, 4), (1, 4)]:
    dims = ", ".join(map(str, shape))
    pool += [(f"Tensor.zeros({dims}{{opts}})", f"torch.zeros({dims}{{opts}})", shape),
             (f"Tensor.ones({dims}{{opts}})", f"torch.ones({dims}{{opts}})", shape),
             (f"Tensor.full({shape}, 0.5{{opts}})", f"torch.full({shape}, 0.5{{opts}})", shape)]
    literal = array_literal(rng, shape)
    pool.append((f"Tensor({literal}{{opts}})", f"torch.tensor({literal}{{opts}})", shape))
  pool += [("Tensor.arange(-1.5, 1.5, 0.25{opts})", "torch.arange(-1.5, 1.5, 0.25{opts})", (12,)),
           ("Tensor.arange(0.0, 1.0, 0.25{opts})", "torch.arange(0.0, 1.0, 0.25{opts})", (4,))]
  return pool

def add_leaves(program: Program, rng: np.random.Generator) -> None:
  """2-4 leaves from a pool of 4 creation calls (so repeats are common), about half of them requiring grad."""
  pool = creation_pool(rng)
  choices = [pool[i] for i in rng.choice(len(pool), 4, replace=False)]
  picks = [choices[int(rng.integers(len(choices)))] for _ in range(int(rng.integers(2, 5)))]
  needs_grad = [bool(rng.random() < 0.6) for _ in picks]
  if not any(needs_grad): needs_grad[0] = True   # a loss that needs no gradient can't be backpropagated in torch
  for (kiln_call, torch_call, shape), grad in zip(picks, needs_grad):
    grad_opt = ", requires_grad=True" if grad else ""
    value = program.emit(kiln_call.format(opts=f"{grad_opt}, device={program.device!r}"),
                         torch_call.format(opts=grad_opt), shape)
    program.leaves.append(value.name)
    if grad: program.grad_leaves.append(value.name)

# ---------------- ops: each picks operands among the program's values and emits one line ----------------
UNARY = ["-{x}", "{x}.tanh()", "{x}.sigmoid()", "{x}.relu()", "{x}.sin()", "{x}.square()", "({x} * {x} + 1).sqrt()",
         "({x} * {x} + 1).log()", "{x}.tanh().exp()", "{x}.abs()", "({x} * 0.5 - 0.25)", "(2.0 - {x})",
         "({x} * {x} + 0.5).reciprocal()", "{x}.contiguous()"]
BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / ({b} * {b} + 1)", "{a}.maximum({b})"]

def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
  """NumPy's broadcast shape, or None where the shapes don't broadcast."""
  try: return tuple(np.broadcast_shapes(*shapes))
  except ValueError: return None

def pick(program: Program, rng: np.random.Generator, recent: bool = True) -> Value:
  """An operand, biased towards recent values so programs grow deep rather than wide."""
  values = program.values
  if recent and rng.random() < 0.7: return values[-1 - int(rng.integers(min(3, len(values))))]
  return values[int(rng.integers(len(values)))]

def partner(program: Program, rng: np.random.Generator, x: Value) -> Value | None:
  """A second operand that broadcasts with `x` (None if there is none)."""
  fits = [v for v in program.values if broadcast(x.shape, v.shape) is not None]
  return fits[int(rng.integers(len(fits)))] if fits else None

def op_unary(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  template = UNARY[int(rng.integers(len(UNARY)))]
  program.emit(template.format(x=x.name), template.format(x=x.name), x.shape)

def op_binary(program: Program, rng: np.random.Generator) -> None:
  a = pick(program, rng)
  b = partner(program, rng, a)
  shape = broadcast(a.shape, b.shape)
  if shape is None or int(np.prod(shape)) > MAX_NUMEL: return op_unary(program, rng)
  template = BINARY[int(rng.integers(len(BINARY)))]
  if rng.random() < 0.5: a, b = b, a
  program.emit(template.format(a=a.name, b=b.name), template.format(a=a.name, b=b.name), shape)

def op_where(program: Program, rng: np.random.Generator) -> None:
  a, c = pick(program, rng), pick(program, rng, recent=False)
  b, d = partner(program, rng, a), partner(program, rng, c)
  shape = broadcast(a.shape, b.shape, c.shape, d.shape)
  if shape is None or int(np.prod(shape)) > MAX_NUMEL: return op_unary(program, rng)
  program.emit(f"({c.name} > {d.name}).where({a.name}, {b.name})",
               f"torch.where({c.name} > {d.name}, {a.name}, {b.name})", shape)

def op_reduce(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  kind = ["sum", "mean", "max", "min"][int(rng.integers(4))]
  torch_kind = {"max": "amax", "min": "amin"}.get(kind, kind)
  if not x.shape or rng.random() < 0.15:
    program.emit(f"{x.name}.{kind}()", f"{x.name}.{torch_kind}()", ())
    return
  axis = int(rng.integers(-len(x.shape), len(x.shape)))
  keepdim = bool(rng.random() < 0.5)
  shape = list(x.shape)
  if keepdim: shape[axis] = 1
  else: del shape[axis]
  args = f"{axis}, keepdim={keepdim}"
  program.emit(f"{x.name}.{kind}({args})", f"{x.name}.{torch_kind}({args})", tuple(shape))

def op_reshape(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  numel = int(np.prod(x.shape))
  divisors = [d for d in range(1, numel + 1) if numel % d == 0]
  first = divisors[int(rng.integers(len(divisors)))]
  shape = [(numel,), (first, numel // first), (1, numel), (first, 1, numel // first)][int(rng.integers(4))]
  program.emit(f"{x.name}.reshape{shape}", f"{x.name}.reshape{shape}", shape)

def op_permute(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  if len(x.shape) < 2: return op_reshape(program, rng)
  order = tuple(int(i) for i in rng.permutation(len(x.shape)))
  program.emit(f"{x.name}.permute{order}", f"{x.name}.permute{order}", tuple(x.shape[i] for i in order))

def op_pad(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  if not x.shape: return op_reshape(program, rng)
  pairs = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in x.shape)
  shape = tuple(s + before + after for s, (before, after) in zip(x.shape, pairs))
  if int(np.prod(shape)) > MAX_NUMEL: return op_shrink(program, rng)
  flat = tuple(amount for pair in reversed(pairs) for amount in pair)   # torch lists the last axis first
  value = [0.0, 0.0, 1.5][int(rng.integers(3))]
  program.emit(f"{x.name}.pad({pairs}, value={value})", f"F.pad({x.name}, {flat}, value={value})", shape)

def op_shrink(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  if not x.shape: return op_unary(program, rng)
  bounds = []
  for size in x.shape:
    start = int(rng.integers(0, size))
    bounds.append((start, int(rng.integers(start + 1, size + 1))))
  shape = tuple(end - start for start, end in bounds)
  if rng.random() < 0.5:
    slices = ", ".join(f"{start}:{end}" for start, end in bounds)
    program.emit(f"{x.name}.shrink({tuple(bounds)})", f"{x.name}[{slices}]", shape)
    return
  # a strided slice, written the same way in both
  steps = [int(rng.integers(1, 3)) for _ in bounds]
  slices = ", ".join(f"{start}:{end}:{step}" for (start, end), step in zip(bounds, steps))
  shape = tuple(len(range(start, end, step)) for (start, end), step in zip(bounds, steps))
  program.emit(f"{x.name}[{slices}]", f"{x.name}[{slices}]", shape)

def op_flip(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  if not x.shape: return op_unary(program, rng)
  axes = tuple(int(a) for a in rng.choice(len(x.shape), int(rng.integers(1, len(x.shape) + 1)), replace=False))
  program.emit(f"{x.name}.flip({axes})", f"{x.name}.flip({axes})", x.shape)

def op_expand(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  ones = [i for i, s in enumerate(x.shape) if s == 1]
  if ones and rng.random() < 0.7:
    shape = tuple(3 if i in ones else s for i, s in enumerate(x.shape))
    program.emit(f"{x.name}.expand{shape}", f"{x.name}.expand{shape}", shape)
    return
  if 2 * int(np.prod(x.shape)) > MAX_NUMEL: return op_reduce(program, rng)
  shape = (2,) + x.shape
  program.emit(f"{x.name}.reshape{(1,) + x.shape}.expand{shape}", f"{x.name}.reshape{(1,) + x.shape}.expand{shape}",
               shape)

def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
  """The shape of a @ b under NumPy's matmul rules, or None."""
  if not a or not b: return None
  try: return np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32)).shape
  except ValueError: return None

def op_matmul(program: Program, rng: np.random.Generator) -> None:
  a = pick(program, rng)
  fits = [v for v in program.values if matmul_shape(a.shape, v.shape) is not None]
  if fits and rng.random() < 0.7:
    b = fits[int(rng.integers(len(fits)))]
    program.emit(f"{a.name} @ {b.name}", f"{a.name} @ {b.name}", matmul_shape(a.shape, b.shape))
  elif len(a.shape) >= 2:   # a Gram matrix: both operands are one tensor
    shape = a.shape[:-1] + (a.shape[-2],)
    program.emit(f"{a.name} @ {a.name}.transpose(-1, -2)", f"{a.name} @ {a.name}.transpose(-1, -2)", shape)
  elif len(a.shape) == 1:
    program.emit(f"{a.name} @ {a.name}", f"{a.name} @ {a.name}", ())
  else: op_unary(program, rng)

def op_assign(program: Program, rng: np.random.Generator) -> None:
  """Write a value into a realized buffer, after taking a lazy read of the old contents; use both.

  kiln's assign passes no gradient to the assigned value, so the value is detached (in torch too); what is tested is
  the order: the read taken before the assign must see the old contents."""
  x = pick(program, rng)
  buffer = program.emit(f"Tensor.full({x.shape}, 0.75, device={program.device!r}).contiguous().realize()",
                        f"torch.full({x.shape}, 0.75)", x.shape)
  old = program.emit(f"{buffer.name} * 2", f"{buffer.name} * 2", x.shape)
  program.kiln_lines.append(f"{buffer.name}.assign({x.name}.detach())")
  program.torch_lines.append(f"{buffer.name}.copy_({x.name}.detach())")
  program.emit(f"{buffer.name} + {old.name}", f"{buffer.name} + {old.name}", x.shape)

def op_cat(program: Program, rng: np.random.Generator) -> None:
  """Concatenate a value with another of a matching shape, or with a function of itself."""
  x = pick(program, rng)
  if not x.shape: return op_unary(program, rng)
  axis = int(rng.integers(len(x.shape)))
  fits = [v for v in program.values if len(v.shape) == len(x.shape) and v is not x and
          all(a == b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != axis)]
  if fits and rng.random() < 0.7:
    other = fits[int(rng.integers(len(fits)))]
    other_name, other_size = other.name, other.shape[axis]
  else:
    other_name, other_size = f"{x.name}.sin()", x.shape[axis]
  shape = tuple(s + other_size if i == axis else s for i, s in enumerate(x.shape))
  if int(np.prod(shape)) > MAX_NUMEL: return op_reduce(program, rng)
  program.emit(f"{x.name}.cat({other_name}, dim={axis})", f"torch.cat(({x.name}, {other_name}), dim={axis})", shape)

def op_realize(program: Program, rng: np.random.Generator) -> None:
  """Realize an intermediate in kiln (a no-op in torch): gradients must still flow through it to the leaves."""
  x = pick(program, rng)
  if x.name in program.leaves: return op_unary(program, rng)
  program.emit(f"{x.name}.realize()", x.name, x.shape)

def op_detach(program: Program, rng: np.random.Generator) -> None:
  x = pick(program, rng)
  program.emit(f"{x.name}.detach() * 1.5", f"{x.name}.detach() * 1.5", x.shape)

OPS = [(op_unary, 3), (op_binary, 4), (op_where, 1), (op_reduce, 2), (op_reshape, 1), (op_permute, 1), (op_pad, 1),
       (op_shrink, 1), (op_flip, 1), (op_expand, 1), (op_matmul, 1.5), (op_assign, 0.5),
       (op_cat, 0.7), (op_realize, 0.5), (op_detach, 0.3)]
OP_WEIGHTS = np.array([w for _, w in OPS]) / sum(w for _, w in OPS)

def make_program(seed: int, device: str) -> Program:
  """A random program: leaves, 3-9 ops, then an output that combines the last value with the leaves requiring grad
  (so every gradient leaf gets a gradient, and its sharing with another leaf is visible)."""
  rng = np.random.default_rng(seed)
  program = Program(device)
  add_leaves(program, rng)
  for _ in range(int(rng.integers(3, 10))):
    op = OPS[int(rng.choice(len(OPS), p=OP_WEIGHTS))][0]
    op(program, rng)
    program.op_count += 1
  # every value no other line reads is an output, so no op is dead code; each is weighted by fixed values
  read = {name for line in program.kiln_lines for name in re.findall(r"\bt\d+\b", line.split("=", 1)[-1])}
  read |= {name for line in program.kiln_lines if ".assign(" in line for name in re.findall(r"\bt\d+\b", line)}
  unread = [v.name for v in program.values[len(program.leaves):] if v.name not in read]
  program.outputs = unread or [program.values[-1].name]
  weighted = []
  for name in program.outputs:
    shape = next(v.shape for v in program.values if v.name == name)
    weights = f"np.linspace(-1.0, 1.0, {int(np.prod(shape))}, dtype=np.float32).reshape({shape})"
    weighted.append((f"({name} * Tensor({weights}, device={device!r})).sum()",
                     f"({name} * torch.tensor({weights})).sum()"))
  # each gradient leaf also enters the loss on its own, with its own factor: two leaves merged into one would get
  # the sum of both factors
  leaf_terms = [f"{name}.sum() * {i + 2}" for i, name in enumerate(program.grad_leaves)]
  program.kiln_lines.append("loss = " + " + ".join([k for k, _ in weighted] + leaf_terms))
  program.torch_lines.append("loss = " + " + ".join([t for _, t in weighted] + leaf_terms))
  program.kiln_lines.append("loss.backward()")
  program.torch_lines.append("loss.backward()")
  return program

# ---------------- running and comparing ----------------
def compare(got: np.ndarray, want: np.ndarray, what: str, tolerance: float) -> str | None:
  """None if close (relative to the reference's largest magnitude), else a one-line description of the worst element."""
  if got.shape != want.shape: return f"{what}: shape {got.shape} != torch {want.shape}"
  scale = max(1.0, float(np.nanmax(np.abs(want), initial=0.0)))
  diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
  diff = np.where(np.isnan(got) & np.isnan(want), 0.0, diff)
  bad = ~(diff <= tolerance * scale + tolerance * np.abs(want))
  if not bad.any(): return None
  i = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(diff, nan=np.inf), -1))), diff.shape)
  return (f"{what} (shape {got.shape}): {int(bad.sum())} elements off, worst at {tuple(int(v) for v in i)}: "
          f"kiln {got[i]!r}, torch {want[i]!r}")

def run_program(program: Program) -> str | None:
  """Run both versions; None if they agree, else what differs (or kiln's exception)."""
  torch_scope: dict = {"torch": torch, "F": F, "np": np}
  exec("\n".join(program.torch_lines), torch_scope)   # pylint: disable=exec-used
  kiln_scope: dict = {"Tensor": Tensor, "dtypes": dtypes, "np": np}
  try:
    exec("\n".join(program.kiln_lines), kiln_scope)   # pylint: disable=exec-used
    # realize everything together, as a training step would
    grads = [kiln_scope[name].grad for name in program.grad_leaves]
    Tensor.realize_all([kiln_scope[name] for name in program.outputs] + [grad for grad in grads if grad is not None])
    outputs = [(name, kiln_scope[name].numpy(), torch_scope[name].detach().numpy()) for name in program.outputs]
    for name in program.grad_leaves:
      kiln_grad, torch_grad = kiln_scope[name].grad, torch_scope[name].grad
      got = kiln_grad.numpy() if kiln_grad is not None else np.zeros(kiln_scope[name].shape, np.float32)
      want = torch_grad.numpy() if torch_grad is not None else np.zeros(torch_scope[name].shape, np.float32)
      outputs.append((f"grad of {name}", got, want))
  except Exception as error:   # pylint: disable=broad-except  (a crash is a finding like a wrong value)
    return f"kiln raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
  tolerance = 4e-6 * (2 + program.op_count)
  problems = [p for what, got, want in outputs if (p := compare(got, want, what, tolerance)) is not None]
  return "; ".join(problems) if problems else None

# programs of the CI seeds that fail on a listed, not yet fixed bug: (device, seed) -> the test that pins it down
KNOWN_FAILURES: dict[tuple[str, int], str] = {}   # (device, seed) -> the regression test that pins the bug

def run_chunk(device: str, first_seed: int, count: int) -> None:
  """Run `count` programs from `first_seed`; fail listing the first few failing programs' sources (xfail when every
  failure is a known one)."""
  failures = []
  for seed in range(first_seed, first_seed + count):
    program = make_program(seed, device)
    problem = run_program(program)
    if problem is not None: failures.append((seed, problem, program))
  if failures:
    shown = "\n\n".join(f"--- seed {seed}: {problem}\n{program.source()}"
                        for seed, problem, program in failures[:MAX_REPORTED])
    message = f"{len(failures)} of {count} programs on {device} disagree with torch:\n\n{shown}"
    if all((device, seed) in KNOWN_FAILURES for seed, _, _ in failures):
      known = sorted({KNOWN_FAILURES[(device, seed)] for seed, _, _ in failures})
      pytest.xfail(f"known bugs ({', '.join(known)}): {message}")
    pytest.fail(message, pytrace=False)

CHUNKS = [(device, count * (25 if LONG else 1), chunk) for device, count, chunks in PLAN for chunk in range(chunks)]

@pytest.mark.parametrize("device, count, chunk", CHUNKS, ids=[f"{d}-{c}" for d, _, c in CHUNKS])
def test_fuzz_graphs(device: str, count: int, chunk: int):
  """Random programs agree with torch, forward and backward."""
  run_chunk(device, SEED_OFFSET + 100_000 * chunk + (0 if device == "CPU" else 50_000), count)

def test_program_source_is_a_repro():
  """A printed program runs as is and builds the same graph (the repro a failure prints must be usable)."""
  program = make_program(3, "PYTHON")
  source = program.source()
  kiln_part = source.split("# torch reference")[0]
  scope: dict = {}
  exec(kiln_part, scope)   # pylint: disable=exec-used
  for name in program.outputs:
    assert tuple(scope[name].shape) == next(v.shape for v in program.values if v.name == name)

def test_gradient_after_a_realized_assign_reads_the_old_values():
  """y = (buf + old) * w with old = buf * 2 taken before buf.assign(...): realizing buf + old elsewhere must not change
  y's gradient (w's gradient is buf + old = 1 + 1.5 = 2.5, as torch)."""
  w = Tensor.ones(4, requires_grad=True)
  buf = Tensor.full((4,), 0.75).contiguous().realize()
  old = buf * 2
  buf.assign(Tensor.ones(4))
  y = (buf + old) * w
  (buf + old).sum().realize()
  y.sum().backward()
  np.testing.assert_allclose(y.numpy(), np.full(4, 2.5))
  np.testing.assert_allclose(w.grad.numpy(), np.full(4, 2.5))
