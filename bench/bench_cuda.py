"""kiln on the CUDA device beside PyTorch in the same process: memory-bound rows of issue 20's targets.

  python bench/bench_cuda.py [--floats N] [--reps R] [--json PATH] [--rows memory,matmul,conv,attention,...]

kiln's kernel times are CUDA events around each launch (DEBUG=2 makes every launch wait on its end event and adds
the time to GlobalCounters.time_sum_s); PyTorch's are events around the eager op. Median of R runs after 2 warm-ups.
GB/s counts the bytes each kernel must read and write once (inputs + output). Each kiln result is checked against
PyTorch on a slice (or whole, for the small rows).

Issue 21's rows (`--rows conv,attention`): fp16 conv2d 64x256x56x56 by 256x256x3x3 (forward and both backward
passes, beside cuDNN on channels-last tensors) and fp16 scaled_dot_product_attention B8 H16 S4096 D128 (plain and
causal, forward and backward, beside PyTorch's SDPA), in TFLOP/s and % of PyTorch. Each kiln pass is checked
against a float32 reference before it is timed (the max error relative to the reference's largest value, on a
slice where the whole is too big), and each has a time cap (`--cap` seconds of wall clock, compile included): a
pass whose first run already takes longer is timed once. `--rows conv32` is issue 20's fp32 conv2d row.
"""
from __future__ import annotations
import argparse, json, statistics, time
import numpy as np

def kiln_ms(make, reps: int) -> tuple[float, int, object]:
  """Median GPU milliseconds of the kernels that realizing `make()` launches, their count, and the last result."""
  from kiln import GlobalCounters
  from kiln.helpers import Context
  times, out, kernels = [], None, 0
  for i in range(reps + 2):
    GlobalCounters.reset()
    with Context(DEBUG=2):
      out = make().realize()
    if i >= 2: times.append(GlobalCounters.time_sum_s * 1e3)
    kernels = GlobalCounters.kernel_count
  return statistics.median(times), kernels, out

def torch_ms(run, reps: int) -> float:
  """Median GPU milliseconds of `run()` (eager PyTorch), events around each call."""
  import torch
  for _ in range(2): run()
  torch.cuda.synchronize()
  times = []
  for _ in range(reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); run(); end.record(); end.synchronize()
    times.append(start.elapsed_time(end))
  return statistics.median(times)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--floats", type=int, default=256 << 20)
  parser.add_argument("--reps", type=int, default=10)
  parser.add_argument("--json", default="")
  parser.add_argument("--rows", default="memory,matmul,launch",
                      help="which rows: memory, matmul, tiles, conv32 (fp32), conv (fp16, issue 21), attention, "
                      "qmatvec, launch (with the graph chains), host (the launch rows' host CPU time and where it "
                      "goes) (commas)")
  parser.add_argument("--attention-batch", type=int, default=8, help="the attention rows' batch (8: issue 21's "
                      "shape, whose 2^31 scores kiln's 32-bit kernel indices cannot address yet)")
  parser.add_argument("--cap", type=float, default=40.0, help="conv and attention rows: seconds of wall clock a "
                      "pass's runs may take (compile included) before it stops repeating")
  parser.add_argument("--row-elements", type=int, metavar="N", help="about N elements a thread in a row kernel's "
                      "block (kiln/codegen/gpudims.py ROW_ELEMENTS)")
  parser.add_argument("--row-lane-elements", type=int, metavar="N", help="GPU targets: threads a row in row kernels of "
                      "many rows (kiln/codegen/gpudims.py ROW_LANE_ELEMENTS: about N elements a lane; 0: a block a row)")
  parser.add_argument("--programmatic", type=int, choices=(0, 1, 2), help="CUDA graphs: programmatic dependent "
                      "launch between kernels (kiln/runtime/ops_cuda.py CUDAGraph.PROGRAMMATIC) off (0), on with each "
                      "kernel letting the next start at its start (1: kiln/renderer/cuda.py TRIGGER_AT_START; use "
                      "CODEGEN_CACHE=0), or at its end (2, the default)")
  parser.add_argument("--min-blocks", type=int, choices=(0, 1), help="kiln/renderer/cuda.py MIN_BLOCKS: 1 (the "
                      "default) gives kernels but register tiles `__launch_bounds__(L, 1)`, 0 only the block size "
                      "(use CODEGEN_CACHE=0)")
  args = parser.parse_args()
  if args.min_blocks is not None:
    from kiln.renderer import cuda as cuda_renderer
    cuda_renderer.MIN_BLOCKS = args.min_blocks
  if args.programmatic is not None:
    from kiln.runtime.ops_cuda import CUDAGraph
    CUDAGraph.PROGRAMMATIC = bool(args.programmatic)
    from kiln.renderer import cuda as cuda_renderer
    cuda_renderer.TRIGGER_AT_START = args.programmatic == 1
  if args.row_elements or args.row_lane_elements is not None:
    from kiln.codegen import gpudims
    gpudims.ROW_ELEMENTS = args.row_elements or gpudims.ROW_ELEMENTS
    if args.row_lane_elements == 0: gpudims.MULTI_ROW_MIN = 1 << 30
    elif args.row_lane_elements: gpudims.ROW_LANE_ELEMENTS = args.row_lane_elements
  import torch
  from kiln import Tensor, Device
  n, reps, rows = args.floats, args.reps, []
  Device.DEFAULT = "CUDA"
  def fill(seed: int) -> Tensor:   # made on the GPU: no 1 GiB host copies
    return ((Tensor.arange(n, device="CUDA") * (seed * 7 + 3) % 1000).float() * 0.004 - 2.0).realize()
  a = b = c = ta = tb = tc = None
  if "memory" in args.rows:
    a, b, c = fill(0), fill(1), fill(2)
    ta, tb, tc = (torch.from_numpy(x.numpy()).cuda() for x in (a, b, c))
  def row(name: str, kiln_result, bytes_moved: int, torch_time: float | None, extra: str = "") -> None:
    ms, kernels, _ = kiln_result
    rows.append({"name": name, "kiln_ms": ms, "kiln_GBps": bytes_moved / ms / 1e6, "kernels": kernels,
                 "torch_ms": torch_time, "torch_GBps": bytes_moved / torch_time / 1e6 if torch_time else None,
                 "note": extra})
    print(f"{name:34s} kiln {ms:9.3f} ms {bytes_moved / ms / 1e6:8.1f} GB/s ({kernels} kernels)   torch "
          + (f"{torch_time:9.3f} ms {bytes_moved / torch_time / 1e6:8.1f} GB/s" if torch_time else "-") + f"  {extra}")

  if "memory" in args.rows: memory_rows(a, b, c, ta, tb, tc, reps, row)
  if "matmul" in args.rows:
    for size in (1024, 2048, 4096, 4000): rows.append(matmul_row(size, reps))   # 4000: guarded edge tiles
  if "tiles" in args.rows:   # matmuls under other tile settings of kiln/codegen/gpu_tiles.py (compiled afresh)
    from kiln.codegen import gpu_tiles
    from kiln.engine import realize
    saved = gpu_tiles.TILES, gpu_tiles.BLOCK_KS
    for size, tiles, block_ks in ((4096, ((128, 128, 1.0),), (8,)), (4096, ((128, 64, 1.0),), (16,)),
                                  (1024, ((128, 64, 1.0),), (16,)), (1024, ((64, 64, 1.0),), (16,)),
                                  (1024, ((128, 128, 1.0),), (16,))):
      gpu_tiles.TILES, gpu_tiles.BLOCK_KS = tiles, block_ks
      realize._runner_cache.clear()
      print(f"tiles {tiles}, K step {block_ks}:")
      rows.append({**matmul_row(size, reps), "tiles": tiles, "block_k": block_ks})
    gpu_tiles.TILES, gpu_tiles.BLOCK_KS = saved
    realize._runner_cache.clear()
  selected = args.rows.split(",")
  if "conv32" in selected: rows.append(conv_row(reps))
  if "conv" in selected: rows.extend(conv16_rows(reps, args.cap))
  if "attention" in selected: rows.extend(attention_rows(reps, args.cap, (args.attention_batch, 16, 4096, 128)))
  if "qmatvec" in args.rows: qmatvec_rows(rows)
  if "launch" in args.rows: launch_rows(rows)
  elif "chain" in args.rows: chain_rows(rows)
  if "host" in args.rows: host_rows(rows)
  if args.json:
    with open(args.json, "w") as f: json.dump({"floats": n, "reps": reps, "rows": rows}, f, indent=1)

def memory_rows(a, b, c, ta, tb, tc, reps: int, row) -> None:
  """The memory-bound rows: elementwise chain, copy-like, sums, softmax, layernorm."""
  import torch
  n = a.shape[0]
  elementwise = kiln_ms(lambda: ((a * b + c).relu() * 0.5).exp(), reps)
  got, want = elementwise[2].numpy()[:1 << 20], ((ta * tb + tc).relu() * 0.5).exp()[:1 << 20].cpu().numpy()
  np.testing.assert_allclose(got, want, rtol=2e-6)
  row("((a*b+c).relu()*0.5).exp()", elementwise, 16 * n, torch_ms(lambda: ((ta * tb + tc).relu() * 0.5).exp(), reps))
  add = kiln_ms(lambda: a + 1.0, reps)
  row("a+1 (copy-like)", add, 8 * n, torch_ms(lambda: ta + 1.0, reps))
  half = n // 2
  copy = kiln_ms(lambda: a[half:].contiguous(), reps)   # a real copy kernel (a view at an aligned offset)
  np.testing.assert_array_equal(copy[2].numpy()[:1 << 20], a[half:half + (1 << 20)].numpy())
  row("copy a[n/2:] (a view, 128M floats)", copy, 8 * (n - half), torch_ms(lambda: ta[half:].clone(), reps))
  two_stage = kiln_ms(lambda: a.reshape(-1, 8192).sum(axis=1).sum(), reps)
  assert abs(two_stage[2].item() - float(ta.double().sum())) <= 1e-3 * abs(float(ta.double().sum())) + 1.0
  row("sum 256M as (-1, 8192).sum(1).sum()", two_stage, 4 * n, torch_ms(lambda: ta.sum(), reps))
  whole = kiln_ms(lambda: a.sum(), 3)
  assert abs(whole[2].item() - float(ta.double().sum())) <= 1e-3 * abs(float(ta.double().sum())) + 1.0
  row("a.sum() of 256M floats", whole, 4 * n, torch_ms(lambda: ta.sum(), reps))
  rows2d = (a[:8192 * 8192].reshape(8192, 8192) * 1.0).realize()
  t2d = ta[:8192 * 8192].reshape(8192, 8192)
  softmax = kiln_ms(lambda: rows2d.softmax(axis=1), reps)
  np.testing.assert_allclose(softmax[2].numpy()[:64], t2d[:64].softmax(dim=1).cpu().numpy(), rtol=1e-4, atol=1e-7)
  row("softmax 8192x8192 (rows)", softmax, 2 * 4 * 8192 * 8192, torch_ms(lambda: t2d.softmax(dim=1), reps))
  layernorm = kiln_ms(lambda: rows2d.layernorm(), reps)
  want = torch.nn.functional.layer_norm(t2d[:64], (8192,), eps=1e-5).cpu().numpy()
  np.testing.assert_allclose(layernorm[2].numpy()[:64], want, rtol=1e-3, atol=1e-3)
  row("layernorm 8192x8192 (rows)", layernorm, 2 * 4 * 8192 * 8192,
      torch_ms(lambda: torch.nn.functional.layer_norm(t2d, (8192,), eps=1e-5), reps))

def matmul_row(size: int, reps: int) -> dict:
  """fp32 size^3 matmul, kiln's SIMT tiles vs PyTorch without TF32 (cuBLAS SIMT); checked on 64 rows (all of them up to
  1024) against PyTorch in float64."""
  import torch
  from kiln import Tensor
  m = Tensor.rand(size, size, device="CUDA").realize()
  w = Tensor.rand(size, size, device="CUDA").realize()
  mm = kiln_ms(lambda: m @ w, reps)
  tm, tw = torch.from_numpy(m.numpy()).cuda(), torch.from_numpy(w.numpy()).cuda()
  rows_checked = size if size <= 1024 else 64
  want = (tm[:rows_checked].double() @ tw.double()).cpu().numpy()
  np.testing.assert_allclose(mm[2].numpy()[:rows_checked], want, rtol=1e-4, atol=1e-3)
  with _no_tf32():
    torch_mm = torch_ms(lambda: tm @ tw, reps)
  flops = 2 * size ** 3
  print(f"matmul {size}^3 fp32: kiln {mm[0]:.3f} ms {flops / mm[0] / 1e9:.2f} TFLOP/s ({mm[1]} kernels), torch "
        f"{torch_mm:.3f} ms {flops / torch_mm / 1e9:.2f} TFLOP/s (no TF32): {torch_mm / mm[0]:.0%} of torch")
  return {"name": f"matmul {size}^3 fp32", "kiln_ms": mm[0], "kiln_TFLOPs": flops / mm[0] / 1e9, "kernels": mm[1],
          "torch_ms": torch_mm, "torch_TFLOPs": flops / torch_mm / 1e9}

def conv_row(reps: int) -> dict:
  """fp32 conv2d 32x64x56x56 by 64x64x3x3, padding 1 (a ResNet layer), kiln's tiles (an implicit matmul) vs PyTorch
  (cuDNN, no TF32); checked on the first image against PyTorch in float64."""
  import torch
  from kiln import Tensor
  x = Tensor.rand(32, 64, 56, 56, device="CUDA").realize()
  w = (Tensor.rand(64, 64, 3, 3, device="CUDA") - 0.5).realize()
  conv = kiln_ms(lambda: x.conv2d(w, padding=1), reps)
  tx, tw = torch.from_numpy(x.numpy()).cuda(), torch.from_numpy(w.numpy()).cuda()
  want = torch.nn.functional.conv2d(tx[:1].double(), tw.double(), padding=1).cpu().numpy()
  np.testing.assert_allclose(conv[2].numpy()[:1], want, rtol=1e-4, atol=1e-3)
  torch.backends.cudnn.allow_tf32 = False
  torch_conv = torch_ms(lambda: torch.nn.functional.conv2d(tx, tw, padding=1), reps)
  flops = 2 * 32 * 64 * 56 * 56 * 64 * 9
  print(f"conv2d 32x64x56x56 * 64x64x3x3 fp32: kiln {conv[0]:.3f} ms {flops / conv[0] / 1e9:.2f} TFLOP/s "
        f"({conv[1]} kernels), torch {torch_conv:.3f} ms {flops / torch_conv / 1e9:.2f} TFLOP/s (no TF32)")
  return {"name": "conv2d 32x64x56x56 * 64x64x3x3 fp32", "kiln_ms": conv[0], "kiln_TFLOPs": flops / conv[0] / 1e9,
          "kernels": conv[1], "torch_ms": torch_conv, "torch_TFLOPs": flops / torch_conv / 1e9}

def capped_kiln_ms(make, reps: int, cap_s: float) -> tuple[list[float], object, float]:
  """GPU milliseconds of the kernels each realization of `make()` (a list of tensors) launches, after one warm-up
  run (compiles included) and while the runs' wall clock stays under `cap_s`: (times, last outputs, warm-up wall
  seconds). A pass whose warm-up alone takes over `cap_s` is timed by that run (its kernel time) only."""
  from kiln import GlobalCounters, Tensor
  from kiln.helpers import Context
  times: list[float] = []
  start = time.perf_counter()
  first = 0.0
  for i in range(reps + 1):
    GlobalCounters.reset()
    with Context(DEBUG=2):
      outs = make()
      Tensor.realize(*outs)
    if i == 0: first = time.perf_counter() - start
    if i >= 1 or first > cap_s: times.append(GlobalCounters.time_sum_s * 1e3)
    if time.perf_counter() - start > cap_s: break
  return times, outs, first

def compare(got: np.ndarray, want: np.ndarray, tolerance: float) -> dict:
  """The max error of `got` relative to the largest |want|, and whether it is within `tolerance`."""
  got64, want64 = got.astype(np.float64), want.astype(np.float64)
  scale = float(np.abs(want64).max()) or 1.0
  error = float(np.abs(got64 - want64).max()) / scale
  return {"max_error": error, "ok": bool(np.isfinite(error) and error <= tolerance)}

def worst(checks: list[dict]) -> dict:
  """Several checks as one: the largest error, ok only where every one is."""
  return {"max_error": max(c["max_error"] for c in checks), "ok": all(c["ok"] for c in checks)}

def flop_row(name: str, flops: float, kiln: tuple[list[float], object, float], check: dict, torch_time: float,
             extra: dict | None = None) -> dict:
  """A conv or attention pass's row: kiln's median ms and TFLOP/s beside PyTorch's, the check, the share."""
  times, _, first = kiln
  ms = statistics.median(times) if times else float("nan")
  row = {"name": name, "kiln_ms": ms, "kiln_TFLOPs": flops / ms / 1e9, "kiln_runs": len(times),
         "kiln_first_run_s": first, "torch_ms": torch_time, "torch_TFLOPs": flops / torch_time / 1e9,
         "of_torch": torch_time / ms, "check": check, **(extra or {})}
  print(f"{name:44s} kiln {ms:9.3f} ms {row['kiln_TFLOPs']:7.2f} TFLOP/s ({len(times)} runs, first {first:.1f} s)  "
        f"torch {torch_time:8.3f} ms {row['torch_TFLOPs']:7.1f} TFLOP/s  {row['of_torch']:.1%} of torch  "
        f"check {'ok' if check['ok'] else 'FAILED'} (max error {check['max_error']:.2e})", flush=True)
  return row

def conv16_rows(reps: int, cap_s: float, dims: tuple[int, int, int, int] = (64, 256, 56, 256), device: str = "CUDA",
                torch_device: str = "cuda") -> list[dict]:
  """Issue 21's conv2d: fp16 64x256x56x56 by 256 filters of 256x3x3, padding 1, forward and the two backward passes
  (the input's gradient and the weight's), kiln vs PyTorch on channels-last tensors (cuDNN, fp32 accumulation).
  Checked against PyTorch in float32 (the forward and the input's gradient on the first 4 images, the weight's
  gradient whole) within 2e-2 of the reference's largest value. (`dims`, `device`: smaller runs elsewhere, to try
  the row.)"""
  import torch
  from kiln import Tensor
  n, c, size, f = dims
  rng = np.random.default_rng(0)
  xs = rng.standard_normal((n, c, size, size), dtype=np.float32).astype(np.float16)
  ws = (rng.standard_normal((f, c, 3, 3), dtype=np.float32) * 0.05).astype(np.float16)
  gs = rng.standard_normal((n, f, size, size), dtype=np.float32).astype(np.float16)
  x, w, g = (Tensor(a, device=device).realize() for a in (xs, ws, gs))
  tx, tw, tg = (torch.from_numpy(a).to(torch_device) for a in (xs, ws, gs))
  cl = torch.channels_last
  tx_cl, tw_cl, tg_cl = (t.contiguous(memory_format=cl) for t in (tx, tw, tg))
  flops = 2 * n * f * c * size * size * 9
  images = min(4, n)
  with torch.no_grad():
    ref_out = torch.nn.functional.conv2d(tx[:images].float(), tw.float(), padding=1).cpu().numpy()
    ref_dx = torch.nn.grad.conv2d_input((images, c, size, size), tw.float(), tg[:images].float(),
                                        padding=1).cpu().numpy()
    ref_dw = torch.nn.grad.conv2d_weight(tx.float(), tw.shape, tg.float(), padding=1).cpu().numpy()
  rows = []
  with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False):
    passes = (
      (f"conv2d fp16 {n}x{c}x{size}x{size} 3x3 forward", lambda: [x.conv2d(w, padding=1)],
       lambda outs: compare(outs[0][:images].numpy(), ref_out, 2e-2),
       lambda: torch.nn.functional.conv2d(tx_cl, tw_cl, padding=1)),
      ("conv2d fp16 backward: input gradient", lambda: x.conv2d(w, padding=1).gradient(x, gradient=g),
       lambda outs: compare(outs[0][:images].numpy(), ref_dx, 2e-2),
       lambda: torch.nn.grad.conv2d_input(tx.shape, tw_cl, tg_cl, padding=1)),
      ("conv2d fp16 backward: weight gradient", lambda: x.conv2d(w, padding=1).gradient(w, gradient=g),
       lambda outs: compare(outs[0].numpy(), ref_dw, 2e-2),
       lambda: torch.nn.grad.conv2d_weight(tx_cl, tw.shape, tg_cl, padding=1)),
    )
    for name, make, check, reference in passes:
      try:
        kiln = capped_kiln_ms(make, reps, cap_s)
        result = check(kiln[1])
      except Exception as error:   # noqa: BLE001  (a failing pass is reported, the others still run)
        print(f"{name}: kiln failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
        rows.append({"name": name, "error": f"{type(error).__name__}: {str(error)[:300]}"})
        continue
      rows.append(flop_row(name, flops, kiln, result, torch_ms(reference, reps), {"dtype": "fp16"}))
  del x, w, g
  return rows

def attention_rows(reps: int, cap_s: float, dims: tuple[int, int, int, int] = (8, 16, 4096, 128),
                   device: str = "CUDA", torch_device: str = "cuda") -> list[dict]:
  """Issue 21's attention: fp16 scaled_dot_product_attention B8 H16 S4096 D128, plain and causal, forward and
  backward (the gradients of q, k and v), kiln vs PyTorch's SDPA (flash attention). FLOPs: 4*B*H*S^2*D forward,
  2.5 times that backward, half of each when causal. Checked against PyTorch in float32 on batch 0, heads 0-1,
  within 2e-2 of the reference's largest value. (`dims`, `device`: smaller runs elsewhere, to try the row.)"""
  import torch
  from kiln import Tensor
  b, h, s, d = dims
  rng = np.random.default_rng(1)
  arrays = [rng.standard_normal((b, h, s, d), dtype=np.float32).astype(np.float16) for _ in range(4)]
  q, k, v, do = (Tensor(a, device=device).realize() for a in arrays)
  tq, tk, tv, tdo = (torch.from_numpy(a).to(torch_device) for a in arrays)
  rows = []
  for causal in (False, True):
    share = 0.5 if causal else 1.0
    label = "causal " if causal else ""
    sq, sk, sv = (t[:1, :2].float().requires_grad_(True) for t in (tq, tk, tv))
    ref = torch.nn.functional.scaled_dot_product_attention(sq, sk, sv, is_causal=causal)
    ref_grads = [t.cpu().numpy() for t in torch.autograd.grad(ref, (sq, sk, sv), tdo[:1, :2].float())]
    ref = ref.detach().cpu().numpy()
    def forward(): return [q.scaled_dot_product_attention(k, v, is_causal=causal)]
    def backward(): return q.scaled_dot_product_attention(k, v, is_causal=causal).gradient(q, k, v, gradient=do)
    tq.requires_grad_(True); tk.requires_grad_(True); tv.requires_grad_(True)
    tout = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    passes = (
      (f"attention fp16 B{b} H{h} S{s} D{d} {label}forward", forward, 4 * b * h * s * s * d * share,
       lambda outs: compare(outs[0][:1, :2].numpy(), ref, 2e-2),
       lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)),
      (f"attention fp16 B{b} H{h} S{s} D{d} {label}backward", backward, 10 * b * h * s * s * d * share,
       lambda outs: worst([compare(o[:1, :2].numpy(), r, 2e-2) for o, r in zip(outs, ref_grads)]),
       lambda: torch.autograd.grad(tout, (tq, tk, tv), tdo, retain_graph=True)),
    )
    for name, make, flops, check, reference in passes:
      try:
        kiln = capped_kiln_ms(make, reps, cap_s)
        result = check(kiln[1])
      except Exception as error:   # noqa: BLE001  (a failing pass is reported, the others still run)
        print(f"{name}: kiln failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
        rows.append({"name": name, "error": f"{type(error).__name__}: {str(error)[:300]}"})
        continue
      rows.append(flop_row(name, flops, kiln, result, torch_ms(reference, reps), {"dtype": "fp16"}))
    del tout
    tq.requires_grad_(False); tk.requires_grad_(False); tv.requires_grad_(False)
  return rows

def launch_rows(rows: list) -> None:
  """Eager tiny-call time and TinyJit replay, launch by launch and as one CUDA graph."""
  from kiln import Tensor, Device
  tiny = Tensor.ones(16, device="CUDA").realize()
  for _ in range(3): (tiny + 1).realize()
  Device["CUDA"].synchronize()
  start = time.perf_counter()
  for _ in range(100): (tiny + 1).realize()
  Device["CUDA"].synchronize()
  tiny_us = (time.perf_counter() - start) / 100 * 1e6
  rows.append({"name": "eager (a+1).realize() on 16 floats", "us_per_call": tiny_us})
  print(f"eager (a+1).realize() on 16 floats: {tiny_us:.1f} us a call (wall clock)")
  from kiln import TinyJit
  from kiln.engine import graph
  from kiln.runtime.ops_cuda import CUDAGraph
  for graphs in (False, True):   # a 2-kernel function under TinyJit, launch by launch and as one CUDA graph
    graph.GRAPHS["CUDA"] = CUDAGraph if graphs else None   # None: launch by launch (graph_for finds no graph)
    step = TinyJit(lambda x: ((x + 1).contiguous() * 2).contiguous())
    for _ in range(5): step(tiny)
    Device["CUDA"].synchronize()
    rounds = []   # rounds of 300 queued replays, each waited for: the GPU's graph launches count, not only the host's
    for _ in range(9):
      start = time.perf_counter()
      for _ in range(300): step(tiny)
      Device["CUDA"].synchronize()
      rounds.append((time.perf_counter() - start) / 300 * 1e6)
    replay_us = statistics.median(rounds)
    used = any(isinstance(launch, CUDAGraph) for launch in step.captured._launches)
    rows.append({"name": f"TinyJit replay, 2 kernels, {'CUDA graph' if graphs else 'plain launches'}",
                 "us_per_call": replay_us, "us_per_call_rounds": rounds, "graph_used": used})
    print(f"TinyJit replay of 2 kernels ({'CUDA graph' if graphs else 'plain launches'}, graph used: {used}): "
          f"{replay_us:.1f} us a call (wall clock, median of 9 rounds of 300; least {min(rounds):.1f}, "
          f"most {max(rounds):.1f})")
  graph.GRAPHS.pop("CUDA", None)
  chain_rows(rows)

def host_rows(rows: list, rounds: int = 7, calls: int = 300) -> None:
  """The host side of the launch rows: this thread's CPU time (time.thread_time, the least of `rounds` rounds of
  `calls` calls; the GPU and other processes do not count) of an eager `(a+1).realize()` on 16 floats and of a
  2-kernel TinyJit replay (CUDA graph), then where that time goes: a cProfile of each, summed by module (the
  profiler's own cost inflates the parts of many small calls, so the shares are a guide, the CPU times the figure).
  Runs over the real driver, or without a GPU over test/runtime/fake_libcuda.c."""
  import cProfile, collections, pstats
  from kiln import Tensor, TinyJit, Device
  tiny = Tensor.ones(16, device="CUDA").realize()
  step = TinyJit(lambda x: ((x + 1).contiguous() * 2).contiguous())
  cases = (("eager (a+1).realize() on 16 floats", lambda: (tiny + 1).realize()),
           ("TinyJit replay, 2 kernels, CUDA graph", lambda: step(tiny)))
  for _ in range(5):
    for _, run in cases: run()
  Device["CUDA"].synchronize()
  for name, run in cases:
    best = float("inf")
    for _ in range(rounds):
      start = time.thread_time()
      for _ in range(calls): run()
      best = min(best, (time.thread_time() - start) / calls * 1e6)
      Device["CUDA"].synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls): run()
    profile.disable()
    Device["CUDA"].synchronize()
    by_module: collections.Counter = collections.Counter()
    for (path, _, _), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
      by_module[path.split("kiln/")[-1] if "kiln/" in path else ("builtins" if path == "~" else path)] += own
    total = sum(by_module.values()) or 1.0
    shares = {module: round(own / total, 3) for module, own in by_module.most_common(8)}
    rows.append({"name": f"host CPU time, {name}", "cpu_us_per_call": best, "profile_shares": shares})
    print(f"host CPU time, {name}: {best:.1f} us a call (thread time, least of {rounds} rounds of {calls}); "
          "profile shares: " + ", ".join(f"{module} {share:.0%}" for module, share in shares.items()))

def chain_rows(rows: list, length: int = 200) -> None:
  """What one kernel node of a CUDA graph costs when each waits for the one before (an LLM decode step is ~300 such
  kernels): TinyJit replays of `length` dependent kernels, each replay waited for; us per kernel. Elementwise on 16
  floats (one block), and a row reduction of 576 floats (a block per row, 960 rows: a decode step's qkv shape)."""
  from kiln import Tensor, Device, TinyJit
  def chained(x: Tensor, op) -> Tensor:
    for _ in range(length): x = op(x).contiguous()
    return x
  for name, shape, op in (("elementwise 16 floats", (16,), lambda x: x * 0.5 + 1.0),
                          ("row sums 960x576", (960, 576), lambda x: x - x.mean(-1, keepdim=True) * 0.5),
                          ("row sums 1x576", (1, 576), lambda x: x - x.mean(-1, keepdim=True) * 0.5),
                          ("softmax 9x256", (9, 256), lambda x: x.softmax(-1))):
    step = TinyJit(lambda x, op=op: chained(x, op))
    x = Tensor.ones(*shape, device="CUDA").realize()
    for _ in range(4): step(x)
    Device["CUDA"].synchronize()
    times = []
    for _ in range(20):
      start = time.perf_counter()
      step(x)
      Device["CUDA"].synchronize()
      times.append(time.perf_counter() - start)
    per_kernel = statistics.median(times) / step.captured.kernel_count * 1e6
    rows.append({"name": f"graph chain of {step.captured.kernel_count} kernels, {name}", "us_per_kernel": per_kernel})
    print(f"graph chain of {step.captured.kernel_count} dependent kernels, {name}: {per_kernel:.2f} us a kernel "
          f"(replay to completion, median of 20)")

def qmatvec_rows(rows: list, settings: tuple[tuple[int, int], ...] = ((4, 256), (8, 256), (16, 256), (32, 256),
                                                                      (8, 128), (8, 512))) -> None:
  """The LLM decode step's Q4_1 matrix-vector kernels (SmolLM2-135M's shapes) alone: each kernel's launch repeated
  64 times in a CUDA graph chain (each waiting for the one before, as in the step), us a kernel, for several
  (`gpudims.ROW_LANE_ELEMENTS`, `gpudims.ROW_BLOCK_THREADS`) (the kernels made afresh for each: CODEGEN_CACHE=0)."""
  import numpy as np
  from kiln import Tensor, TinyJit
  from kiln.codegen import gpudims
  from kiln.engine import realize
  from kiln.runtime import cuda_driver as cuda
  from kiln.runtime.ops_cuda import CUDAGraph
  from kiln.apps.llm.quantized import QuantizedMatrix
  from kiln.apps.llm.random_model import random_tensor
  from kiln.apps.llm.model import normed_linear
  rng = np.random.default_rng(0)
  def matrix(r: int, c: int) -> QuantizedMatrix:
    blocks = random_tensor("Q4_1", (r, c), 0.02, rng).reshape(r, c // 32, 20)
    return QuantizedMatrix.from_blocks("Q4_1", blocks, (r, c), device="CUDA", int_dot=False)
  gate, up, down, qkv = matrix(1536, 576), matrix(1536, 576), matrix(576, 1536), matrix(960, 576)
  x, h = Tensor(rng.standard_normal((1, 576)).astype(np.float32), device="CUDA").realize(), \
    Tensor(rng.standard_normal((1, 1536)).astype(np.float32), device="CUDA").realize()
  w = Tensor(rng.standard_normal(576).astype(np.float32), device="CUDA").realize()
  cases = {"qkv 960x576": lambda: qkv.linear(x * w), "qkv 960x576 with its norm": lambda: normed_linear(qkv, x, w, 1e-5),
           "gate 1536x576": lambda: gate.linear(x * w), "gate*up 2x1536x576": lambda: gate.linear(x).silu() *
           up.linear(x), "gate*up with the norm": lambda: normed_linear(gate, x, w, 1e-5).silu() *
           normed_linear(up, x, w, 1e-5), "down 576x1536": lambda: down.linear(h)}
  saved = gpudims.ROW_LANE_ELEMENTS, gpudims.ROW_BLOCK_THREADS
  try:
    for elements, threads in settings:
      gpudims.ROW_LANE_ELEMENTS, gpudims.ROW_BLOCK_THREADS = elements, threads
      realize._runner_cache.clear()   # compiled runners are kept by kernel AST: made again under this setting
      for name, make in cases.items():
        step = TinyJit(lambda make=make: make().contiguous())
        for _ in range(3): step()
        (item,) = [item for item in step.captured.items if CUDAGraph.supports(item)]   # the one kernel
        context = item.runner.program.device.context
        chain = cuda.Graph(context, [CUDAGraph._packed(item)] * 64)
        start, end = context.event(), context.event()
        times = []
        for _ in range(7):
          start.record()
          for _ in range(10): chain.launch()
          end.record()
          end.synchronize()
          times.append(start.elapsed_ms(end) * 1e3 / 640)
        chain.close()
        us = statistics.median(times)
        launch = item.runner.launch
        rows.append({"name": f"{name}, {elements} elements a lane, {threads}-thread blocks", "us_per_kernel": us,
                     "launch": str(launch)})
        print(f"{name:26s} {elements:2d} a lane {str(launch):28s} {us:6.2f} us a kernel (chained)")
  finally: gpudims.ROW_LANE_ELEMENTS, gpudims.ROW_BLOCK_THREADS = saved

class _no_tf32:
  """PyTorch's fp32 matmul without TF32 tensor cores, as kiln's (restored after)."""
  def __enter__(self):
    import torch
    self.saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
  def __exit__(self, *exc):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = self.saved

if __name__ == "__main__":
  main()
