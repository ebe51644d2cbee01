"""Sphinx configuration of distkit's documentation (built by `nox -s docs`, warnings as errors).

autodoc imports the installed packages (the nox session installs the wheels it builds), so the API
pages show what users get. No extension here reaches the network: the build machines are offline.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

project = "distkit"
author = "the distkit developers"
copyright = "the distkit developers, MIT licence"
release = version = (ROOT / "VERSION").read_text().strip()

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "tests", "examples", "README.md"]
root_doc = "index"

# MyST: GitHub-style anchors for headings (`[x](page.md#a-heading)`), ::: fences, definition lists
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

# autodoc: the public names of each package, as its __all__ lists them, in source order
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# a method that overrides torch.Tensor's (FakeTensor.copy_) would show torch's docstring, whose
# references point into torch's own documentation
autodoc_inherit_docstrings = False
autodoc_default_options = {"members": True}
autosummary_generate = False

# numpydoc renders the Parameters / Returns / Raises sections; the member tables come from autodoc
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "furo"
html_title = f"distkit {release}"
html_static_path = ["_static"]
html_css_files = ["distkit.css"]
html_show_sourcelink = False
