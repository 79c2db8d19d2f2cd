"""Run-time type checks of the annotations (jaxtyping shapes and dtypes, beartype) in one
dedicated job: the fast files that exercise the public surface most widely run again, in a
fresh process, with `--jaxtyping-packages=jaxctbn,beartype.beartype`, which checks every call
of every function of the package against its annotations. (Those files run only here:
conftest.py leaves them out of a run without the checks unless they are named. For the whole
suite that hook cost about 15% of its time and 9 s of import per worker; the annotations are
also checked statically by pyright in `make test`.)"""

import os
import subprocess
import sys

from conftest import RUNTIME_TYPED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = RUNTIME_TYPED


def test_annotations_hold_at_run_time():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
        + ["--jaxtyping-packages=jaxctbn,beartype.beartype"]
        + [os.path.join(ROOT, "tests", f) for f in FILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
