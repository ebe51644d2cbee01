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
# Not yet enforced (numpydoc 1.11, 2026-12-02): ES01 extended summary, EX01 Examples and SA01 See
# Also, which most objects lack.
# Not validated: names whose docstring numpydoc reads is not a function's or class's docstring.
# Constants (UPPER_CASE): autodoc shows their `#:` comment, a phrase, not a numpydoc docstring
# (numpydoc reports GL02/SS02/SS03/SS06 on it); names a module imports from the standard library
# (typing.Any, collections.abc.Mapping, dataclasses.dataclass) carry the standard library's
# docstring; an Enum's signature is Enum's functional API (PR01 on names/module/qualname/...).
numpydoc_validation_exclude = {
    r"\.[A-Z][A-Z0-9_]*$",
    r"\.(Any|Mapping|dataclass)$",
    r"^wholemem\.WmTensorType$",
    # @overload dispatchers: the signature numpydoc sees is (*args, **kwargs); the docstring
    # documents the two call forms (WholeGraph's, and a GraphStructure first), as the overloads
    r"^wholemem\.(un)?weighted_sample_without_replacement$",
    # dataclass fields whose class attribute is the default None: numpydoc validates the value
    # (None has no docstring: GL08); each is documented in its class's Parameters section
    r"^distkit_common\.testing\.ClusterResult\.(fault_at|ended_after_fault)$",
    r"^distkit_common\.testing\.cluster\.Cluster\.rate$",
}
numpydoc_validation_checks = {
    "GL01",  # the text starts on the line of the opening quotes
    "GL05",  # no tabs
    "GL06",  # no unknown section
    "GL09",  # deprecation warning placement
    "GL10",  # reST admonitions
    "SS01",  # a summary line exists
    "SS02",  # the summary starts with a capital letter (or a number)
    "SS03",  # and ends with a period
    "SS04",  # no leading whitespace in the summary
    "PR05",  # a parameter type does not end with a period
    "PR10",  # "name : type", with the spaces
    "RT04",  # a return description starts with a capital letter
    "RT05",  # and ends with a period
    "SA02",  # See Also: period
    "SA03",  # See Also: capital letter
    "SA04",  # See Also: descriptions
    "GL03",  # no double blank lines
    "GL07",  # sections in numpydoc's order
    "PR03",  # parameters in the signature's order
    "PR04",  # every parameter has a type
    "PR06",  # "int", "bool", "str" (not "integer", "boolean", "string")
    "PR07",  # every parameter has a description
    "PR08",  # a parameter description starts with a capital letter
    "PR09",  # and ends with a period
    "RT02",  # Returns: the type only, when the value is unnamed
    "RT03",  # every return value has a description
    "SS05",  # the summary starts with an infinitive verb ("Return", not "Returns")
    "PR01",  # every parameter is documented
    "PR02",  # no documented parameter the signature lacks
    "GL02",  # closing quotes on their own line
    "SS06",  # a one-line summary
    "YD01",  # a generator (context manager) has a Yields section
    "RT01",  # a Returns section
}

html_theme = "furo"
html_title = f"distkit {release}"
html_static_path = ["_static"]
html_css_files = ["distkit.css"]
html_show_sourcelink = False
