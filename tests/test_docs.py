"""The docs site and the README as a reader meets them: built with warnings as errors, examples that run,
plots drawn from the committed results, links that lead somewhere."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_the_docs_build_with_warnings_as_errors_and_document_the_public_api(site):
    import gear_flow as gf

    assert (site / "index.html").exists() and (site / "benchmarks.html").exists()
    api = (site / "api.html").read_text()
    documented = {n for n in gf.__all__ if f"gear_flow.{n}.html" in api}
    assert set(gf.__all__) - documented == set()  # every public name has its page


@pytest.mark.parametrize(
    "page, names",
    [
        ("benchmarks", ("local", "distributed", "control_plane", "gpu")),
        ("concepts", ("storage", "sample_path", "insert_path")),
    ],
)
def test_the_pages_show_every_picture_drawn_at_build_time(site, page, names):
    """The benchmark plots (from the committed results) and the concept diagrams are on their pages, drawn."""
    from matplotlib.image import imread

    html = (site / f"{page}.html").read_text()
    for name in names:
        img = re.search(rf'<img[^>]+src="(_images/{name}\.png)"', html)
        assert img, name
        pixels = imread(site / img.group(1))
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400
        assert np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0).shape[0] > 20  # drawn, not blank


def _runnable_blocks():
    """The README's code blocks marked ``<!-- runnable: FILE -->``, with the file each is kept equal to."""
    return re.findall(r"<!-- runnable: (\S+) -->\n```python\n(.*?)```", README, flags=re.S)


#: every module's Examples run by the stdlib's doctest, in a process of their own (some register kinds)
_DOCTESTS = r"""
import doctest, importlib, json, sys
from pathlib import Path
import gear_flow

root = Path(gear_flow.__file__).parent
report = {"tried": 0, "failed": {}, "skipped": {}}
finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__main__":  # importing it runs the command line
        continue
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "gear_flow").split(".")[0] == "gear_flow":
            raise
        report["skipped"][name] = e.name  # an optional package (cupy, cudf, ...) absent here
        continue
    for test in finder.find(module, name):
        said = []
        result = runner.run(test, out=said.append)
        report["tried"] += result.attempted
        if result.failed:
            report["failed"][test.name] = "".join(said)
print(json.dumps(report))
"""


def test_the_packages_docstring_examples_run_as_written():
    """The Examples sections are doctests: a wrong one fails here (the docs site shows them, it runs none)."""
    r = subprocess.run([sys.executable, "-c", _DOCTESTS], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(r.stdout.splitlines()[-1])
    assert not report["failed"], "\n".join(report["failed"].values())
    assert report["tried"] > 200, report  # the walk found the modules (249 examples when written)


def test_the_readme_is_short_and_its_examples_are_the_docs_examples():
    assert len(README.splitlines()) <= 200
    blocks = _runnable_blocks()
    assert len(blocks) == 2
    for path, code in blocks:
        assert code == (REPO / path).read_text(), f"the README's copy of {path} drifted"


GPU_EXAMPLES = {"gpu_path.py"}  # need a CUDA device, CuPy and dask-cuda


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(p.name, marks=[pytest.mark.gpu] if p.name in GPU_EXAMPLES else [])
        for p in sorted((DOCS / "examples").glob("*.py"))
    ],
)
def test_every_example_runs_as_written(example, tmp_path):
    r = subprocess.run([sys.executable, str(DOCS / "examples" / example)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


def test_the_readme_links_lead_to_files_and_the_docs_link_within_the_site(site):
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not re.match(r"[a-z]+://", target):
            assert (REPO / target).exists(), target
    # Sphinx (with -W, above) refuses a missing {doc} or Markdown link; and every page is in a toctree
    pages = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")} - {"benchmarks_table"}
    built = {p.relative_to(site).with_suffix("").as_posix() for p in site.rglob("*.html")}
    assert pages <= built, pages - built
