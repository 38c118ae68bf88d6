"""Sphinx configuration of the course website (``make site``): MyST-NB renders the chapters with
their stored outputs (nothing is executed), in the book theme, with MathJax served from the
build itself, so that the site builds and reads without a network."""

from pathlib import Path

import jupyter_server_mathjax

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
html_theme_options = {
    "repository_url": "https://github.com/icl-course/icl-course",
    "repository_branch": "main",
    "path_to_docs": "",
    "use_repository_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "home_page_in_toc": True,
}
# MathJax 2.7 from the jupyter-server-mathjax package, copied into the site: no CDN
html_static_path = [str(Path(jupyter_server_mathjax.__file__).parent / "static")]
mathjax_path = "MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
# the package ships the STIX-Web fonts of the HTML-CSS output, as Jupyter's classic notebook uses them
mathjax2_config = {"tex2jax": {"inlineMath": [["$", "$"], ["\\(", "\\)"]], "processEscapes": True,
                               "ignoreClass": "document", "processClass": "math|output_area"},
                   "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web",
                                "imageFont": None}}
html_search_language = "en"
