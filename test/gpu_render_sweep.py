"""Every op test's kernels, rendered for CUDA C and PTX and compiled for sm_90a, on a machine without a GPU.

The op tests (test/test_ops*.py) run on the CPU; this pytest plugin (loaded by test/conftest.py) notes each kernel
they compile. When the session ends, every noted kernel goes through the GPU pipeline (kiln/codegen/pipeline.py
with kiln/renderer/cuda.py and ptx.py, as on the CUDA device) and is compiled for sm_90a: the CUDA C by `nvcc`
(kernels in batches, each in a namespace of its own), the PTX by `ptxas`. A kernel fails the session when it does
not render, does not build, spills registers or uses a stack frame (local memory), as `ptxas -v` reports it.

It runs where nvcc or ptxas is on PATH (the CUDA toolkit: installed here and in CI), and not on a GPU machine's
`DEV=CUDA`/`PTX=1` runs, which compile every kernel for real. `GPU_RENDER_SWEEP=0` turns it off.
"""
from __future__ import annotations
import concurrent.futures, os, re, shutil, subprocess, tempfile, time
import pytest

NVCC, PTXAS = shutil.which("nvcc"), shutil.which("ptxas")
ARCH = "sm_90a"
BATCH = 64   # CUDA C kernels in one nvcc run: nvcc's start costs more than a small kernel's compile
# kernels that may use a small stack frame, by the test that makes them (a node id's start), and how many bytes:
# keccak-f[1600] in one kernel keeps 25 64-bit lanes and their rotations live (1980 uops); nvcc's CUDA C spills 16
# bytes of it at 255 registers, kiln's PTX none
ALLOWED_STACK_BYTES = {"test/test_ops_dtype.py::test_keccak": 16}

def enabled() -> bool:
  """Whether this session sweeps: a CUDA toolkit here, no GPU run asked for, not turned off."""
  if os.environ.get("GPU_RENDER_SWEEP", "1") == "0" or os.environ.get("PTX") not in (None, "", "0"): return False
  if os.environ.get("DEV", "").upper().startswith("CUDA") or os.environ.get("CUDA") not in (None, "", "0"): return False
  return NVCC is not None or PTXAS is not None

_seen: dict = {}   # kernel AST -> the op test that first compiled it, in that order

def _is_op_test(item: pytest.Item) -> bool:
  return os.path.basename(str(item.fspath)).startswith("test_ops")

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
  """Note the kernels an op test compiled: the runner cache's entries added while it ran."""
  from kiln.engine import realize
  before = len(realize._runner_cache)
  yield
  if not enabled() or not _is_op_test(item): return
  keys = list(realize._runner_cache)
  for key in keys[before:] if len(keys) >= before else keys:
    device, ast = key[0], key[1]
    if device.split(":")[0] in ("CPU", "LLVM", "PYTHON") and ast.op.name != "COPY": _seen.setdefault(ast, item.nodeid)

def render_for_gpu(ast) -> tuple[str, str, str, int]:
  """(kernel name, CUDA C source, PTX source, linear uops) of one kernel AST, optimized as the CUDA device would."""
  from kiln.engine.realize import kernel_name, lower_for_codegen, optimize_for, render_with
  from kiln.renderer.cuda import CUDARenderer
  from kiln.renderer.ptx import PTXRenderer
  name, lowered = kernel_name(ast), lower_for_codegen(ast)
  cuda, ptx = CUDARenderer(ARCH), PTXRenderer(ARCH)
  cuda_source, uops = render_with(cuda, name, optimize_for(cuda, lowered))
  return name, cuda_source, render_with(ptx, name, optimize_for(ptx, lowered))[0], len(uops)

_ENTRY = re.compile(r'extern "C" __global__ void (__launch_bounds__\([^)]*\) )?(\w+)\(')
_PROPERTIES = re.compile(r"Function properties for (\w+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads")

# (what is wrong: "" nothing, "spill" a stack frame or spills, "error" the rest; the text; the stack frame's bytes)
Verdict = tuple[str, str, int]
FINE: Verdict = ("", "", 0)

def ptxas_verdicts(report: str, entries: list[str]) -> dict[str, Verdict]:
  """Per entry function named in `entries`, what `ptxas -v`'s `report` says of it."""
  found = {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in _PROPERTIES.finditer(report)}
  verdicts = {}
  for entry in entries:
    if entry not in found: verdicts[entry] = ("error", "no ptxas report", 0)
    elif found[entry] == (0, 0, 0): verdicts[entry] = FINE
    else: verdicts[entry] = ("spill", "%d bytes stack frame, %d/%d bytes spill stores/loads" % found[entry],
                             found[entry][0])
  return verdicts

def _unique_entry(source: str, index: int) -> tuple[str, str]:
  """`source` with its kernel renamed `<name>_k<index>`, wrapped in a namespace of its own, and the new name."""
  match = _ENTRY.search(source)
  assert match is not None, f"no kernel entry in:\n{source[:2000]}"
  name = f"{match[2]}_k{index}"
  source = source[:match.start(2)] + name + source[match.end(2):]
  return f"namespace kiln_kernel{index} {{\n{source}\n}}\n", name

def compile_cuda(sources: list[str], folder: str) -> list[Verdict]:
  """nvcc's verdict on each CUDA C source, compiled `BATCH` at a time; a batch that does not build is compiled
  kernel by kernel to find which ones fail."""
  def run(indices: list[int]) -> dict[int, Verdict]:
    wrapped = [_unique_entry(sources[i], i) for i in indices]
    path = os.path.join(folder, f"batch{indices[0]}_{len(indices)}.cu")
    with open(path, "w") as f: f.write("\n".join(text for text, _ in wrapped))
    done = subprocess.run([NVCC, f"-arch={ARCH}", "-cubin", "--fmad=false", "-Xptxas", "-v", "-w", "-o",
                           path[:-3] + ".cubin", path], capture_output=True, text=True)
    report = done.stdout + done.stderr
    if done.returncode != 0:
      if len(indices) == 1: return {indices[0]: ("error", f"nvcc failed:\n{report[-3000:]}", 0)}
      out: dict[int, Verdict] = {}
      for i in indices: out.update(run([i]))
      return out
    verdicts = ptxas_verdicts(report, [name for _, name in wrapped])
    return {i: verdicts[name] for i, (_, name) in zip(indices, wrapped)}
  batches = [list(range(i, min(i + BATCH, len(sources)))) for i in range(0, len(sources), BATCH)]
  verdicts: dict[int, Verdict] = {}
  with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
    for result in pool.map(run, batches): verdicts.update(result)
  return [verdicts[i] for i in range(len(sources))]

def compile_ptx(sources: list[str], folder: str) -> list[Verdict]:
  """ptxas's verdict on each PTX source (one kernel each)."""
  def run(index: int) -> Verdict:
    path = os.path.join(folder, f"kernel{index}.ptx")
    with open(path, "w") as f: f.write(sources[index])
    done = subprocess.run([PTXAS, f"-arch={ARCH}", "-v", "-o", path[:-4] + ".cubin", path], capture_output=True,
                          text=True)
    if done.returncode != 0: return ("error", f"ptxas failed:\n{(done.stdout + done.stderr)[-3000:]}", 0)
    entry = re.search(r"^\.visible \.entry (\w+)\(", sources[index], re.M)
    if entry is None: return ("error", "no .entry in the PTX", 0)
    return ptxas_verdicts(done.stdout + done.stderr, [entry[1]])[entry[1]]
  with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
    return list(pool.map(run, range(len(sources))))

def sweep(asts: dict) -> tuple[int, list[str]]:
  """Render and compile for the GPU every kernel AST of `asts` (AST -> the test that made it): (kernels swept, one
  message per failure)."""
  failures, rendered = [], []
  for ast, origin in asts.items():
    try: rendered.append((f"{origin}: kernel", *render_for_gpu(ast)))
    except Exception as e:   # noqa: BLE001  (each failure is reported with its kernel)
      failures.append(f"{origin}: a kernel does not render for the GPU: {type(e).__name__}: {e}\n{ast}"[:3000])
  with tempfile.TemporaryDirectory(prefix="kiln_gpu_sweep_") as folder:
    for tool, index, compile_all in ((NVCC, 2, compile_cuda), (PTXAS, 3, compile_ptx)):
      if tool is None: continue
      unique = list(dict.fromkeys(r[index] for r in rendered))   # kernels that render alike build once
      by_source = dict(zip(unique, compile_all(unique, folder)))
      verdicts = [by_source[r[index]] for r in rendered]
      label = "CUDA C" if index == 2 else "PTX"
      for r, (kind, text, stack) in zip(rendered, verdicts):
        allowed = max((b for start, b in ALLOWED_STACK_BYTES.items() if r[0].startswith(start)), default=0)
        if kind == "error" or (kind == "spill" and stack > allowed):
          failures.append(f"{r[0]} {r[1]} ({label}, {r[4]} uops): {text}")
      if failures and (keep := os.environ.get("GPU_RENDER_SWEEP_KEEP")):   # the failing sources, to read
        os.makedirs(keep, exist_ok=True)
        for r, (kind, _, _) in zip(rendered, verdicts):
          if kind:
            with open(os.path.join(keep, f"{r[1]}.{'cu' if index == 2 else 'ptx'}"), "w") as f: f.write(r[index])
  return len(rendered), failures

def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
  """Sweep the op tests' kernels; a failure fails the session."""
  if not enabled() or not _seen: return
  start = time.perf_counter()
  count, failures = sweep(_seen)
  reporter = session.config.pluginmanager.get_plugin("terminalreporter")
  if reporter is not None: reporter.write("\n")
  write = reporter.write_line if reporter is not None else print
  tools = " and ".join(t for t, p in (("nvcc", NVCC), ("ptxas", PTXAS)) if p)
  write(f"GPU render sweep: {count} op-test kernels rendered for CUDA C and PTX, compiled for {ARCH} by {tools} "
        f"in {time.perf_counter() - start:.0f} s: {len(failures)} failed")
  for failure in failures[:20]: write(failure)
  if failures: session.exitstatus = pytest.ExitCode.TESTS_FAILED
