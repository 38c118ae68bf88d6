"""Sphinx configuration of the course website (``make site``): MyST-NB renders the chapters with
their stored outputs (nothing is executed), in the book theme, with MathJax served from the
build itself, so that the site builds and reads without a network."""

import importlib.util
from pathlib import Path

import icl_course

project = "icl-course: in-context learning as optimisation"
author = "The icl-course authors"
release = version = icl_course.__version__
copyright = "the icl-course authors, MIT license"

extensions = ["myst_nb"]
nb_execution_mode = "off"                 # the notebooks are stored executed (make notebooks)
nb_render_markdown_format = "myst"
nb_ipywidgets_js = {}                     # no widget manager from a CDN: each widget's static figure is stored
myst_enable_extensions = ["dollarmath", "amsmath"]
exclude_patterns = ["_build"]
suppress_warnings = ["mystnb.unknown_mime_type"]   # widget views: their static figure is shown instead

html_theme = "sphinx_book_theme"
html_title = "icl-course"
html_favicon = "favicon.svg"               # the browser asks every site for one: a missing icon is a 404
html_context = {"default_mode": "auto"}    # follow the reader's light or dark setting (the theme logs an
                                           # error when no mode is set)
html_theme_options = {
    "repository_url": "https://github.com/icl-course/icl-course",
    "repository_branch": "main",
    "path_to_docs": "",
    "use_repository_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "home_page_in_toc": True,
}
# MathJax 3 from the sphinx-mathjax-offline package, copied whole into the site (_static/mathjax): no
# CDN.  Its SVG output draws every glyph as a path, so it needs no font files (web fonts are refused to
# pages opened from file://) and the maths sits on the text's baseline.
_MATHJAX = importlib.util.find_spec("sphinx-mathjax-offline")
if _MATHJAX is None:
    raise ImportError("the site needs MathJax from the sphinx-mathjax-offline package: pip install -e '.[site]'")
html_static_path = [str(Path(_MATHJAX.origin).parent / "static")]
mathjax_path = "mathjax/tex-svg-full.js"
mathjax3_config = {"tex": {"inlineMath": [["$", "$"], ["\\(", "\\)"]], "processEscapes": True},
                   "svg": {"fontCache": "global"}}
html_search_language = "en"
