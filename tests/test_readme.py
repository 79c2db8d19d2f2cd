"""The README's example must run as written."""

import pathlib
import re


def test_readme_example_runs():
    text = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    code = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["scores"].shape == (81,)
    assert namespace["dwell"].shape == (81, 16)
    assert 0 <= namespace["best"] < 81
