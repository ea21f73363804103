"""Run the ONNX backend node tests against kiln outside pytest and print one line per failure.

python test/frontend/onnx_node_report.py [REGEX] [--out FILE]: REGEX selects tests (default: all of them); each test
gets 120 s. Used to refresh onnx_expected_failures.txt and the pass count in docs/onnx.md.
"""
import argparse, re, signal, time, unittest
import onnx.backend.test
from kiln.frontend import onnx_backend

def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("pattern", nargs="?", default=".*")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  backend_test = onnx.backend.test.BackendTest(onnx_backend, __name__)
  cases = []
  for case_class in backend_test.test_cases.values():
    for name in sorted(dir(case_class)):
      if name.startswith("test_") and name.endswith("_cpu") and re.search(args.pattern, name):
        if "OnnxBackendNodeModelTest" in case_class.__name__: cases.append(case_class(name))
  passed, failed, start = 0, [], time.time()
  def on_alarm(*_): raise TimeoutError("took over 120 s")
  signal.signal(signal.SIGALRM, on_alarm)
  for case in cases:
    result = unittest.TestResult()
    signal.alarm(120)
    try: case.run(result)
    except TimeoutError as err: result.errors.append((case, str(err)))
    finally: signal.alarm(0)
    problems = result.errors + result.failures
    if not problems and not result.skipped: passed += 1
    else:
      text = problems[0][1].strip().splitlines()[-1][:300] if problems else "skipped"
      failed.append((case._testMethodName, text))
      print(f"FAIL {case._testMethodName}: {text}", flush=True)
  summary = f"{passed} of {len(cases)} passed in {time.time() - start:.0f} s"
  print(summary)
  if args.out:
    with open(args.out, "w") as f:
      f.write(summary + "\n" + "".join(f"{name}\t{text}\n" for name, text in failed))

if __name__ == "__main__": main()
