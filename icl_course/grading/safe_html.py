"""Feedback pages that run no script, whatever the learner's notebook holds.

A feedback page shows what a learner wrote and what their code printed: Markdown, exception texts,
outputs and the outputs' metadata.  Each of them could carry markup that runs a script when the page
is opened (``<img onerror=...>``, an image ``width`` that closes its attribute) or clicked
(``[x](javascript:...)``).  Three layers keep them inert:

* :func:`clean_outputs`, on the notebook: outputs keep only plain text, PNG/JPEG/GIF images whose data
  is base64, streams and errors; every output's metadata goes (nothing learner-made reaches an
  attribute of the template unquoted);
* :func:`sanitise_page`, on the page that nbconvert made: an allow-list rewrite that drops scripts,
  frames, forms, objects, ``<base>``/``<meta>``/``<link>``, every ``on...`` attribute and every link
  that is not ``http(s)`` or an in-page ``#anchor``; images only from ``data:image/...`` (others are
  replaced by their alt text: offline they would be broken); every attribute re-quoted;
* a Content-Security-Policy in the page's head that allows no script but the grader's own (listed by
  hash: MathJax, inline, to render the maths offline), so that whatever a browser parses differently
  from Python's parser still runs nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import html
import re
from html.parser import HTMLParser

__all__ = ["clean_outputs", "sanitise_page", "content_security_policy"]

_IMAGES = ("image/png", "image/jpeg", "image/gif")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
MAX_OUTPUT_CHARS = 4 * 2**20   # one output's data in a feedback page; longer ones are replaced by a note


def _base64(text) -> bool:
    if not isinstance(text, str) or not _BASE64.fullmatch(text):
        return False
    try:
        base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def clean_outputs(notebook) -> None:
    """Keep only inert outputs in ``notebook`` (in place): text, base64 images, streams and errors, no metadata."""
    for cell in notebook.cells:
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            output["metadata"] = {}
            if output.get("output_type") not in ("display_data", "execute_result"):
                continue
            data = output.get("data", {})
            kept = {}
            text = data.get("text/plain")
            if isinstance(text, list):
                text = "".join(str(part) for part in text)
            if isinstance(text, str):
                kept["text/plain"] = text
            for kind in _IMAGES:
                if _base64(data.get(kind)):
                    kept[kind] = data[kind]
                    break
            if sum(len(value) for value in kept.values()) > MAX_OUTPUT_CHARS:
                kept = {"text/plain": f"(an output of {sum(len(v) for v in kept.values()) / 2**20:.0f} MB, "
                                      "left out of this page)"}
            if not kept and data:
                kept = {"text/plain": f"(an output of type {', '.join(sorted(map(str, data)))[:200]}, "
                                      "not shown in this page)"}
            output["data"] = kept


# elements dropped with everything inside them
_DROPPED = {"script", "iframe", "frame", "frameset", "object", "embed", "applet", "form", "base", "meta", "link",
            "noscript", "template", "animate", "animatemotion", "animatetransform", "set", "handler", "listener",
            "portal", "fencedframe", "math-script"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track",
         "wbr", "frame"}
_URL_ATTRIBUTES = {"href", "src", "xlink:href", "action", "formaction", "poster", "background", "data", "codebase",
                   "cite", "longdesc", "usemap", "dynsrc", "lowsrc", "ping", "manifest", "icon", "profile"}
_NEVER = {"srcset", "srcdoc", "imagesrcset", "http-equiv", "attributename", "values", "from", "to", "by", "begin"}
_NAME = re.compile(r"[a-zA-Z_:][-a-zA-Z0-9_:.]*")
_TAG = re.compile(r"[a-zA-Z][a-zA-Z0-9-]*")
_CONTROL = re.compile(r"[\x00-\x20\x7f]+")
_IMAGE_DATA = re.compile(r"data:image/(png|jpeg|gif);base64,", re.I)


def _allowed_link(value: str) -> bool:
    plain = _CONTROL.sub("", html.unescape(value)).lower()
    return plain.startswith(("http://", "https://", "#"))


class _Sanitiser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.parts: list[str] = []
        self.dropping: list[str] = []   # the open dropped elements, innermost last
        self.raw: str | None = None     # inside <style>: its text is CSS, not markup

    def _attributes(self, tag: str, attributes) -> str | None:
        """The attributes as safe markup, or None when the element should become its alt text."""
        kept = []
        for name, value in attributes:
            name = name.lower()
            if not _NAME.fullmatch(name) or name.startswith("on") or name in _NEVER:
                continue
            if name in _URL_ATTRIBUTES:
                value = value or ""
                if tag == "img" and name == "src":
                    if not _IMAGE_DATA.match(_CONTROL.sub("", value)):
                        return None
                elif not _allowed_link(value):
                    continue
            if name == "style" and value and re.search(r"url\s*\(|expression|javascript|@import", value, re.I):
                continue
            kept.append(name if value is None else f'{name}="{html.escape(value, quote=True)}"')
        return "".join(" " + item for item in kept)

    def _start(self, tag, attributes, closing: bool):
        if self.dropping:
            if tag not in _VOID and not closing:
                self.dropping.append(tag)
            return
        if tag in _DROPPED or not _TAG.fullmatch(tag):
            if tag not in _VOID and not closing and _TAG.fullmatch(tag):
                self.dropping.append(tag)
            return
        rendered = self._attributes(tag, attributes)
        if rendered is None:   # an image from outside the page: its alt text instead
            alt = dict(attributes).get("alt") or ""
            self.parts.append(html.escape(alt))
            return
        self.parts.append(f"<{tag}{rendered}{' /' if closing else ''}>")
        if tag == "style" and not closing:
            self.raw = tag

    def handle_starttag(self, tag, attrs):
        self._start(tag, attrs, closing=False)

    def handle_startendtag(self, tag, attrs):
        self._start(tag, attrs, closing=True)

    def handle_endtag(self, tag):
        if self.dropping:
            if tag in self.dropping:
                while self.dropping and self.dropping.pop() != tag:
                    pass
            return
        if tag in _DROPPED or not _TAG.fullmatch(tag):
            return
        if tag == self.raw:
            self.raw = None
        self.parts.append(f"</{tag}>")

    def handle_data(self, data):
        if self.dropping:
            return
        # in CSS no "<" is needed; elsewhere a stray "<" is shown, never parsed again as a tag
        self.parts.append(data.replace("<", "") if self.raw else data.replace("<", "&lt;"))

    def handle_entityref(self, name):
        if not self.dropping:
            self.parts.append(f"&{name};" if _NAME.fullmatch(name) else html.escape(f"&{name}"))

    def handle_charref(self, name):
        if not self.dropping:
            self.parts.append(f"&#{name};" if re.fullmatch(r"[xX]?[0-9a-fA-F]+", name) else "")

    def handle_decl(self, decl):
        if not self.dropping and decl.lower().startswith("doctype"):
            self.parts.append("<!DOCTYPE html>")

    # comments, processing instructions and CDATA sections are dropped
    def handle_comment(self, data):
        pass

    def handle_pi(self, data):
        pass

    def unknown_decl(self, data):
        pass


def content_security_policy(scripts: tuple = ()) -> str:
    """The page's policy: no script but ``scripts`` (their exact texts, by hash), images from the page itself."""
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()}'"
                      for text in scripts)
    return (f"default-src 'none'; script-src {hashes or chr(39) + 'none' + chr(39)}; style-src 'unsafe-inline'; "
            "img-src data:; font-src data:; base-uri 'none'; form-action 'none'")


def sanitise_page(page: str, scripts: tuple = (), style: str = "") -> str:
    """``page`` rewritten by the allow-list above; its head then starts with the policy, ``style`` (CSS of
    the grader's own) and ``scripts`` (the grader's own scripts' texts, the only ones the policy allows)."""
    sanitiser = _Sanitiser()
    sanitiser.feed(page)
    sanitiser.close()
    cleaned = "".join(sanitiser.parts)
    # the page loads nothing from outside itself: font files named by its CSS (bootstrap's icons) would be
    # refused by the policy and missing offline, so their rules go
    cleaned = re.sub(r"<style[^>]*>.*?</style>", lambda block: re.sub(r"@font-face\s*\{[^}]*\}", "", block.group(0)),
                     cleaned, flags=re.S | re.I)
    for text in scripts:
        if re.search(r"</script", text, re.I):
            raise ValueError("a script to put inline may not contain </script")
    ours = ('<meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{content_security_policy(scripts)}">'
            + (f"<style>{style}</style>" if style else "")
            + "".join(f"<script>{text}</script>" for text in scripts))
    head = re.search(r"<head[^>]*>", cleaned)
    if head is None:
        return f"<!DOCTYPE html><html><head>{ours}</head><body>{cleaned}</body></html>"
    return cleaned[:head.end()] + ours + cleaned[head.end():]
