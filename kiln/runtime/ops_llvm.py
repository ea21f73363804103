"""The LLVM device: kernels rendered to LLVM IR, compiled in process by llvmlite (no C compiler needed), run through
ctypes. Object code is cached on disk like the CPU device's libraries, keyed by the source and the host CPU.

Kernels are compiled for the host CPU (its name and features, as -march=native) by LLVM's O3 pipeline with the loop
and SLP vectorizers, and launched as the CPU device's are (kiln/runtime/ops_cpu.py, CPUProgram): a kernel with a thread
plan (kiln/renderer/llvmir.py) runs its `<name>_task` entry point on the shared thread pool. The CPU device itself
compiles with this module's compiler and programs under CPU_LLVM=1, or where no C compiler is found.
"""
from __future__ import annotations
import ctypes, functools, itertools, re
from kiln.device import Compiled, Compiler, CompileError, HostAllocator
from kiln.renderer import kernel_function_name
from kiln.renderer.cstyle import chunks_symbol, scratch_symbol, task_symbol, work_symbol
from kiln.renderer.llvmir import LLVMRenderer
from kiln.runtime.cpu_target import host_target
from kiln.runtime.ops_cpu import CPUProgram
from kiln.runtime.threadpool import POOL_LIBRARY_FALLBACKS

OPT_LEVEL = 3   # LLVM's full O3 pipeline for the target machine and the pass builder
# with its loop and SLP vectorizers, unrolling and interleaving (the renderer forbids unrolling long loops, where it
# slowed memory-bound kernels: kiln/renderer/llvmir.py, unroll_hint)
PIPELINE_TUNING = {"loop_vectorization": True, "slp_vectorization": True, "loop_unrolling": True,
                   "loop_interleaving": True}

def _llvm():
  """The llvmlite binding module, with a clear error when llvmlite is not installed."""
  try: import llvmlite.binding as llvm
  except ImportError:
    raise RuntimeError("the LLVM device needs llvmlite: pip install 'kiln[llvm]' (or pip install llvmlite)") from None
  return llvm

@functools.cache
def host_target_machine():
  """An O3 target machine for this CPU with all its features (the equivalent of -march=native)."""
  llvm = _llvm()
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=OPT_LEVEL, reloc="pic", codemodel=CODE_MODEL)

# the large code model: the JIT's linker (RuntimeDyld) places a kernel's code and its constants (vector constant
# pools) in separate allocations that can land more than 2 GiB apart once a process has mapped enough (DISK tensors,
# many kernel libraries), and the small model's 32-bit PC-relative references to them then overflow (an assertion
# that aborted the process)
CODE_MODEL = "large"

@functools.cache
def _jit():
  """The process's one ORC JIT; each kernel is linked into it as its own library."""
  return _llvm().create_lljit_compiler(host_target_machine())

@functools.cache
def _target_id() -> str:
  """What the object code depends on besides the source: LLVM version, triple, CPU name and features."""
  llvm = _llvm()
  return (f"llvm{'.'.join(map(str, llvm.llvm_version_info))} {host_target_machine().triple} "
          f"{llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}")

class LLVMCompiler(Compiler):
  """LLVM IR text -> object code: parse, verify, optimize at O3 (PIPELINE_TUNING) for the host CPU, emit an object
  file."""
  # llvmlite calls LLVM through ctypes (the GIL released) under its own lock: compiles on background threads run one
  # at a time, but overlap the Python codegen of the next kernels (kiln/device.py, CompilePipeline)
  runs_in_subprocess = True
  def cache_key(self) -> str:
    """Class name, optimization level and the target the code is made for (see _target_id)."""
    tuning = " ".join(f"{k}={v}" for k, v in PIPELINE_TUNING.items())
    return f"{type(self).__name__} O{OPT_LEVEL} {CODE_MODEL} {tuning} {_target_id()}"

  def compile(self, src: str) -> bytes:
    """Compile `src` to the bytes of an object file; CompileError (naming the kernel) on failure."""
    llvm = _llvm()
    match = re.search(r"define void @(\w+)\(", src)
    kernel = match.group(1) if match else "<unnamed kernel>"
    machine = host_target_machine()
    try:
      module = llvm.parse_assembly(src)
      module.verify()
    except RuntimeError as e: raise CompileError(f"compiling kernel {kernel}: invalid LLVM IR: {e}") from None
    module.triple, module.data_layout = machine.triple, str(machine.target_data)
    tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    for option, value in PIPELINE_TUNING.items(): setattr(tuning, option, value)
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(module, passes)
    return machine.emit_object(module)

_library_ids = itertools.count()

def _defines(lib: bytes, symbol: str) -> bool:
  """Whether the object file `lib` names `symbol` (its string table holds each name between NUL bytes)."""
  return b"\0" + symbol.encode() + b"\0" in lib

class LLVMProgram(CPUProgram):
  """A kernel linked into the process's JIT from object bytes. Call as `prg(*bufs, vals=(...), wait=False)`: launched
  as a CPU kernel (CPUProgram: on the thread pool when it has a thread plan and enough work, else on this thread)."""
  def __init__(self, name: str, lib: bytes):   # noqa: the library is linked here, CPUProgram.__init__ loads a .so
    llvm = _llvm()
    self.name = kernel_function_name(name)
    threaded = [s for s in (task_symbol(self.name), work_symbol(self.name), chunks_symbol(self.name),
                            scratch_symbol(self.name)) if _defines(lib, s)]
    builder = llvm.JITLibraryBuilder().add_object_img(lib).add_current_process().export_symbol(self.name)
    for symbol in threaded: builder.export_symbol(symbol)
    try: self.tracker = builder.link(_jit(), f"kiln_{self.name}_{next(_library_ids)}")
    except RuntimeError as e:   # e.g. a symbol no library in the process defines
      raise RuntimeError(f"could not link kernel {self.name} into the JIT: {e}") from None
    self.address = self.tracker[self.name]
    self.fxn = ctypes.CFUNCTYPE(None)(self.address)
    self._arg_counts: tuple[int, int] | None = None
    def constant(symbol: str) -> int: return ctypes.c_longlong.from_address(self.tracker[symbol]).value
    if task_symbol(self.name) in threaded:
      self.task: int | None = self.tracker[task_symbol(self.name)]
      self.work = constant(work_symbol(self.name))
    else: self.task, self.work = None, 0
    if chunks_symbol(self.name) in threaded:
      self.chunks, self.scratch_bytes = constant(chunks_symbol(self.name)), constant(scratch_symbol(self.name))
    else: self.chunks = self.scratch_bytes = 0


# ---- the thread pool without a C compiler ----
# kiln/runtime/threadpool.py's pool (POOL_SOURCE: its algorithm, claims and spinning are described there) is C, built
# with the CPU device's compiler. Where none is installed (a pip-only machine), this is the same pool written in LLVM
# IR and JIT-compiled here; threadpool.py loads it when the C build fails (POOL_LIBRARY_FALLBACKS). It calls only libc
# (pthreads, calloc, clock_gettime, sched_yield), which the JIT resolves in this process.
POOL_IR = r"""; the pool state: locks and condition variables get 64 bytes each (glibc: 40/48 on x86-64, aarch64)
%pool = type { [64 x i8], [64 x i8], [64 x i8], [64 x i8], i64, i32, i32, i32, i32, i32, i64, ptr, ptr, ptr }
; fields: 0 run_lock, 1 lock, 2 wake, 3 done, 4 claim (generation << 32 | nchunks << 16 | next chunk),
; 5 finished, 6 sleepers, 7 stop, 8 nworkers, 9 generation (the caller's copy), 10 spin_ns, 11 task, 12 bufs, 13 vals
%worker = type { ptr, i64 }   ; the pool, the pthread_t

declare ptr @calloc(i64, i64)
declare void @free(ptr)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_join(i64, ptr)
declare i32 @pthread_mutex_init(ptr, ptr)
declare i32 @pthread_mutex_lock(ptr)
declare i32 @pthread_mutex_unlock(ptr)
declare i32 @pthread_cond_init(ptr, ptr)
declare i32 @pthread_cond_wait(ptr, ptr)
declare i32 @pthread_cond_broadcast(ptr)
declare i32 @clock_gettime(i32, ptr)
declare i32 @sched_yield()

define internal i64 @now_ns() {
  %t = alloca { i64, i64 }
  call i32 @clock_gettime(i32 1, ptr %t)
  %sp = getelementptr { i64, i64 }, ptr %t, i32 0, i32 0
  %s = load i64, ptr %sp
  %np = getelementptr { i64, i64 }, ptr %t, i32 0, i32 1
  %n = load i64, ptr %np
  %sn = mul i64 %s, 1000000000
  %r = add i64 %sn, %n
  ret i64 %r
}

; spins while `done(pool, arg)` is false, yielding every 64 polls, for up to spin_ns; returns whether it became true
define internal i1 @spin(ptr %pool, ptr %done, i32 %arg) {
entry:
  %spinp = getelementptr %pool, ptr %pool, i32 0, i32 10
  %spin_ns = load i64, ptr %spinp
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %i1, %relax ]
  %deadline = phi i64 [ 0, %entry ], [ %deadline1, %relax ]
  %ok = call i1 %done(ptr %pool, i32 %arg)
  br i1 %ok, label %yes, label %poll
poll:
  %low = and i32 %i, 63
  %check = icmp eq i32 %low, 0
  br i1 %check, label %clock, label %relax
clock:
  %first = icmp eq i32 %i, 0
  br i1 %first, label %start, label %later
start:
  %t0 = call i64 @now_ns()
  %d0 = add i64 %t0, %spin_ns
  br label %relax
later:
  call i32 @sched_yield()   ; a busy machine: let a thread that has work have this core
  %t = call i64 @now_ns()
  %over = icmp sgt i64 %t, %deadline
  br i1 %over, label %no, label %relax
relax:
  %deadline1 = phi i64 [ %deadline, %poll ], [ %d0, %start ], [ %deadline, %later ]
{relax}  %i1 = add i32 %i, 1
  br label %loop
yes:
  ret i1 true
no:
  ret i1 false
}

define internal i32 @claim_generation(ptr %pool) {
  %cp = getelementptr %pool, ptr %pool, i32 0, i32 4
  %claim = load atomic i64, ptr %cp acquire, align 8
  %g = lshr i64 %claim, 32
  %g32 = trunc i64 %g to i32
  ret i32 %g32
}

define internal i1 @launch_after(ptr %pool, i32 %seen) {
  %now = call i32 @claim_generation(ptr %pool)
  %new = icmp ne i32 %now, %seen
  ret i1 %new
}

define internal i1 @all_finished(ptr %pool, i32 %nchunks) {
  %fp = getelementptr %pool, ptr %pool, i32 0, i32 5
  %f = load atomic i32, ptr %fp acquire, align 4
  %eq = icmp eq i32 %f, %nchunks
  ret i1 %eq
}

; runs chunks of launch `generation` until none is left to claim
define internal void @take_chunks(ptr %pool, i32 %generation) {
entry:
  %cp = getelementptr %pool, ptr %pool, i32 0, i32 4
  %first = load atomic i64, ptr %cp acquire, align 8
  br label %loop
loop:
  %claim = phi i64 [ %first, %entry ], [ %seen, %retry ], [ %next_claim, %ran ]
  %g = lshr i64 %claim, 32
  %g32 = trunc i64 %g to i32
  %n64 = lshr i64 %claim, 16
  %n16 = and i64 %n64, 65535
  %nchunks = trunc i64 %n16 to i32
  %c16 = and i64 %claim, 65535
  %chunk = trunc i64 %c16 to i32
  %same = icmp eq i32 %g32, %generation
  %left = icmp ult i32 %chunk, %nchunks
  %go = and i1 %same, %left
  br i1 %go, label %try, label %out
try:
  %plus = add i64 %claim, 1
  %pair = cmpxchg weak ptr %cp, i64 %claim, i64 %plus acq_rel acquire, align 8
  %seen = extractvalue { i64, i1 } %pair, 0
  %won = extractvalue { i64, i1 } %pair, 1
  br i1 %won, label %run, label %retry
retry:
  br label %loop
run:
  %taskp = getelementptr %pool, ptr %pool, i32 0, i32 11
  %task = load ptr, ptr %taskp
  %bufsp = getelementptr %pool, ptr %pool, i32 0, i32 12
  %bufs = load ptr, ptr %bufsp
  %valsp = getelementptr %pool, ptr %pool, i32 0, i32 13
  %vals = load ptr, ptr %valsp
  call void %task(ptr %bufs, ptr %vals, i32 %chunk, i32 %nchunks)
  %fp = getelementptr %pool, ptr %pool, i32 0, i32 5
  %before = atomicrmw add ptr %fp, i32 1 acq_rel, align 4
  %after = add i32 %before, 1
  %last = icmp eq i32 %after, %nchunks
  br i1 %last, label %signal, label %ran
signal:
  %lock = getelementptr %pool, ptr %pool, i32 0, i32 1
  %donecv = getelementptr %pool, ptr %pool, i32 0, i32 3
  call i32 @pthread_mutex_lock(ptr %lock)
  call i32 @pthread_cond_broadcast(ptr %donecv)
  call i32 @pthread_mutex_unlock(ptr %lock)
  br label %ran
ran:
  %next_claim = load atomic i64, ptr %cp acquire, align 8
  br label %loop
out:
  ret void
}

; a worker: waits (spinning, then sleeping) for a launch newer than `seen`, and returns its generation
define internal i32 @wait_for_launch(ptr %pool, i32 %seen) {
entry:
  %quick = call i1 @spin(ptr %pool, ptr @launch_after, i32 %seen)
  br i1 %quick, label %done, label %sleep
sleep:
  %lock = getelementptr %pool, ptr %pool, i32 0, i32 1
  %wake = getelementptr %pool, ptr %pool, i32 0, i32 2
  %sleepers = getelementptr %pool, ptr %pool, i32 0, i32 6
  call i32 @pthread_mutex_lock(ptr %lock)
  br label %check
check:
  %new = call i1 @launch_after(ptr %pool, i32 %seen)
  br i1 %new, label %woke, label %wait
wait:
  %s = load i32, ptr %sleepers
  %s1 = add i32 %s, 1
  store i32 %s1, ptr %sleepers
  call i32 @pthread_cond_wait(ptr %wake, ptr %lock)
  %s2 = load i32, ptr %sleepers
  %s3 = sub i32 %s2, 1
  store i32 %s3, ptr %sleepers
  br label %check
woke:
  call i32 @pthread_mutex_unlock(ptr %lock)
  br label %done
done:
  %now = call i32 @claim_generation(ptr %pool)
  ret i32 %now
}

define internal ptr @worker_main(ptr %arg) {
entry:
  %pool = load ptr, ptr %arg
  %stopp = getelementptr %pool, ptr %pool, i32 0, i32 7
  br label %loop
loop:
  %seen = phi i32 [ 0, %entry ], [ %now, %work ]
  %now = call i32 @wait_for_launch(ptr %pool, i32 %seen)
  %stop = load volatile i32, ptr %stopp
  %stopping = icmp ne i32 %stop, 0
  br i1 %stopping, label %out, label %work
work:
  call void @take_chunks(ptr %pool, i32 %now)
  br label %loop
out:
  ret ptr null
}

; makes launch `nchunks` visible to the workers and wakes the sleeping ones
define internal void @publish(ptr %pool, i32 %nchunks) {
  %fp = getelementptr %pool, ptr %pool, i32 0, i32 5
  store atomic i32 0, ptr %fp monotonic, align 4
  %gp = getelementptr %pool, ptr %pool, i32 0, i32 9
  %g = load i32, ptr %gp
  %g1 = add i32 %g, 1
  store i32 %g1, ptr %gp
  %gw = zext i32 %g1 to i64
  %gs = shl i64 %gw, 32
  %nw = zext i32 %nchunks to i64
  %ns = shl i64 %nw, 16
  %claim = or i64 %gs, %ns
  %cp = getelementptr %pool, ptr %pool, i32 0, i32 4
  store atomic i64 %claim, ptr %cp release, align 8
  %lock = getelementptr %pool, ptr %pool, i32 0, i32 1
  %wake = getelementptr %pool, ptr %pool, i32 0, i32 2
  %sleepersp = getelementptr %pool, ptr %pool, i32 0, i32 6
  call i32 @pthread_mutex_lock(ptr %lock)
  %sleepers = load i32, ptr %sleepersp
  %any = icmp ne i32 %sleepers, 0
  br i1 %any, label %wakeup, label %out
wakeup:
  call i32 @pthread_cond_broadcast(ptr %wake)
  br label %out
out:
  call i32 @pthread_mutex_unlock(ptr %lock)
  ret void
}

define internal void @wait_finished(ptr %pool, i32 %nchunks) {
entry:
  %quick = call i1 @spin(ptr %pool, ptr @all_finished, i32 %nchunks)
  br i1 %quick, label %out, label %sleep
sleep:
  %lock = getelementptr %pool, ptr %pool, i32 0, i32 1
  %donecv = getelementptr %pool, ptr %pool, i32 0, i32 3
  call i32 @pthread_mutex_lock(ptr %lock)
  br label %check
check:
  %finished = call i1 @all_finished(ptr %pool, i32 %nchunks)
  br i1 %finished, label %unlock, label %wait
wait:
  call i32 @pthread_cond_wait(ptr %donecv, ptr %lock)
  br label %check
unlock:
  call i32 @pthread_mutex_unlock(ptr %lock)
  br label %out
out:
  ret void
}

define internal void @stop_workers(ptr %pool, i32 %started) {
entry:
  %stopp = getelementptr %pool, ptr %pool, i32 0, i32 7
  store volatile i32 1, ptr %stopp
  call void @publish(ptr %pool, i32 0)
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %i1, %join ]
  %more = icmp slt i32 %i, %started
  br i1 %more, label %join, label %out
join:
  %base = getelementptr %pool, ptr %pool, i32 1
  %w = getelementptr inbounds %worker, ptr %base, i32 %i, i32 1
  %thread = load i64, ptr %w
  call i32 @pthread_join(i64 %thread, ptr null)
  %i1 = add i32 %i, 1
  br label %loop
out:
  ret void
}

define ptr @kiln_pool_create(i32 %nthreads, i64 %spin_ns) {
entry:
  %has_workers = icmp sgt i32 %nthreads, 1
  %n1 = sub i32 %nthreads, 1
  %nworkers = select i1 %has_workers, i32 %n1, i32 0
  %nw64 = zext i32 %nworkers to i64
  %wbytes = mul i64 %nw64, 16
  %pool_end = getelementptr %pool, ptr null, i32 1
  %pool_bytes = ptrtoint ptr %pool_end to i64
  %bytes = add i64 %wbytes, %pool_bytes
  %pool = call ptr @calloc(i64 1, i64 %bytes)
  %failed = icmp eq ptr %pool, null
  br i1 %failed, label %fail_alloc, label %init
fail_alloc:
  ret ptr null
init:
  %run_lock = getelementptr %pool, ptr %pool, i32 0, i32 0
  %lock = getelementptr %pool, ptr %pool, i32 0, i32 1
  %wake = getelementptr %pool, ptr %pool, i32 0, i32 2
  %donecv = getelementptr %pool, ptr %pool, i32 0, i32 3
  call i32 @pthread_mutex_init(ptr %run_lock, ptr null)
  call i32 @pthread_mutex_init(ptr %lock, ptr null)
  call i32 @pthread_cond_init(ptr %wake, ptr null)
  call i32 @pthread_cond_init(ptr %donecv, ptr null)
  %spinp = getelementptr %pool, ptr %pool, i32 0, i32 10
  store i64 %spin_ns, ptr %spinp
  %nwp = getelementptr %pool, ptr %pool, i32 0, i32 8
  %base = getelementptr %pool, ptr %pool, i32 1   ; the workers follow the pool
  br label %loop
loop:
  %i = phi i32 [ 0, %init ], [ %i1, %started ]
  %more = icmp slt i32 %i, %nworkers
  br i1 %more, label %start, label %done
start:
  %w = getelementptr inbounds %worker, ptr %base, i32 %i
  store ptr %pool, ptr %w
  %tp = getelementptr inbounds %worker, ptr %base, i32 %i, i32 1
  %rc = call i32 @pthread_create(ptr %tp, ptr null, ptr @worker_main, ptr %w)
  %bad = icmp ne i32 %rc, 0
  br i1 %bad, label %fail, label %started
started:
  %i1 = add i32 %i, 1
  store i32 %i1, ptr %nwp
  br label %loop
fail:   ; stop the ones already started
  call void @stop_workers(ptr %pool, i32 %i)
  call void @free(ptr %pool)
  ret ptr null
done:
  ret ptr %pool
}

define i32 @kiln_pool_size(ptr %pool) {
  %nwp = getelementptr %pool, ptr %pool, i32 0, i32 8
  %nw = load i32, ptr %nwp
  %size = add i32 %nw, 1
  ret i32 %size
}

; task(bufs, vals, chunk, nchunks) for every chunk < nchunks (at most 65535), on the pool's threads and the caller
define void @kiln_pool_run(ptr %pool, ptr %task, ptr %bufs, ptr %vals, i32 %requested) {
entry:
  %big = icmp sgt i32 %requested, 65535
  %nchunks = select i1 %big, i32 65535, i32 %requested
  %nwp = getelementptr %pool, ptr %pool, i32 0, i32 8
  %nw = load i32, ptr %nwp
  %few = icmp sle i32 %nchunks, 1
  %alone = icmp eq i32 %nw, 0
  %here = or i1 %few, %alone
  br i1 %here, label %serial, label %launch
serial:
  %count = select i1 %few, i32 1, i32 %nchunks
  br label %serial_loop
serial_loop:
  %i = phi i32 [ 0, %serial ], [ %i1, %serial_body ]
  %more = icmp slt i32 %i, %count
  br i1 %more, label %serial_body, label %out
serial_body:
  call void %task(ptr %bufs, ptr %vals, i32 %i, i32 %count)
  %i1 = add i32 %i, 1
  br label %serial_loop
launch:
  %run_lock = getelementptr %pool, ptr %pool, i32 0, i32 0
  call i32 @pthread_mutex_lock(ptr %run_lock)
  %taskp = getelementptr %pool, ptr %pool, i32 0, i32 11
  store ptr %task, ptr %taskp
  %bufsp = getelementptr %pool, ptr %pool, i32 0, i32 12
  store ptr %bufs, ptr %bufsp
  %valsp = getelementptr %pool, ptr %pool, i32 0, i32 13
  store ptr %vals, ptr %valsp
  call void @publish(ptr %pool, i32 %nchunks)
  %gp = getelementptr %pool, ptr %pool, i32 0, i32 9
  %g = load i32, ptr %gp
  call void @take_chunks(ptr %pool, i32 %g)
  call void @wait_finished(ptr %pool, i32 %nchunks)
  call i32 @pthread_mutex_unlock(ptr %run_lock)
  br label %out
out:
  ret void
}

define void @kiln_pool_destroy(ptr %pool) {
  %run_lock = getelementptr %pool, ptr %pool, i32 0, i32 0
  call i32 @pthread_mutex_lock(ptr %run_lock)
  %nwp = getelementptr %pool, ptr %pool, i32 0, i32 8
  %nw = load i32, ptr %nwp
  call void @stop_workers(ptr %pool, i32 %nw)
  call i32 @pthread_mutex_unlock(ptr %run_lock)
  call void @free(ptr %pool)
  ret void
}
"""
# how a spinning thread tells the core it is waiting (x86's `pause`, arm64's `yield`; nothing elsewhere)
_RELAX = {"x86_64": ("  call void @llvm.x86.sse2.pause()\n", "declare void @llvm.x86.sse2.pause()\n"),
          "aarch64": ("  call void @llvm.aarch64.hint(i32 1)\n", "declare void @llvm.aarch64.hint(i32)\n")}
_POOL_FUNCTIONS = {   # name -> (argument types, result type), as threadpool.py's ctypes bindings of the C pool
  "kiln_pool_create": ([ctypes.c_int, ctypes.c_longlong], ctypes.c_void_p),
  "kiln_pool_run": ([ctypes.c_void_p] * 4 + [ctypes.c_int], None),
  "kiln_pool_destroy": ([ctypes.c_void_p], None), "kiln_pool_size": ([ctypes.c_void_p], ctypes.c_int)}

class LLVMPoolLibrary:
  """The JIT-compiled POOL_IR, with the C pool library's functions as ctypes attributes (`kiln_pool_run`, ...)."""
  def __init__(self):
    llvm = _llvm()
    machine = host_target_machine()
    relax, declaration = _RELAX.get(machine.triple.split("-")[0], ("", ""))
    source = declaration + POOL_IR.replace("{relax}", relax)
    builder = llvm.JITLibraryBuilder().add_object_img(LLVMCompiler().compile_cached(source)).add_current_process()
    for name in _POOL_FUNCTIONS: builder.export_symbol(name)
    self.tracker = builder.link(_jit(), f"kiln_pool_{next(_library_ids)}")
    for name, (argtypes, restype) in _POOL_FUNCTIONS.items():
      function = ctypes.CFUNCTYPE(restype, *argtypes)(self.tracker[name])
      function.argtypes, function.restype = argtypes, restype
      setattr(self, name, function)

@functools.cache
def llvm_pool_library() -> LLVMPoolLibrary:
  """The LLVM-built pool, compiled once per process (a fallback for threadpool.py when no C compiler is found)."""
  return LLVMPoolLibrary()

POOL_LIBRARY_FALLBACKS.append(llvm_pool_library)

class LLVMDevice(Compiled):
  """Host memory (the same format as CPU, so copies between them are memcpy), kernels JIT-compiled by LLVM."""
  def __init__(self, device: str = "LLVM"):
    _llvm()   # fail when the device is opened, not at the first kernel
    super().__init__(device, HostAllocator(), LLVMRenderer(), LLVMCompiler(), LLVMProgram)
    self.renderer.describe_target = host_target   # compiled for the host CPU, all its features (-march=native)
