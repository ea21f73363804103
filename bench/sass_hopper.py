"""The SASS of the Hopper test kernels (test/runtime/test_hopper_ops.py: the warp-specialized TMA + wgmma GEMM), run
on a GPU machine with the CUDA toolkit: each built from CUDA C by NVRTC for the GPU's arch, its wgmma, TMA, mbarrier
and setmaxnreg opcodes counted (`cuobjdump --dump-sass`). Writes sass_hopper.txt (and one full listing) under $OUT.
Run from the repository root: `PYTHONPATH=. OUT=<folder> python3 bench/sass_hopper.py` (bench/gpu_notes.md, helper
hopper)."""
import collections, os, re, subprocess, sys
sys.path[:0] = [".", "test/runtime"]
from test_hopper_ops import CUDARenderer, gemm_kernel   # noqa: E402
from kiln.runtime import cuda_driver as cuda   # noqa: E402

OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")
KEPT = re.compile(r"(HGMMA|WARPGROUP|UTMALDG|UTMA|SYNCS|USETMAXREG|BAR|FENCE|HMMA)")

def main() -> None:
  """Build, disassemble and count each kernel; print and write the summary."""
  out = os.environ.get("OUT", ".")
  arch = cuda.Context(0).properties.arch
  report = [f"arch {arch}"]
  for n, k, bk in ((64, 128, 64), (256, 192, 64), (16, 64, 32)):
    name = f"gemm_n{n}_k{k}_bk{bk}"
    cubin = cuda.NVRTCCompiler(arch).compile(CUDARenderer(arch).render("hopper_kernel", gemm_kernel(n, k, bk)))
    with open(f"/tmp/{name}.cubin", "wb") as f: f.write(cubin)
    sass = subprocess.run(["cuobjdump", "--dump-sass", f"/tmp/{name}.cubin"], capture_output=True, text=True).stdout
    counts = collections.Counter(m.group(1) for m in OPCODE.finditer(sass))
    report.append(f"{name}: {dict(sorted((key, v) for key, v in counts.items() if KEPT.match(key)))}")
    if n == 64:
      with open(f"{out}/sass_{name}.txt", "w") as f: f.write(sass)
  with open(f"{out}/sass_hopper.txt", "w") as f: f.write("\n".join(report) + "\n")
  print("\n".join(report))

if __name__ == "__main__": main()
