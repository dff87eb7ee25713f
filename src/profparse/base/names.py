"""Readable, distinct labels for kernel and op names, shared by the summary, plots, diff and report."""

from __future__ import annotations

import re
from collections.abc import Sequence

from profparse.base.formats import display

LABEL_WIDTH = 72
#: Characters of a name read to make its label: the label shows its first identifiers and template arguments,
#: and the longest kernel names of real traces (CUTLASS, CuTe) are a few thousand characters. Anything past it is
#: hostile or generated; reading it only costs time (a name of 150,000 characters took over a minute), and nesting
#: deeper than :data:`MAX_TEMPLATE_DEPTH` is shown as written.
MAX_NAME_CHARS = 4096
MAX_TEMPLATE_DEPTH = 64

# Each pattern below can start a match at only one place in a run of the characters it repeats (the lookbehinds),
# so a long identifier, digit run or run of colons that does not match is read once, not once per character.
_ANON = re.compile(r"\(anonymous namespace\)::")
_OPERATOR = re.compile(r"operator\(\)(?:\(\))?(?:\s*const)?")
# a run of namespaces (``at::native::``), from the first letter of an identifier; group 1 keeps the digits before
# it (``2ck::f`` -> ``2f``, as a leftmost match in the middle of that word would)
_NAMESPACE = re.compile(r"(?<!\w)(\d*)(?:[A-Za-z_]\w*::)+(?=[A-Za-z_~])")
# colons before a separator or the end (``f::<`` -> ``f<``); an odd run keeps one colon
_TRAILING_COLONS = re.compile(r"(?<!:)(:+)(?=[\s,<>]|$)")
# a length and the identifier it introduces, in a mangled name (``8Functor``), from the first digit of the run
_MANGLED_LENGTH = re.compile(r"(?<!\d)(\d+)([A-Za-z_])")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_BORING = re.compile(
    r"^(?:-?\d+[uUlL]*|true|false|bool|char\*?|float\d?|double|half|Half|BFloat16|bfloat16|int\d*(?:_t)?|"
    r"long(?: long)?|unsigned(?: \w+)*|short|\(\w+\)\d+|\d+)$"
)


def _drop_groups(text: str, opening: str, closing: str) -> str:
    """``text`` without its balanced ``opening`` ... ``closing`` groups."""
    out, depth = [], 0
    for ch in text:
        if ch == opening:
            depth += 1
        elif ch == closing and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _template_depth(text: str) -> int:
    """The deepest nesting of ``<`` in ``text`` (the recursion :func:`_parse_template` would need)."""
    depth = deepest = 0
    for ch in text:
        if ch == "<":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ">" and depth:
            depth -= 1
    return deepest


def _parse_template(text: str, i: int = 0) -> tuple[tuple[str, list | None, str], int]:
    """``name<arg, ...>tail`` -> ((name, args or None, tail), next index); args are parsed the same way."""
    start = i
    while i < len(text) and text[i] not in "<>,":
        i += 1
    name = text[start:i].strip()
    args = None
    if i < len(text) and text[i] == "<":
        args = []
        i += 1
        while i < len(text):
            node, i = _parse_template(text, i)
            args.append(node)
            if i < len(text) and text[i] == ",":
                i += 1
                continue
            if i < len(text) and text[i] == ">":
                i += 1
            break
    start = i
    while i < len(text) and text[i] not in "<>,":
        i += 1
    return (name, args, text[start:i].strip()), i


def _render(node: tuple[str, list | None, str], drop: bool) -> str:
    name, args, tail = node
    if args is None:
        return name + tail
    shown = [a for a in args if not (drop and a[1] is None and (_BORING.match(a[0]) or not a[0]))]
    shown = [a for a in shown if not (drop and a[0] in ("Array", "array"))]
    if not shown:
        return name + tail
    return f"{name}<{', '.join(_render(a, drop) for a in shown)}>{tail}"


def _mangled_label(name: str) -> str | None:
    """A readable label for an Itanium-mangled name (``_ZN2ck...``): the function's own identifier, and for a
    generic one (``Kernel``) the first long identifier of its template arguments. None when it does not parse."""
    i = 2
    nested = name.startswith("_ZN")
    i += 1 if nested else 0
    tokens: list[str] = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        if j - i > len(str(MAX_NAME_CHARS)):  # longer than any name read: not a mangled name
            return None
        n = int(name[i:j])
        tokens.append(name[j : j + n])
        i = j + n
        if not nested:
            break
    if not tokens or not tokens[-1]:
        return None
    base = tokens[-1]
    if i < len(name) and name[i] == "I":  # template arguments follow
        inner = ""
        if len(base) <= 8:
            for m in _MANGLED_LENGTH.finditer(name, i):
                if len(m.group(1)) > len(str(MAX_NAME_CHARS)):
                    continue
                n = int(m.group(1))
                ident = name[m.start(2) : m.start(2) + n]
                if n >= 8 and _IDENTIFIER.fullmatch(ident):
                    inner = ident
                    break
        return f"{base}<{inner or '…'}>"
    return base


def shorten_name(name: str, width: int = LABEL_WIDTH, *, kernel: bool = True) -> str:
    """A readable label for a GPU kernel (or, with ``kernel=False``, a CPU op) name.

    Kernels lose ``void``, namespaces, argument lists and lambda decorations; when still too long, template
    arguments that are plain numbers or types are dropped, so the functor that tells kernels apart stays:
    ``void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>(int, ...)``
    becomes ``vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>``. Anything longer is cut with ``…``.
    """
    text = " ".join(name[:MAX_NAME_CHARS].split())
    if kernel and text.startswith("_Z"):
        text = _mangled_label(text) or text
    elif kernel:
        if text.startswith("void "):
            text = text[5:]
        text = _ANON.sub("", text)
        text = _drop_groups(text, "{", "}")
        text = _OPERATOR.sub("", text)
        text = _drop_groups(text, "(", ")")
        text = _TRAILING_COLONS.sub(lambda m: ":" * (len(m.group(1)) % 2), text)
        text = _NAMESPACE.sub(r"\1", text).replace(" const", "").strip()
        if "<" in text and _template_depth(text) <= MAX_TEMPLATE_DEPTH:
            tree, _ = _parse_template(text)
            full = _render(tree, drop=False)
            text = full if len(full) <= width else _render(tree, drop=True)
    text = display(text)
    if len(text) > width:
        text = text[: width - 1] + "…"
    return text


def unique_labels(names: Sequence[str], width: int = LABEL_WIDTH, kernel: bool = True) -> list[str]:
    """:func:`shorten_name` of each name, made distinct (``label [2]`` for a repeat)."""
    labels = [shorten_name(n, width, kernel=kernel) for n in names]
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} [{seen[label]}]")
    return out
