"""The PTX renderer's fp8 helpers (kiln/renderer/ptx.py `fp8_to_f`, `fp8_bits`) without a GPU: the straight-line
PTX each emits is run by a small evaluator of the instructions they use (bit-exact integer ops, float32 products by
numpy) and must give kiln's fp8 rules (kiln/dtype.py fp8_bits, FP8_VALUES) on every byte and on a sweep of doubles:
ties both ways, neighbours of ties, subnormals, overflow, infinities, NaN and signed zeros. On a GPU,
test_ptx_render.py compares the kernels' bits with the CUDA C renderer's."""
from __future__ import annotations
import math, re, struct
import numpy as np
import pytest
from kiln.dtype import dtypes, fp8_bits, FP8_VALUES
from kiln.renderer.ptx import _PTXKernelWriter

def _f32(bits: int) -> float: return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
def _bits32(x: float) -> int: return struct.unpack("<I", struct.pack("<f", x))[0]
def _f64_bits(x: float) -> int: return struct.unpack("<Q", struct.pack("<d", x))[0]

def run(lines: list[str], registers: dict[str, int]) -> dict[str, int]:
  """Evaluate PTX instructions over `registers` (name -> raw bits; predicates 0/1); returns the registers."""
  regs = dict(registers)
  def value(text: str, width: int) -> int:
    text = text.strip()
    if text.startswith("%"): return regs[text]
    if text.startswith("0f"): return int(text[2:], 16)
    if text.startswith("0d"): return int(text[2:], 16)
    return int(text, 0) & ((1 << width) - 1)
  def signed(x: int, width: int) -> int: return x - (1 << width) if x >> (width - 1) & 1 else x
  for line in lines:
    code = line.split("//")[0].strip().rstrip(";")
    guard = None
    if code.startswith("@"):
      guard, code = code.split(" ", 1)
      if not regs[guard[1:]]: continue
    op, _, args = code.partition(" ")
    args = [a.strip() for a in args.split(",")]
    parts = op.split(".")
    name, kind = parts[0], parts[-1]
    width = int(re.sub(r"\D", "", kind) or 32) if kind not in ("pred",) else 1
    mask = (1 << width) - 1
    dst, srcs = args[0], args[1:]
    if name == "mov": regs[dst] = value(srcs[0], width)
    elif name in ("and", "or") and kind == "pred":
      a, b = regs[srcs[0]], regs[srcs[1]]
      regs[dst] = (a and b) if name == "and" else (a or b)
    elif name in ("and", "or", "add", "sub", "shl", "shr", "max", "min"):
      a, b = value(srcs[0], width), value(srcs[1], width)
      if kind.startswith("s") and name in ("max", "min"): a, b = signed(a, width), signed(b, width)
      result = {"and": lambda: a & b, "or": lambda: a | b, "add": lambda: a + b, "sub": lambda: a - b,
                "shl": lambda: a << min(b, width), "shr": lambda: a >> min(b, width),
                "max": lambda: max(a, b), "min": lambda: min(a, b)}[name]()
      regs[dst] = result & mask
    elif name == "setp":
      cmp, t = parts[1], parts[2]
      w = int(t[1:])
      a, b = value(srcs[0], w), value(srcs[1], w)
      if t.startswith("s"): a, b = signed(a, w), signed(b, w)
      regs[dst] = int({"eq": a == b, "ne": a != b, "gt": a > b, "lt": a < b, "ge": a >= b}[cmp])
    elif name == "selp": regs[dst] = value(srcs[0], width) if regs[srcs[2]] else value(srcs[1], width)
    elif name == "cvt":
      types = [p for p in parts[1:] if p != "rn"]
      to, frm = types[0], types[1]
      x = value(srcs[0], int(frm[1:]))
      if (to, frm) == ("u32", "u64"): regs[dst] = x & 0xFFFFFFFF
      elif (to, frm) == ("f32", "u32"): regs[dst] = _bits32(float(np.float32(x)))
      elif (to, frm) == ("f64", "f32"): regs[dst] = _f64_bits(_f32(x))
      else: raise NotImplementedError(op)
    elif name == "mul" and kind == "f32":
      regs[dst] = _bits32(float(np.float32(_f32(value(srcs[0], 32))) * np.float32(_f32(value(srcs[1], 32)))))
    else: raise NotImplementedError(f"the evaluator has no {op}")
  return regs

def _writer() -> _PTXKernelWriter:
  return _PTXKernelWriter("fp8_test", [], "sm_90a")

def decode(byte: int, dtype) -> float:
  w = _writer()
  out = w.fp8_to_f("%in", dtype)
  return _f32(run(w.lines, {"%in": byte})[out])

def encode(x: float, dtype) -> int:
  w = _writer()
  out = w.fp8_bits("%in", dtype)
  return run(w.lines, {"%in": _f64_bits(x)})[out]

@pytest.mark.parametrize("dtype", [dtypes.fp8e4m3, dtypes.fp8e5m2], ids=["e4m3", "e5m2"])
def test_every_byte_decodes_to_kilns_value_and_sign(dtype):
  for byte in range(256):
    got, want = decode(byte, dtype), FP8_VALUES[dtype][byte]
    if math.isnan(want): assert math.isnan(got) and math.copysign(1, got) == math.copysign(1, want), byte
    else: assert got == want and math.copysign(1, got) == math.copysign(1, want), (byte, got, want)

@pytest.mark.parametrize("dtype", [dtypes.fp8e4m3, dtypes.fp8e5m2], ids=["e4m3", "e5m2"])
def test_doubles_round_to_kilns_bytes(dtype):
  finite = sorted({v for v in FP8_VALUES[dtype] if math.isfinite(v) and v >= 0})
  ties = [(a + b) / 2 for a, b in zip(finite, finite[1:])]
  rng = np.random.default_rng(0)
  sweep = finite + ties + [math.nextafter(t, math.inf) for t in ties] + [math.nextafter(t, -math.inf) for t in ties]
  sweep += list(rng.standard_normal(400) * np.exp2(rng.uniform(-30, 20, 400)))
  sweep += [0.0, 5e-324, 2.0 ** -10, 2.0 ** -17, 2.0 ** -16 * 0.75, 1e30, 1e300, 464.0, 480.0, 61440.0, 57344.0,
            65536.0, math.inf, math.nan]
  for x in sweep:
    for v in (x, -x):
      got, want = encode(v, dtype), fp8_bits(v, dtype)
      assert got == want, f"{dtype} {v!r}: PTX {got:#04x}, kiln {want:#04x}"
