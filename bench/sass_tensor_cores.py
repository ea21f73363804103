"""The SASS of the tensor-core test kernels (test/runtime/test_tensor_cores.py), run on a GPU machine with the CUDA
toolkit: each built from CUDA C (NVRTC) and from PTX (ptxas), its tensor-core, ldmatrix and cp.async opcodes counted
(`cuobjdump --dump-sass`). Writes sass_summary.txt (and two full listings) under $OUT. Run from the repository root:
`PYTHONPATH=. OUT=<folder> python3 bench/sass_tensor_cores.py` (bench/gpu_notes.md, helper tcir)."""
import collections, os, re, subprocess, sys
sys.path[:0] = [".", "test/runtime"]
from test_tensor_cores import (CUDARenderer, PTXRenderer, MMA_F16, MMA_BF16, TENSOR_CORES,   # noqa: E402
                               pipeline_kernel, staged_copy_kernel, wmma_kernel)
from kiln.runtime import cuda_driver as cuda   # noqa: E402

OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")
KEPT = re.compile(r"(HMMA|QMMA|IMMA|LDSM|LDGSTS|LDGDEPBAR|DEPBAR|F2FP|PRMT|BAR)")

def main() -> None:
  """Build, disassemble and count every kernel; print and write the summary."""
  out = os.environ.get("OUT", ".")
  arch = cuda.Context(0).properties.arch
  kernels = {"pipeline_f16": pipeline_kernel(MMA_F16, 11), "pipeline_bf16": pipeline_kernel(MMA_BF16, 16),
             "staged_cp16": staged_copy_kernel(16, "cg")}
  for tc in TENSOR_CORES: kernels["loop_" + tc.instruction.split(".")[7]] = wmma_kernel(tc, loop=3)[0]
  report = [f"arch {arch}"]
  for name, uops in kernels.items():
    for kind in ("cuda", "ptx"):
      base = f"/tmp/{name}_{kind}"
      if kind == "cuda":
        cubin = cuda.NVRTCCompiler(arch).compile(CUDARenderer(arch).render("tc_kernel", uops))
        with open(base + ".cubin", "wb") as f: f.write(cubin)
      else:
        with open(base + ".ptx", "w") as f: f.write(PTXRenderer(arch).render("tc_kernel", uops))
        subprocess.run(["ptxas", f"-arch={arch}", "-o", base + ".cubin", base + ".ptx"], check=True)
      sass = subprocess.run(["cuobjdump", "--dump-sass", base + ".cubin"], capture_output=True, text=True).stdout
      counts = collections.Counter(m.group(1) for m in OPCODE.finditer(sass))
      report.append(f"{name} {kind}: {dict(sorted((k, v) for k, v in counts.items() if KEPT.match(k)))}")
      if name == "pipeline_f16" or (name == "loop_e4m3" and kind == "cuda"):
        with open(f"{out}/sass_{name}_{kind}.txt", "w") as f: f.write(sass)
  with open(f"{out}/sass_summary.txt", "w") as f: f.write("\n".join(report) + "\n")
  print("\n".join(report))

if __name__ == "__main__": main()
