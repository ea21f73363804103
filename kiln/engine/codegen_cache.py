"""An on-disk cache of codegen results: a kernel AST -> its rendered source and what loading the binary needs.

The compile cache (kiln/device.py) saves the compiler's work, but it is keyed by the source: without this cache every
process still lowers, optimizes, linearizes and renders each kernel before it can look its binary up (30-50 ms of
Python per kernel; the anchors' transformer graph: 11 kernels). Here the codegen output is keyed by

- the AST's structure (every node's op, dtype, argument and sources, in graph order),
- the device, its renderer, the compiler's cache key (flags and host CPU) and every setting but DEBUG,
- the code of kiln itself: a digest of all its source files, so a changed compiler never serves old source.

Off under SPEC=1 (each stage's graph must be built to be checked), DEBUG>=4 (the stages print what they make),
CACHELEVEL=0 and CODEGEN_CACHE=0. Kernels over symbolic sizes (Variables) are not cached.
"""
from __future__ import annotations
import enum, functools, hashlib, json, os, pathlib, struct, tempfile
from dataclasses import dataclass
from kiln.device import Device
from kiln.dtype import DType
from kiln.helpers import CACHELEVEL, DEBUG, SPEC, ContextVar, kernel_cache_dir
from kiln.uop.ops import UOp, toposort

CODEGEN_CACHE = ContextVar("CODEGEN_CACHE", 1, "1: cache each kernel's rendered source on disk, keyed by its AST, "
                           "the settings and kiln's own code (a later process skips codegen); 0: off")
_FORMAT = 2   # bump when the stored fields change

@dataclass(frozen=True)
class CodegenEntry:
  """What a CompiledRunner needs besides the binary: the kernel's name, source, ALU ops per launch and the schedule
  item's buffer numbers it takes, in order, and on a GPU its (grid, block) launch sizes (and dynamic shared bytes,
  a third element, where it has some)."""
  name: str
  source: str
  ops: int
  params: tuple[int, ...]
  launch: tuple | None = None

def enabled() -> bool:
  """Whether the cache is consulted now."""
  return bool(CODEGEN_CACHE) and CACHELEVEL >= 1 and not SPEC and DEBUG < 4

@functools.cache
def _code_digest() -> str:
  """A digest of every kiln source file (read once per process, ~1 ms)."""
  root = pathlib.Path(__file__).resolve().parents[1]
  digest = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
  return digest.hexdigest()

def _arg_text(arg) -> str:
  """A text form of a UOp argument that is the same in every process; TypeError for one that has none."""
  if arg is None or type(arg) in (bool, int, str): return repr(arg)
  if type(arg) is float: return f"f{arg.hex()}" if arg == arg else f"n{struct.pack('>d', arg).hex()}"   # NaN's sign
  if isinstance(arg, (enum.Enum, DType)): return repr(arg)
  if type(arg) is tuple: return "(" + ",".join(_arg_text(a) for a in arg) + ")"
  raise TypeError(f"no stable text for a {type(arg).__name__} argument")

_settings_texts: dict[tuple, str] = {}   # what `_settings_text` depends on -> the text

def _settings_text(device: str) -> str:
  """The device, its renderer, its compiler's cache key, every setting but DEBUG and kiln's code, as text. The
  settings' part (~45 us: every setting's value, sorted) is made again only after a setting was set or declared."""
  dev = Device[device]
  state = (device, type(dev.renderer).__name__, dev.compiler.cache_key(), ContextVar.changes, len(ContextVar.registry))
  if (text := _settings_texts.get(state)) is not None: return text
  settings = sorted((key, repr(var.value)) for key, var in ContextVar.registry.items() if key != "DEBUG")
  text = f"{device}\0{state[1]}\0{state[2]}\0{settings}\0{_code_digest()}"
  if len(_settings_texts) >= 64: _settings_texts.clear()
  _settings_texts[state] = text
  return text

@functools.lru_cache(maxsize=4096)
def _ast_digest(ast: UOp) -> str | None:
  """A digest of the AST's structure, or None when it has an argument without a stable text form."""
  nodes = toposort([ast])
  index = {node: i for i, node in enumerate(nodes)}
  try: lines = [f"{n.op.name}|{n.dtype!r}|{_arg_text(n.arg)}|{','.join(str(index[s]) for s in n.src)}" for n in nodes]
  except TypeError: return None
  return hashlib.sha256("\n".join(lines).encode()).hexdigest()

def _key(device: str, ast: UOp) -> str | None:
  """The cache key of `ast` on `device` under the current settings, or None when the AST cannot have one."""
  if (digest := _ast_digest(ast)) is None: return None
  return hashlib.sha256(f"{_FORMAT}\0{_settings_text(device)}\0{digest}".encode()).hexdigest()

def _path(key: str) -> pathlib.Path: return kernel_cache_dir() / "codegen" / key[:2] / key

def lookup(device: str, ast: UOp) -> CodegenEntry | None:
  """The stored codegen result of `ast` on `device`, or None (not stored, unreadable, or the cache is off)."""
  if not enabled() or (key := _key(device, ast)) is None: return None
  try: data = json.loads(_path(key).read_text())
  except (OSError, ValueError): return None
  try:
    launch = data.get("launch")
    return CodegenEntry(str(data["name"]), str(data["source"]), int(data["ops"]), tuple(int(p) for p in data["params"]),
                        None if launch is None else
                        tuple(int(d) if isinstance(d, int) else tuple(int(x) for x in d) for d in launch))
  except (KeyError, TypeError, ValueError): return None

def store(device: str, ast: UOp, entry: CodegenEntry) -> None:
  """Remember `entry` as the codegen result of `ast` on `device` (a failure to write is only reported)."""
  if not enabled() or (key := _key(device, ast)) is None: return
  path = _path(key)
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
      json.dump({"name": entry.name, "source": entry.source, "ops": entry.ops, "params": list(entry.params),
                 "launch": entry.launch}, tmp)
    os.replace(tmp.name, path)   # atomic: readers see either no file or the whole file
  except OSError as e:
    if DEBUG >= 1: print(f"codegen cache: could not write {path}: {e}")
