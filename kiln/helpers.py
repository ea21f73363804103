"""Small shared helpers: settings (getenv, ContextVar, Context), GlobalCounters, caches, and source locations."""
from __future__ import annotations
import contextlib, functools, math, os, sys, pathlib
from typing import Any, Iterable, TypeVar

T = TypeVar("T")

def prod(xs: Iterable, start=1):
  """The product of `xs` (works on ints and UOps)."""
  for x in xs: start = start * x
  return start

def all_same(xs) -> bool:
  """True if every item of `xs` equals the first (True for an empty list)."""
  return all(x == xs[0] for x in xs)
def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
  """The items of the iterables in `xss`, concatenated into one list (one level deep)."""
  return [x for xs in xss for x in xs]
def argsort(xs) -> list[int]:
  """The indices that put `xs` in ascending order, e.g. argsort([30, 10, 20]) -> [1, 2, 0]."""
  return sorted(range(len(xs)), key=xs.__getitem__)
def dedup(xs: Iterable[T]) -> list[T]:
  """The items of `xs` without repeats, in first-seen order."""
  return list(dict.fromkeys(xs))
def round_up(x: int, multiple: int) -> int:
  """`x` rounded up to a multiple of `multiple`."""
  return (x + multiple - 1) // multiple * multiple
def ceildiv(a, b):
  """a / b rounded up, for ints (ceiling division)."""
  return -(-a // b)

@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
  """Read an environment variable, converted to the type of `default`. `getenv("DEBUG")` -> 0 when unset."""
  return type(default)(os.environ.get(key, default))

# ---- settings: declared once, readable as ContextVar values, overridable with Context ----

class ContextVar:
  """A named integer/string setting. Its initial value comes from the environment; `Context` overrides it."""
  registry: dict[str, ContextVar] = {}
  def __init__(self, key: str, default: Any, doc: str):
    self.key, self.default, self.doc = key, default, doc
    self.value = type(default)(os.environ.get(key, default))
    ContextVar.registry[key] = self
  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, x) -> bool: return self.value >= x
  def __gt__(self, x) -> bool: return self.value > x
  def __lt__(self, x) -> bool: return self.value < x
  def __le__(self, x) -> bool: return self.value <= x
  def __eq__(self, x) -> bool: return self.value == x
  def __hash__(self) -> int: return hash(self.key)
  def __int__(self) -> int: return int(self.value)
  def __repr__(self) -> str: return f"{self.key}={self.value!r}"

class Context(contextlib.ContextDecorator):
  """Temporarily set settings: `with Context(DEBUG=2): ...` or `@Context(DEBUG=2)` on a function.

  >>> from kiln.helpers import Context, DEBUG
  >>> with Context(DEBUG=3): int(DEBUG)
  3
  """
  def __init__(self, **kwargs):
    unknown = [k for k in kwargs if k not in ContextVar.registry]
    if unknown: raise ValueError(f"Context: unknown setting(s) {unknown}; known: {sorted(ContextVar.registry)}")
    self.kwargs = kwargs
  def __enter__(self):
    self.saved = {k: ContextVar.registry[k].value for k in self.kwargs}
    for k, v in self.kwargs.items(): ContextVar.registry[k].value = v
    return self
  def __exit__(self, *exc):
    for k, v in self.saved.items(): ContextVar.registry[k].value = v

DEBUG = ContextVar("DEBUG", 0, "1: devices; 2: one line per kernel run (time, GFLOP/s, GB/s); 3: buffers; 4: kernel source; "
                   "5: kernel IR; 6: linearized uops")
SPEC = ContextVar("SPEC", 0, "1: check every graph against kiln/uop/spec.py after each stage (on in tests)")
NOOPT = ContextVar("NOOPT", 0, "1: turn off the kernel optimizer (kiln/codegen/opt: upcasts, unrolls, loop order)")
CACHELEVEL = ContextVar("CACHELEVEL", 2, "0: no on-disk compile cache; 2: cache compiled kernels on disk")
CACHEDB = ContextVar("CACHEDB", "", "where compiled kernels and BEAM results are cached (a folder; default: "
                     "XDG_CACHE_HOME/kiln). tinygrad's name; tinygrad keeps one sqlite file there")
TRACEBACK_SOURCE = ContextVar("TRACEBACK_SOURCE", 1, "1: record the user's file:line on each Tensor op (for errors)")
CC = ContextVar("CC", "", "C compiler for the CPU device (default: clang if on PATH, else gcc, else cc)")
CFLAGS = ContextVar("CFLAGS", "", "extra flags for the CPU device's C compiler, after its defaults (-O2 -march=native), "
                   "so a later -O or -march here wins")
VECTORIZE = ContextVar("VECTORIZE", 1, "1: the C renderer turns a kernel's upcast lanes into explicit vector code "
                       "(kiln/codegen/vectorize.py); 0: scalar C, left to the C compiler's vectorizer")
JIT = ContextVar("JIT", 1, "0: TinyJit runs the function eagerly every call; 2: replays without device graphs")

def settings_markdown() -> str:
  """The table of every declared setting, as written to docs/env_vars.md."""
  lines = ["# Settings (environment variables)", "",
           "Each setting is read from the environment at import and can be changed with `Context(NAME=value)`.", "",
           "| name | default | meaning |", "| --- | --- | --- |"]
  for var in sorted(ContextVar.registry.values(), key=lambda v: v.key):
    lines.append(f"| `{var.key}` | `{var.default!r}` | {var.doc} |")
  lines += ["", "Device selection (read once): `DEV=CPU|LLVM|PYTHON`, or `CPU=1` / `LLVM=1` / `PYTHON=1`.", ""]
  return "\n".join(lines)

class GlobalCounters:
  """Counts work done by realized kernels: kernels launched, ops, bytes moved, memory in use, time."""
  global_ops: int = 0
  global_mem: int = 0
  time_sum_s: float = 0.0
  kernel_count: int = 0
  mem_used: int = 0
  @staticmethod
  def reset() -> None:
    """Zero the op, memory-traffic, time and kernel counters (mem_used is left as is)."""
    GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.time_sum_s, GlobalCounters.kernel_count = 0, 0, 0.0, 0

def cache_dir() -> pathlib.Path:
  """Where compiled kernels are cached (XDG_CACHE_HOME/kiln or ~/.cache/kiln)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  path = pathlib.Path(base) / "kiln"
  path.mkdir(parents=True, exist_ok=True)
  return path

def kernel_cache_dir() -> pathlib.Path:
  """Where compiled kernels and BEAM's winners are cached: the folder CACHEDB names, else `cache_dir()`."""
  if not CACHEDB.value: return cache_dir()
  path = pathlib.Path(CACHEDB.value)
  if path.exists() and not path.is_dir():
    raise RuntimeError(f"CACHEDB={CACHEDB.value!r} is a file; kiln keeps its kernel cache in a folder there")
  path.mkdir(parents=True, exist_ok=True)
  return path

# ---- where the user called us from ----

_KILN_DIR = os.path.dirname(os.path.abspath(__file__))

# a code file's path -> its base name when it is the user's, None for kiln's own files and Python's frozen modules
# (a graph's every public Tensor call looks its caller up: the path tests and basename() were ~5% of building it)
_user_file_names: dict[str, str | None] = {}

def user_frame_location() -> str:
  """'file.py:LINE' of the innermost caller outside the kiln package ('' if none)."""
  frame = sys._getframe(1)
  names = _user_file_names
  while frame is not None:
    filename = frame.f_code.co_filename
    if (name := names.get(filename, "")) == "":
      if len(names) >= 4096: names.clear()   # bounded: exec'd code may name itself anything
      user = not filename.startswith(_KILN_DIR) and not filename.startswith("<frozen")
      name = names[filename] = os.path.basename(filename) if user else None
    if name is not None: return f"{name}:{frame.f_lineno}"
    frame = frame.f_back
  return ""

def fmt_time(seconds: float) -> str:
  """`seconds` as a fixed-width string in us, ms or s."""
  return f"{seconds*1e6:8.2f} us" if seconds < 1e-3 else f"{seconds*1e3:8.2f} ms" if seconds < 1 else f"{seconds:8.2f} s "

def colored(text: str, color: str) -> str:
  """`text` in an ANSI `color` ('red', 'green', ...) when stdout is a terminal, else unchanged."""
  codes = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36}
  return f"\033[{codes[color]}m{text}\033[0m" if sys.stdout.isatty() else text

def to_function_name(name: str) -> str:
  """`name` with every character other than letters, digits and '_' replaced by '_'."""
  return "".join(c if c.isalnum() or c == "_" else "_" for c in name)

def is_int_like(x) -> bool:
  """True for a Python int that is not a bool."""
  return isinstance(x, int) and not isinstance(x, bool)

def unwrap(x: T | None) -> T:
  """`x` itself, or a RuntimeError if it is None."""
  if x is None: raise RuntimeError("unexpected None")
  return x

def nan_safe(x: float) -> float:
  """`x`, or 0.0 if it is NaN."""
  return x if not math.isnan(x) else 0.0

# ---- a dependency-free progress bar ----

import time  # noqa: E402  (only the progress bar needs it)

class tqdm:
  """A minimal progress bar on stderr: `for x in tqdm(items, desc="train"): ...` or `bar.update(n)` by hand.

  Shows count, percent, rate and ETA, redrawn in place with '\\r' at most every `min_interval` seconds.
  `bar.set_description(f"loss {loss:.3f}")` changes the text in front of the bar. `unit_scale=True` writes counts
  and rates with SI prefixes (`1.5 MB`, `2.3 MB/s`), for byte counts. The bar goes to `file` (stderr by default) and
  is off when that is not a terminal, unless `disable=False` forces it on.

  >>> import io
  >>> out = io.StringIO()
  >>> for _ in tqdm(range(3), desc="demo", file=out, disable=False): pass
  >>> out.getvalue().splitlines()[-1].split("\\r")[-1].split(" [")[0]
  'demo: 100%|########################| 3/3'
  """
  def __init__(self, iterable: Iterable | None = None, total: int | None = None, desc: str = "",
               disable: bool | None = None, unit: str = "it", width: int = 24, min_interval: float = 0.1,
               unit_scale: bool = False, file: Any = None):
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
      total = len(iterable)  # type: ignore[arg-type]
    self.file = file if file is not None else sys.stderr
    if disable is None:  # by default only a terminal gets a bar; logs and pipes would fill with '\r' redraws
      disable = not (hasattr(self.file, "isatty") and self.file.isatty())
    self.iterable, self.total, self.desc, self.disable, self.unit = iterable, total, desc, disable, unit
    self.width, self.min_interval, self.unit_scale = width, min_interval, unit_scale
    self.count, self.start_time, self.last_draw, self.closed = 0, time.perf_counter(), -math.inf, False
    self.drawn_count, self.drawn_width = -1, 0

  def __iter__(self):
    if self.iterable is None: raise TypeError("tqdm: no iterable given; use update() instead")
    try:
      for item in self.iterable:
        yield item
        self.update(1)
    finally:
      self.close()

  def __len__(self) -> int: return self.total if self.total is not None else 0
  def __enter__(self) -> tqdm: return self
  def __exit__(self, *exc) -> None: self.close()

  def set_description(self, desc: str) -> None:
    """Change the text shown before the bar (redrawn at the next update)."""
    self.desc = desc

  def update(self, n: int = 1, close: bool = False) -> None:
    """Advance by `n` items and redraw if enough time passed (or when finished); `close=True` also ends the bar."""
    self.count += n
    if close: return self.close()
    now = time.perf_counter()
    if now - self.last_draw >= self.min_interval or (self.total is not None and self.count >= self.total):
      self.last_draw = now
      self._draw(now)

  def close(self) -> None:
    """Draw the final state and end the line."""
    if self.closed: return
    self.closed = True
    if not self.disable:
      if self.drawn_count != self.count: self._draw(time.perf_counter())
      self.file.write("\n")
      self.file.flush()

  def format(self, now: float) -> str:
    """The bar's text at time `now` (perf_counter seconds)."""
    elapsed = now - self.start_time
    rate = self.count / elapsed if elapsed > 0 else 0.0
    prefix = f"{self.desc}: " if self.desc else ""
    if self.unit_scale: speed = f"{_fmt_si(rate)}{self.unit}/s"
    else: speed = f"{rate:.2f} {self.unit}/s" if rate < 100 else f"{rate:.0f} {self.unit}/s"
    count = f"{_fmt_si(self.count)}{self.unit}" if self.unit_scale else f"{self.count} {self.unit}"
    if not self.total: return f"{prefix}{count} [{_fmt_clock(elapsed)}, {speed}]"
    fraction = min(self.count / self.total, 1.0)
    filled = int(fraction * self.width)
    bar = "#" * filled + "." * (self.width - filled)
    eta = (self.total - self.count) / rate if rate > 0 else math.inf
    counts = (f"{_fmt_si(self.count)}/{_fmt_si(self.total)}{self.unit}" if self.unit_scale
              else f"{self.count}/{self.total}")
    return (f"{prefix}{fraction*100:3.0f}%|{bar}| {counts} "
            f"[{_fmt_clock(elapsed)}<{_fmt_clock(eta)}, {speed}]")

  def _draw(self, now: float) -> None:
    if self.disable: return
    text = self.format(now)
    # pad with spaces so a shorter line fully covers the previous one
    self.file.write("\r" + text.ljust(self.drawn_width))
    self.file.flush()
    self.drawn_count, self.drawn_width = self.count, len(text)

def trange(n: int, desc: str = "", **kwargs) -> tqdm:
  """`tqdm(range(n))`: a progress bar over 0..n-1."""
  return tqdm(range(n), desc=desc, **kwargs)

def _fmt_si(value: float) -> str:
  """`value` with an SI prefix and a trailing space, e.g. 1500000 -> '1.50 M', 12 -> '12 '."""
  for prefix in ("", "k", "M", "G", "T"):
    if abs(value) < 1000 or prefix == "T": break
    value /= 1000
  return f"{value:.0f} " if prefix == "" and value == int(value) else f"{value:.2f} {prefix}"

def _fmt_clock(seconds: float) -> str:
  """Seconds as 'MM:SS' (or 'H:MM:SS'); '?' when unknown."""
  if math.isinf(seconds) or math.isnan(seconds): return "?"
  minutes, secs = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"

# ---- downloads with an on-disk cache ----

import gzip, hashlib, tempfile, urllib.error, urllib.request, zlib  # noqa: E402  (only fetch needs them)

FETCH_PROGRESS_BYTES = 1 << 20  # downloads at least this large (or of unknown size) get a progress bar

def fetch(url: str, name: str | pathlib.Path | None = None, subdir: str | None = None, gunzip: bool = False,
          allow_caching: bool | None = None, timeout: float = 30.0) -> pathlib.Path:
  """The local file holding `url`'s contents: downloaded once into `cache_dir()/downloads`, then read from there.

  `name` names the cached file (a path when it contains '/'; default: the URL's md5), `subdir` is a folder under
  the downloads folder, `gunzip=True` stores the decompressed contents. `allow_caching=False` (or the environment
  variable DISABLE_HTTP_CACHE=1) downloads again even when a copy exists. The file is written to a temporary name
  and renamed, so a reader never sees a partial download. A cached file needs no network; without one and without
  a network, a RuntimeError names the URL and where the file was expected. Local paths (starting with '/' or '.')
  are returned as they are (decompressed into the cache with `gunzip=True`); `file://` URLs are copied like downloads.

  >>> import pathlib, tempfile
  >>> source = pathlib.Path(tempfile.mkdtemp()) / "hello.txt"
  >>> _ = source.write_text("hi")
  >>> fetch(source.as_uri(), name="hello-doctest.txt", allow_caching=False).read_text()
  'hi'
  """
  if allow_caching is None: allow_caching = not int(os.environ.get("DISABLE_HTTP_CACHE", "0") or 0)
  if url.startswith(("/", ".")):
    local = pathlib.Path(url)
    if not local.is_file(): raise RuntimeError(f"fetch: no file at local path {url}")
    if not gunzip: return local
    url = local.resolve().as_uri()
  if name is not None and (isinstance(name, pathlib.Path) or "/" in name): target = pathlib.Path(name)
  else:
    file_name = (name or hashlib.md5(url.encode()).hexdigest()) + (".gunzip" if gunzip else "")
    target = cache_dir() / "downloads" / (subdir or "") / file_name
  if allow_caching and target.is_file(): return target
  target.parent.mkdir(parents=True, exist_ok=True)
  _download(url, target, gunzip, timeout)
  return target

def _download(url: str, target: pathlib.Path, gunzip: bool, timeout: float) -> None:
  """Write `url`'s contents (decompressed if `gunzip`) to `target` through a temporary file in the same folder."""
  tmp_name = None
  try:
    request = urllib.request.Request(url, headers={"User-Agent": "kiln"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
      length_header = response.headers.get("Content-Length") if hasattr(response, "headers") else None
      length = int(length_header) if length_header else None
      show_bar = None if length is None or length >= FETCH_PROGRESS_BYTES else True  # None: on if stderr is a TTY
      # the bar counts bytes received, so with gunzip it runs over the compressed size
      bar = tqdm(total=length, desc=url.rsplit("/", 1)[-1] or url, unit="B", unit_scale=True, disable=show_bar)
      counted = _CountingReader(response, bar)
      stream = gzip.GzipFile(fileobj=counted) if gunzip else counted
      with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as tmp:
        tmp_name = tmp.name
        while chunk := stream.read(1 << 16): tmp.write(chunk)
      bar.close()
      if length is not None and counted.received < length:
        raise RuntimeError(f"fetch: download of {url} is incomplete: {counted.received} of {length} bytes")
    os.replace(tmp_name, target)  # atomic: a concurrent reader sees the old file or the whole new one
    tmp_name = None
  except urllib.error.HTTPError as error:
    raise RuntimeError(f"fetch: {url} answered HTTP {error.code} {error.reason}; nothing cached at {target}") from None
  except (gzip.BadGzipFile, EOFError, zlib.error) as error:
    raise RuntimeError(f"fetch: {url} is not valid gzip data ({error}) but gunzip=True was asked for") from None
  except OSError as error:
    reason = getattr(error, "reason", error)
    raise RuntimeError(f"fetch: could not download {url} ({type(error).__name__}: {reason}) and there is no cached "
                       f"copy at {target}; without a network, put the file there (or pass a local path)") from None
  finally:
    if tmp_name is not None and os.path.exists(tmp_name): os.unlink(tmp_name)

class _CountingReader:
  """A read-only file object over `raw` that reports the bytes read to a progress bar."""
  def __init__(self, raw: Any, bar: tqdm):
    self.raw, self.bar, self.received = raw, bar, 0
  def read(self, size: int = -1) -> bytes:
    data = self.raw.read(size)
    self.received += len(data)
    self.bar.update(len(data))
    return data
