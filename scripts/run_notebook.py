"""Execute examples/quickstart.ipynb on a Jupyter kernel and store its outputs in it
(what the documentation site renders): ``python scripts/run_notebook.py`` in an
environment with nbclient, ipykernel, tqdm and matplotlib (the ``bench`` tox env:
``.tox/bench/bin/python scripts/run_notebook.py``). CI executes the notebook in
``tests/examples/test_quickstart_notebook.py`` and checks its outputs there; this only
refreshes the stored copy. A progress bar's redraws are folded into its last frame."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"


def _last_frame(text: str) -> str:
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def main(path: Path = NOTEBOOK) -> int:
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": tmp}}).execute()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.execution_count = None
        merged: list = []
        for output in cell.outputs:
            if output.output_type == "execute_result":
                output.execution_count = None
            if (output.output_type == "stream" and merged
                    and merged[-1].output_type == "stream"
                    and merged[-1].name == output.name):
                merged[-1].text += output.text
            else:
                merged.append(output)
        for output in merged:
            if output.output_type == "stream":
                output.text = _last_frame(output.text)
        cell.outputs = merged
    nbformat.write(nb, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
