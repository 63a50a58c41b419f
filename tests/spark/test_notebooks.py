"""The notebooks under notebooks/ run end to end (nbclient), so they never rot."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from conftest import REPO, python_env  # noqa: E402

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    # The kernel is a child process and inherits os.environ: this checkout's
    # sources first on PYTHONPATH, a Java that Spark 4.3 accepts.
    env = python_env()
    for key in ("PYTHONPATH", "JAVA_HOME", "PATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.setenv(key, env[key])
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is stored with outputs; clear them"
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    # A cell that draws a figure must have rendered it (inline backend: image/png).
    figures = [c for c in nb.cells if c.cell_type == "code" and "plt.subplots" in c.source]
    if "matplotlib" in "".join(c.source for c in nb.cells if c.cell_type == "code"):
        assert figures, f"{path.name} imports matplotlib but draws nothing"
    for cell in figures:
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), \
            f"{path.name}: the figure cell rendered no image/png:\n{cell.source}"
