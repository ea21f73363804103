#!/usr/bin/env python3
"""Write docs/env_vars.md from kiln's settings registry (`kiln.helpers.settings_markdown()`).

  python tools/gen_env_docs.py          # rewrite docs/env_vars.md
  python tools/gen_env_docs.py --check  # exit 1 if docs/env_vars.md is out of date
  python tools/gen_env_docs.py --stdout # print the generated text

Settings are declared where they are used (`ContextVar(...)` at module level), so every kiln module is imported
first to register them. A module that fails to import is reported on stderr and skipped.
"""
from __future__ import annotations
import argparse, importlib, pathlib, pkgutil, sys

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV_DOCS = REPO_ROOT / "docs" / "env_vars.md"
# modules that run something when imported (an app's entry point) are not needed for their settings
SKIPPED_MODULES: set[str] = set()

def import_all_kiln_modules() -> list[str]:
  """Import every module of the kiln package so their settings register; returns the ones that failed."""
  sys.path.insert(0, str(REPO_ROOT))
  import kiln.helpers  # noqa: F401  (the registry itself; must work)
  failed: dict[str, str] = {}
  def record_failure(name: str) -> None: failed.setdefault(name, f"{name} (package failed to import)")
  kiln_dir = REPO_ROOT / "kiln"
  for module in pkgutil.walk_packages([str(kiln_dir)], prefix="kiln.", onerror=record_failure):
    if module.name in SKIPPED_MODULES or module.name.endswith("__main__"): continue
    try:
      importlib.import_module(module.name)
    except Exception as error:  # noqa: BLE001  (any failure: report it, keep going)
      failed[module.name] = f"{module.name} ({type(error).__name__}: {error})"
  return list(failed.values())

def generate() -> str:
  """The text of docs/env_vars.md."""
  failed = import_all_kiln_modules()
  for name in failed: print(f"gen_env_docs: could not import {name}; its settings are not listed", file=sys.stderr)
  from kiln.helpers import settings_markdown
  return settings_markdown()

def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="exit 1 if docs/env_vars.md differs from the registry")
  parser.add_argument("--stdout", action="store_true", help="print the text instead of writing the file")
  args = parser.parse_args()
  text = generate()
  if args.stdout:
    sys.stdout.write(text)
    return 0
  if args.check:
    current = ENV_DOCS.read_text() if ENV_DOCS.exists() else ""
    if current != text:
      print(f"{ENV_DOCS.relative_to(REPO_ROOT)} is out of date: run python tools/gen_env_docs.py", file=sys.stderr)
      return 1
    return 0
  ENV_DOCS.write_text(text)
  print(f"wrote {ENV_DOCS.relative_to(REPO_ROOT)}")
  return 0

if __name__ == "__main__":
  sys.exit(main())
