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

# numpydoc's docstring checks (https://numpydoc.readthedocs.io/en/latest/validation.html) that every
# public docstring rendered here passes today; a new docstring that breaks one fails the build (-W).
# Not yet enforced, with the count of public objects that fail each (numpydoc 1.11, 383 objects):
# ES01 extended summary 222, EX01 Examples 358, SA01 See Also 361, GL08 no docstring 22 (properties
# and small methods), PR01 parameters not documented 172, PR02 unknown parameters 1, PR03 order 1,
# PR04 no type 26, PR06 "integer" for "int" 1, PR07 no description 13, PR08 capital letter 7, PR09
# final period 1, RT01 no Returns 130, RT02 1, RT03 no return description 18, SS02 capital 4, SS05
# infinitive verb 20, SS06 one-line summary 33, GL02 closing quotes 7, GL07 section order 1,
# YD01 no Yields 6; and, counting the constants and fields autodoc shows (their `#:` comments):
# SS03 summary without a final period 22, GL03 a double blank line 1.
numpydoc_validation_checks = {
    "GL01",  # the text starts on the line of the opening quotes
    "GL05",  # no tabs
    "GL06",  # no unknown section
    "GL09",  # deprecation warning placement
    "GL10",  # reST admonitions
    "SS01",  # a summary line exists
    "SS04",  # no leading whitespace in the summary
    "PR05",  # a parameter type does not end with a period
    "PR10",  # "name : type", with the spaces
    "RT04",  # a return description starts with a capital letter
    "RT05",  # and ends with a period
    "SA02",  # See Also: period
    "SA03",  # See Also: capital letter
    "SA04",  # See Also: descriptions
}

html_theme = "furo"
html_title = f"distkit {release}"
html_static_path = ["_static"]
html_css_files = ["distkit.css"]
html_show_sourcelink = False
