"""`python -m kiln.apps.llm`: see kiln/apps/llm/cli.py and docs/llm.md."""
import sys
from kiln.apps.llm.cli import main

if __name__ == "__main__":
  sys.exit(main())
