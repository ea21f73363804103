"""UPat, PatternMatcher and graph_rewrite: the one tool that transforms graphs at every stage."""
from __future__ import annotations
import inspect, itertools, operator
from typing import Any, Callable
from kiln.dtype import DType
from kiln.uop.ops import UOp, Ops

class UPat:
  """A pattern over UOps. `src` as a tuple matches in order; as a list it matches in any order (commutative ops).

  >>> from kiln.uop.pattern import UPat
  >>> from kiln.uop.ops import Ops
  >>> p = UPat(Ops.ADD, src=[UPat.var("x"), UPat.cvar("c")])
  """
  __slots__ = ("ops", "dtypes", "src", "arg", "name", "allow_any_len", "permutable", "_orders", "_any")
  def __init__(self, op: Ops | tuple[Ops, ...] | frozenset | None = None, dtype: DType | tuple[DType, ...] | None = None,
               src: tuple[UPat, ...] | list[UPat] | UPat | None = None, arg: Any = None, name: str | None = None,
               allow_any_len: bool = False):
    self.ops = None if op is None else (frozenset((op,)) if isinstance(op, Ops) else frozenset(op))
    self.dtypes = None if dtype is None else (frozenset((dtype,)) if isinstance(dtype, DType) else frozenset(dtype))
    self.permutable = isinstance(src, list)
    self.src = None if src is None else (tuple(src) if isinstance(src, (list, tuple)) else (src,))
    self.arg, self.name, self.allow_any_len = arg, name, allow_any_len
    # the source orders `match` tries, made once (a commutative pattern tries every order)
    self._orders = None if self.src is None else \
      tuple(itertools.permutations(self.src)) if self.permutable else (self.src,)
    # a pattern that matches every node (UPat.var): `match` binds it inline instead of calling itself
    self._any = self.ops is None and self.dtypes is None and self.arg is None and self.src is None

  @staticmethod
  def var(name: str | None = None, dtype=None) -> UPat:
    """A pattern that matches any node (of `dtype`, if given), bound to `name`."""
    return UPat(dtype=dtype, name=name)
  @staticmethod
  def cvar(name: str | None = None, dtype=None) -> UPat:
    """A pattern that matches any constant (a CONST node), bound to `name`."""
    return UPat(Ops.CONST, dtype=dtype, name=name, src=())
  @staticmethod
  def const(dtype, value) -> UPat:
    """A pattern that matches a constant equal to `value` (of `dtype`, unless None)."""
    return UPat(Ops.CONST, dtype=dtype, arg=value, src=())

  # building patterns with operators; ADD and MUL patterns match either operand order
  def _bin(self, op: Ops, other, commutative: bool) -> UPat:
    other = other if isinstance(other, UPat) else UPat(Ops.CONST, arg=other, src=())
    return UPat(op, src=[self, other] if commutative else (self, other))
  def __add__(self, other) -> UPat: return self._bin(Ops.ADD, other, True)
  def __mul__(self, other) -> UPat: return self._bin(Ops.MUL, other, True)
  def __floordiv__(self, other) -> UPat: return self._bin(Ops.IDIV, other, False)
  def __mod__(self, other) -> UPat: return self._bin(Ops.MOD, other, False)
  def lt(self, other) -> UPat:
    """A pattern for `self < other` (CMPLT, operands in this order)."""
    return self._bin(Ops.CMPLT, other, False)
  def ne(self, other) -> UPat:
    """A pattern for `self != other` (CMPNE, operands in either order)."""
    return self._bin(Ops.CMPNE, other, True)

  def match(self, u: UOp, store: dict) -> list[dict]:
    """All binding dicts under which `u` matches (empty list: no match)."""
    if self.ops is not None and u.op not in self.ops: return []
    if self.dtypes is not None and u.dtype not in self.dtypes: return []
    if self.arg is not None and not (u.arg == self.arg and type(u.arg) is type(self.arg) or
                                     isinstance(self.arg, (int, float)) and u.arg == self.arg and not isinstance(u.arg, bool)):
      return []
    if self.name is not None:
      if (bound := store.get(self.name)) is None: store = {**store, self.name: u}
      elif bound is not u: return []
    if self._orders is None: return [store]
    if len(u.src) != len(self.src) and not (self.allow_any_len and len(u.src) >= len(self.src)): return []
    results: list[dict] = []
    for pats in self._orders:
      stores = [store]
      for pat, s in zip(pats, u.src):
        if pat._any:   # matches anything: only its name is bound (or must be the node already bound to it)
          if (name := pat.name) is None: continue
          if len(stores) == 1:   # the usual case, without a comprehension's frame
            bound = (st := stores[0]).get(name)
            if bound is None: stores = [{**st, name: s}]
            elif bound is not s: stores = []
          else:
            stores = [st if bound is s else {**st, name: s} for st in stores
                      if (bound := st.get(name)) is None or bound is s]
        # one binding so far (the usual case): no list to flatten
        elif len(stores) == 1: stores = pat.match(s, stores[0])
        else: stores = [new for st in stores for new in pat.match(s, st)]
        if not stores: break
      results.extend(stores)
    return results

  def __repr__(self) -> str:
    ops = "|".join(sorted(o.name for o in self.ops)) if self.ops else "any"
    return f"UPat({ops}{', name=' + self.name if self.name else ''})"

RuleFn = Callable[..., UOp | None]
_memo_keys = itertools.count()   # each PatternMatcher's two keys in UOp._rewrites
_ABSENT = object()

def _remembered(node: UOp, key: int):
  """The result remembered for `node` under memo key `key` (None: the node itself), or _ABSENT."""
  memory = node._rewrites
  return _ABSENT if memory is None else memory.get(key, _ABSENT)

def _remember(node: UOp, key: int, result: UOp) -> None:
  """Note `result` as `node`'s final result under memo key `key`."""
  if (memory := node._rewrites) is None: node._rewrites = {key: None if result is node else result}
  else: memory[key] = None if result is node else result
_op_of, _dtype_of = operator.attrgetter("op"), operator.attrgetter("dtype")

class PatternMatcher:
  """An ordered list of `(UPat, fn)` rules. `rewrite(u)` returns the first non-None `fn(**bindings)` (or None).

  A rule function may take `ctx` as its first argument to receive the context passed to graph_rewrite.
  Rules are dispatched on the node's op first, so only rules that can match are tried.

  `pure=True` promises that what the rules return depends on nothing but the node (no ctx, no settings, no state):
  graph_rewrite then remembers each node's final result across calls, so a node already rewritten by an earlier call
  (an unchanged part of a kernel the optimizer rewrites after every action) is not matched again. The sum of two
  matchers is pure when both are.
  """
  def __init__(self, rules: list[tuple[UPat, RuleFn]], pure: bool = False):
    self.rules = rules
    self.pure = pure
    # the keys of this matcher's final results (None: the node itself) under top-down and bottom-up rewriting, kept
    # in each node's `_rewrites` dict: a node's entries go with the node, and a lookup is a plain dict's (a weak-keyed
    # dictionary made a weak reference per lookup). A result never holds its own node (the rewrite would not end).
    self.memo_keys: tuple[int, int] = (next(_memo_keys), next(_memo_keys))
    self.by_op: dict[Ops, list[tuple[UPat, RuleFn, bool]]] = {}
    self._by_op_dtype: dict[tuple[Ops, DType], list[tuple[UPat, RuleFn, bool]]] = {}   # filled by rules_for
    # (op, dtype, the sources' ops, their dtypes) -> the rules whose top two levels of patterns allow such a node:
    # most nodes a rewrite visits match no rule, and are told so by one lookup instead of a failed match per rule
    self._by_shape: dict[tuple, list[tuple[UPat, RuleFn, bool]]] = {}
    generic: list[tuple[UPat, RuleFn, bool]] = []
    for pat, fn in rules:
      wants_ctx = "ctx" in inspect.signature(fn).parameters
      entry = (pat, fn, wants_ctx)
      if pat.ops is None: generic.append(entry)
      else:
        for op in pat.ops: self.by_op.setdefault(op, []).append(entry)
    # rules without an op apply to every op, after the specific ones in their original order
    if generic:
      order = {id(fn): i for i, (_, fn) in enumerate(rules)}
      for op in Ops: self.by_op[op] = sorted(self.by_op.get(op, []) + generic, key=lambda e: order[id(e[1])])

  def __add__(self, other: PatternMatcher) -> PatternMatcher:
    return PatternMatcher(self.rules + other.rules, pure=self.pure and other.pure)

  def rules_for(self, op: Ops, dtype: DType) -> list[tuple[UPat, RuleFn, bool]]:
    """The rules that can match a node of `op` and `dtype` (their top pattern's op and dtype allow it), in order."""
    key = (op, dtype)
    if (found := self._by_op_dtype.get(key)) is None:
      found = self._by_op_dtype[key] = [e for e in self.by_op.get(op, ()) if e[0].dtypes is None or dtype in e[0].dtypes]
    return found

  def _rules_for_shape(self, key: tuple, u: UOp) -> list[tuple[UPat, RuleFn, bool]]:
    """The rules that can match a node shaped like `u` (its op and dtype, its sources' ops and dtypes; `key` says
    that shape, `_shape_key`): those of `rules_for(op, dtype)` whose pattern takes that many sources and, in some
    source order it tries, allows each source's op and dtype."""
    op, dtype = u.op, u.dtype
    src_ops, src_dtypes = tuple(s.op for s in u.src), tuple(s.dtype for s in u.src)
    def allows(order: tuple[UPat, ...]) -> bool:
      return all((p.ops is None or o in p.ops) and (p.dtypes is None or d in p.dtypes)
                 for p, o, d in zip(order, src_ops, src_dtypes))
    found = []
    for entry in self.rules_for(op, dtype):
      pat = entry[0]
      if pat.src is not None:
        if len(src_ops) != len(pat.src) and not (pat.allow_any_len and len(src_ops) >= len(pat.src)): continue
        if not any(allows(order) for order in pat._orders): continue
      found.append(entry)
    self._by_shape[key] = found
    return found

  def rewrite(self, u: UOp, ctx=None) -> UOp | None:
    """The result of the first rule that matches `u` and returns a new node, or None if none does."""
    src = u.src
    # the node's shape as a flat tuple, spelled out for the usual one and two sources (a third of the cost of
    # building the tuples of the sources' ops and dtypes; a rewrite is tried on every node built)
    if len(src) == 2:
      s0, s1 = src
      key = (u.op, u.dtype, s0.op, s0.dtype, s1.op, s1.dtype)
    elif len(src) == 1: key = (u.op, u.dtype, src[0].op, src[0].dtype)
    else: key = (u.op, u.dtype, len(src), tuple(map(_op_of, src)), tuple(map(_dtype_of, src)))
    # (a shape no rule can match has an empty list cached: tested against None, not for truth)
    if (rules := self._by_shape.get(key)) is None: rules = self._rules_for_shape(key, u)
    for pat, fn, wants_ctx in rules:
      for bindings in pat.match(u, {}):
        ret = fn(ctx, **bindings) if wants_ctx else fn(**bindings)
        if ret is not None and ret is not u: return ret
    return None

def graph_rewrite(root: UOp, pm: PatternMatcher, ctx=None, bottom_up: bool = False, name: str | None = None) -> UOp:
  """Rewrite every node under `root` with `pm` until no rule applies (iterative and memoized; any graph depth).

  Top-down (default) tries the rules on a node before its sources; bottom-up rewrites the sources first. Either way
  a node rebuilt from rewritten sources, and every rule's result, is rewritten again.
  """
  memo: dict[UOp, UOp] = {}
  known = pm.memo_keys[bottom_up] if pm.pure and ctx is None else None   # results of earlier calls
  found_known: set[UOp] = set()
  # stack entries: (original node, stage, current node)
  stack: list[tuple[UOp, int, UOp]] = [(root, 0, root)]
  while stack:
    orig, stage, cur = stack.pop()
    if stage == 0:
      if orig in memo: continue
      if known is not None and (memory := orig._rewrites) is not None and \
         (found := memory.get(known, _ABSENT)) is not _ABSENT:   # (_remembered, inline)
        memo[orig] = orig if found is None else found
        found_known.add(orig)
        continue
      if not bottom_up:
        steps = 0
        while (new := pm.rewrite(cur, ctx)) is not None:
          cur = new
          steps += 1
          if steps > 1000: raise RuntimeError(f"graph_rewrite{' ' + name if name else ''}: rules do not reach a fixed point at {cur.op}")
        if cur is not orig and cur in memo:
          memo[orig] = memo[cur]
          continue
      stack.append((orig, 1, cur))
      for s in reversed(cur.src):
        if s not in memo: stack.append((s, 0, s))
    elif stage == 1:
      new_src = tuple(memo[s] for s in cur.src)
      changed = new_src != cur.src   # UOps compare by identity: C-level `is` per pair
      rebuilt = cur.replace(src=new_src) if changed else cur
      new = pm.rewrite(rebuilt, ctx) if (bottom_up or changed) else None
      if new is None: memo[orig] = rebuilt
      else:
        stack.append((orig, 2, new))
        stack.append((new, 0, new))
    else:
      memo[orig] = memo[cur]
  if known is not None:
    for node, result in memo.items():
      if node not in found_known: _remember(node, known, result)
  return memo[root]

def settle(node: UOp, pm: PatternMatcher) -> UOp:
  """`node`, whose sources are already rewritten by `pm` (a fixed point), rewritten until no rule applies: its own
  rules are tried, and a rule's result (which may hold new nodes) is rewritten whole: `graph_rewrite(node, pm)`
  without walking the sources again. Building a graph bottom-up with `settle` on each new node costs one match per
  node no rule changes (the optimizer's copies of a kernel body: kiln/codegen/opt/kernel.py). For a pure `pm` the
  result is remembered, so a later graph_rewrite over a graph that holds `node` stops there."""
  if not pm.pure:
    new = pm.rewrite(node)
    return node if new is None else graph_rewrite(new, pm)
  known = pm.memo_keys[False]
  # (_remembered and _remember, inline: settle runs once per node the optimizer copies)
  memory = node._rewrites
  if memory is not None and (found := memory.get(known, _ABSENT)) is not _ABSENT:
    return node if found is None else found
  new = pm.rewrite(node)
  result = node if new is None else graph_rewrite(new, pm)
  memory = node._rewrites   # (read again: the rules may have remembered something for it meanwhile)
  if memory is None: node._rewrites = {known: None if result is node else result}
  else: memory[known] = None if result is node else result
  return result

def substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`root` with every node in `mapping` replaced (sources of replaced nodes are not visited). A rebuilt node keeps
  the user-facing label (`meta`) of the node it stands for."""
  memo: dict[UOp, UOp] = {}
  for node in _toposort_stop(root, mapping):
    if node in mapping: memo[node] = mapping[node]
    else:
      new_src = tuple(memo[s] for s in node.src)
      if new_src == node.src: memo[node] = node
      else:
        memo[node] = new = node.replace(src=new_src)
        if new.meta is None: new.meta = node.meta
  return memo[root]

def _toposort_stop(root: UOp, mapping: dict) -> list[UOp]:
  from kiln.uop.ops import toposort
  return toposort([root], stop=lambda u: u in mapping)
