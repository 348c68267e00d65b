"""The line citations of ggk 0.9.7's source written in gguf_trainer/, tests/ and README.md, read
from the comments and strings of each module (the `//` comments of the tier's C++ probes, the
paragraphs of a Markdown file), and the check that each still says what it claims.

The forms the code writes, all read here (a bare range takes the file last named in the same
docstring, string or run of comment lines):

    conditioner.hpp 3549-3561         conditioner.hpp:1199        llm.hpp 2336-2365 and 2439-2469
    conditioner.hpp 1396-1410, 1533   util.cpp, lines 806-906     fibo2.hpp clean_caption (64-86)
    Qwen35BridgeEmbedder, 4175-4494   Iris-3B (3656-3673)         (3052-3060, llm.hpp ...)
    `MingAdapter` 533-599              `conditioner.hpp` 4426-4447     returned (342)
    T:818-840   (an alias a module declares: "ming_image_te.hpp, cited `T:<line>`")

A lone "(NNN)" reads as a line only where a file is named before it and NNN is no multiple of
32: "(4096)", "proj_out (2560)", "11 cells (352)" are widths and counts.

What a citation claims (check()):
  * its lines exist in the file it names, the first not a blank or a lone closing brace, the
    last not a blank (a range that slid with the code starts or ends off it);
  * a range that starts on a block's head (a template branch `} else if (...) {`, an `if`, a
    function or struct) is that block: it ends on the block's last line exactly (the line before
    a `} else` that continues it, else its closing brace), so 3549-3560 for FLUX.3's branch
    (3549-3561) or 3656-3680 for Iris-3B's (3656-3673) fails;
  * a range starting inside a function or struct ends inside it (a few lines of a body);
  * an identifier the citation names (`X` (file a-b), X (file a-b), file X a-b) is on the
    lines or they lie in its definition (Source.holds); code it quotes (`x = false` (file a))
    that the file has is on them;
  * a constant written on the citation's own line (`UNK_ID = 156892  # ling_tokenizer.cpp 179`)
    is spelled on the cited lines: its numbers and its strings as the C++ source spells them.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

FILE = r"(?<![\w/.-])(?P<file>(?:[\w-]+/)*[A-Za-z_][\w-]*\.(?:hpp|cpp|h))\b"
RANGE = r"\d{1,5}(?:\s*-\s*\d{1,5})?"
RANGES = rf"{RANGE}(?:\s*(?:,|and)\s*{RANGE})*"
IDENT = r"[A-Za-z_]\w*(?:::\w+)*"
# a file, then (optionally) an identifier of its code or "lines", then the ranges
LED = re.compile(
    rf"{FILE}`?(?:,?\s+(?P<name>{IDENT})(?:\([^()\n]*\))?)?(?:,?\s+lines?)?(?::\s*|,?\s+\(?)"
    rf"(?P<ranges>{RANGES})(?!\w)(?!\.\d)")
MENTION = re.compile(FILE)
# a range with no file: "(2610-2612)", "(64-86: ...", "lines 283-288", "`MingAdapter` 533-598",
# "(MingImageEmbedder, 3911-3932)", "edits, 292-316", "detect_from_weights 485-530"; one line:
# "(default_pixels, 6027)", "line 1245" (a bare "(256, 2560)" is more often a shape than lines,
# and so is a lone "(4096)": PAREN_ONE); "1844-1867 PixArtT5Embedder," names what follows
_LEAD = (rf"(?:\(\s*|\blines?\s+|,\s+|`(?P<name>{IDENT})`,?\s+"
         rf"|\b(?P<word>{IDENT})(?P<comma>,)?\s+)")
BARE = re.compile(rf"{_LEAD}(?P<ranges>\d{{2,5}}\s*-\s*\d{{2,5}}(?:\s*(?:,|and)\s*{RANGE})*)"
                  rf"(?=\s*[),;:.]|\s+(?:and|in|of)\b|\s+(?P<after>{IDENT})[,;)])")
BARE_ONE = re.compile(rf"(?<=\s)\((?:`(?P<name>{IDENT})`|(?P<word>{IDENT})),\s+"
                      r"(?P<ranges>\d{3,5})(?=\s*\))")
LINE_ONE = re.compile(r"\bline\s+(?P<ranges>\d{1,5})(?![\d-])")
# "`...assistant\\n` (227)", "returned (342)": a lone parenthesised line (see SHAPE)
PAREN_ONE = re.compile(r"(?<=\s)\((?P<ranges>\d{3,5})\)")
SHAPE = 32  # a lone "(NNN)" that is a multiple of it is a width or a count, not a line
# a row of a declaration table under a named file: "    cap_query   ne [W, n_cap]   f32 param (539)"
# (the row's tensor is the name the cited line must hold)
TABLE_ROW = re.compile(r"^[ \t]+(?P<name>[a-z_]\w*)[\w./*]*[ \t][^\n(]*?\((?P<ranges>\d{3,5})\)",
                       re.MULTILINE)
ALIAS_USE = re.compile(rf"(?<![\w.])(?P<alias>[A-Z]):(?P<ranges>{RANGES})(?!\w)(?!\.\d)")
ALIAS_DEF = re.compile(rf"{FILE}[^`\n]{{0,30}}`(?P<alias>[A-Z]):")
# an identifier right before a citation: "PixArtT5Embedder (conditioner.hpp 1655-1891)",
# "`LLMEmbedder::tokenize` (conditioner.hpp", "`chroma_use_t5_mask = false` (ggk 0.9.7 gk-...",
# "(sd_get_default_resolution, gk-diffuser.cpp", "num_queries (1240-1245)"
NAMED = re.compile(r"(?:`([A-Za-z_][\w:]*)[^`\n]*`|\b([A-Za-z_]\w*(?:::\w+)+|[a-z]\w*_\w+"
                   r"|[A-Z]\w*[a-z][A-Z]\w*))\s*(?:\(|,)\s*(?:ggk 0\.9\.7\s+)?$")

# the code a citation quotes: "`chroma_use_t5_mask = false` (ggk 0.9.7 gk-diffuser.cpp:4390)"
QUOTED = re.compile(r"`([^`\n]+)`\s*(?:\(|,)\s*(?:ggk 0\.9\.7\s+)?$")


def code_like(name: str) -> bool:
    """An identifier of the engine's code, not a word of prose ("the", "Krea2")."""
    return "_" in name or "::" in name or bool(re.search(r"[a-z][A-Z]", name))


@dataclass(frozen=True)
class Citation:
    module: Path  # the Python file it is written in
    line: int  # where in it
    file: str  # the engine file as written ("conditioner.hpp", "model/te/llm.hpp")
    first: int
    last: int
    name: str | None = None  # an identifier the citation says the lines hold
    code: str | None = None  # the code the comment sits on ("UNK_ID = 156892")
    span: tuple[int, int] | None = None  # the lines of all the ranges written with it
    quote: str | None = None  # the code quoted right before it, `...`


    def __str__(self):
        return f"{self.module}:{self.line}: {self.file} {self.first}-{self.last}"


def _joined(run) -> tuple[str, list, str | None]:
    """A run of (line, text, code) as one block: its text, [(offset, line)], the first's code."""
    body, marks = "", []
    for line, s, _ in run:
        marks.append((len(body), line))
        body += s + "\n"
    return body, marks, run[0][2]


def blocks(text: str):
    """(text, [(offset, line)], code) for each string and each run of comment lines of a module;
    code is the code a trailing one-line comment sits on, else None."""
    run: list = []  # (line, comment text, code of the first line)

    def flush():
        if run:
            yield _joined(run)
            run.clear()

    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return
    for t in toks:
        if t.type == tokenize.COMMENT:
            code = t.line[: t.start[1]].strip() or None
            if code or (run and run[-1][0] != t.start[0] - 1):
                yield from flush()  # a trailing comment starts a run; a gap ends one
            run.append((t.start[0], t.string.lstrip("#").strip(), code))
        else:
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                yield from flush()
            if t.type == tokenize.STRING:
                marks = [(0, t.start[0])]
                marks += [(m.end(), t.start[0] + i + 1)
                          for i, m in enumerate(re.finditer("\n", t.string))]
                yield t.string, marks, None
    yield from flush()


def cpp_blocks(text: str):
    """blocks() for a C++ file (the tier's probes): each run of `//` comment lines, and a
    trailing comment with the code it sits on."""
    run: list = []  # (line, comment text, code of the first line)

    def flush():
        if run:
            yield _joined(run)
            run.clear()

    for n, line in enumerate(text.splitlines(), 1):
        bare = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: " " * len(m.group(0)), line)
        at = bare.find("//")
        code = line[:at].strip() if at >= 0 else ""
        if at < 0 or code or (run and run[-1][0] != n - 1):
            yield from flush()
        if at >= 0:
            run.append((n, line[at + 2 :].strip(), code or None))
    yield from flush()


def md_blocks(text: str):
    """blocks() for a Markdown file (README.md): each paragraph, a run of non-blank lines."""
    run: list = []  # (line, text, None)
    for n, line in enumerate([*text.splitlines(), ""], 1):
        if line.strip():
            run.append((n, line, None))
        elif run:
            yield _joined(run)
            run.clear()


def _line(marks, off: int) -> int:
    return max((ln for o, ln in marks if o <= off), default=marks[0][1])


def _ranges(text: str):
    for r in re.split(r"\s*(?:,|and)\s*", text.strip()):
        a, _, b = r.partition("-")
        yield int(a), int(b.strip() or a)


def parse(module: Path, text: str, known=lambda f: True) -> list[Citation]:
    """Every citation written in a module's text; `known(file)` tells a file of the sdist from
    a name that is not one (llama.cpp), which a bare range never takes."""
    aliases = {m.group("alias"): m.group("file") for m in ALIAS_DEF.finditer(text)}
    out: list[Citation] = []
    reader = {".cpp": cpp_blocks, ".h": cpp_blocks, ".hpp": cpp_blocks, ".md": md_blocks}
    for body, marks, code in reader.get(module.suffix, blocks)(text):
        spans: list[tuple[int, int]] = []  # what LED took, so BARE does not read it twice
        found: list[tuple[int, str, str, str | None]] = []  # (offset, file, ranges, name)
        for m in LED.finditer(body):
            if not known(m.group("file")):
                continue
            name = m.group("name")
            if name and not code_like(name):
                if name != "lines" and not m.group(0)[m.end("name"):].lstrip(", ").startswith(
                        ("(", "lines")):
                    continue
                name = None
            spans.append((m.start(), m.end()))
            if not name:
                before = NAMED.search(body[max(0, m.start() - 60) : m.start()])
                name = (before.group(1) or before.group(2)) if before else None
            quote = QUOTED.search(body[max(0, m.start() - 80) : m.start()])
            found.append((m.start(), m.group("file"), m.group("ranges"), name,
                          quote.group(1) if quote else None))
        mentions = [(m.start(), m.group("file")) for m in MENTION.finditer(body)
                    if known(m.group("file"))]
        for m in TABLE_ROW.finditer(body):
            named = [f for o, f in mentions if o < m.start()]
            if named:
                spans.append((m.start("ranges"), m.end("ranges")))
                found.append((m.start("ranges"), named[-1], m.group("ranges"), m.group("name"),
                              None))
        lone = [m for m in PAREN_ONE.finditer(body) if int(m.group("ranges")) % SHAPE]
        for m in [*BARE.finditer(body), *BARE_ONE.finditer(body), *LINE_ONE.finditer(body),
                  *lone]:
            if any(a <= m.start("ranges") < b for a, b in spans):
                continue
            named = [f for o, f in mentions if o < m.start()]
            word = m.groupdict().get("word")
            if not named or (word and not code_like(word)
                             and not (m.re is BARE and m.group("comma"))):
                continue  # "rows 13-14": a range of something else
            spans.append((m.start("ranges"), m.end("ranges")))
            before = NAMED.search(body[max(0, m.start() - 60) : m.start() + 1])
            after = m.groupdict().get("after")
            name = m.groupdict().get("name") or (word if word and code_like(word) else None) or (
                after if after and code_like(after) else None) or (
                (before.group(1) or before.group(2)) if before else None)
            quote = QUOTED.search(body[max(0, m.start() - 80) : m.start() + 1])
            found.append((m.start(), named[-1], m.group("ranges"), name,
                          quote.group(1) if quote else None))
        for m in ALIAS_USE.finditer(body):
            if m.group("alias") in aliases:
                found.append((m.start(), aliases[m.group("alias")], m.group("ranges"), None,
                              None))
        for off, file, ranges, name, quote in sorted(found, key=lambda f: f[0]):
            line = _line(marks, off)
            got = list(_ranges(ranges))
            span = (min(a for a, _ in got), max(b for _, b in got))
            for a, b in got:
                out.append(Citation(module, line, file, a, b, name,
                                    code if line == marks[0][1] else None, span, quote))
    return out


def citations(roots, known=lambda f: True) -> list[Citation]:
    """Every citation in the roots: folders (their .py and C++ files) and files (README.md)."""
    out = []
    for root in map(Path, roots):
        found = [root] if root.is_file() else root.rglob("*")
        for path in sorted(p for p in found
                           if p.suffix in (".py", ".cpp", ".h", ".hpp", ".md") and p.is_file()):
            if ".venv" in path.parts or path.name == "engine_citations.py":  # its examples
                continue
            out += parse(path, path.read_text(encoding="utf-8"), known)
    return out


# ---------------------------------------------------------------- the check

def constant_values(code: str) -> tuple[list[int], list[str]]:
    """The numbers and the strings (as the source spells them) of the constant a trailing
    comment sits on: `NAME = value` or a dict entry `"key": value,`."""
    m = re.match(r"^(?:[A-Za-z_][\w, ]*=|\"[^\"]*\"\s*:)\s*(.+?),?$", code)
    if not m:
        return [], []
    try:
        node = ast.parse(m.group(1), mode="eval").body
    except SyntaxError:
        return [], []
    nums, strs = [], []
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and \
                not isinstance(n.value, bool):
            nums.append(n.value)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            seg = ast.get_source_segment(m.group(1), n) or ""
            strs.append(re.sub(r"^[rbuf]*(['\"])(.*)\1$", r"\2", seg))
        elif not isinstance(n, (ast.Constant, ast.Tuple, ast.List, ast.Load, ast.UnaryOp,
                                ast.USub)):
            return [], []  # an expression, not a constant: nothing to find spelled
    return nums, strs


def check(c: Citation, src) -> list[str]:
    """What is wrong with one citation against the sdist (Source), in words; [] when nothing."""
    try:
        lines = src.text(c.file)
    except KeyError as e:
        return [f"{c}: {e.args[0]}"]
    a, b = c.first, c.last
    if not 1 <= a <= b <= len(lines):
        return [f"{c}: past the file's {len(lines)} lines"]
    bad = []
    if lines[a - 1].strip() in ("", "}", "};") or not lines[b - 1].strip():
        # a range read off the code starts on a statement and ends on one; one that starts on a
        # closing brace or a blank line, or ends on a blank, has slid off what it cited
        bad.append(f"{c}: starts on `{lines[a - 1].strip()}` / ends on `{lines[b - 1].strip()}`,"
                   " not on code")
    block = src.block_at(c.file, a)
    outer = src.enclosing(c.file, a)
    if block and a < b < block[1]:
        bad.append(f"{c}: line {a} opens `{lines[a - 1].strip()[:50]}`, which runs to "
                   f"{block[1]}: cite {block[0]}-{block[1]}")
    elif block and b > block[1]:  # the block and what follows it: whole statements
        cut = src.cut_block(c.file, block[1] + 1, b)
        end = re.sub(r"\s*//.*$", "", lines[b - 1]).rstrip()
        if cut or not end.endswith((";", "}")):
            bad.append(f"{c}: line {a} opens `{lines[a - 1].strip()[:50]}` ({block[0]}-"
                       f"{block[1]}); the range then ends inside "
                       + (f"{cut[0]}-{cut[1]}" if cut else f"the statement `{end.strip()}`"))
    if outer and b > outer[1] + 1:  # its closing brace is still its own
        bad.append(f"{c}: starts inside `{lines[outer[0] - 1].strip()[:50]}` "
                   f"({outer[0]}-{outer[1]}) but runs past its end")
    # "`x = 1` and `y = 2` (file 4389, 4391)": the name is on one of the ranges written with it
    lo, hi = c.span or (a, b)
    word = (c.name or "").split("::")[-1]
    held = src.holds(c.file, lo, hi, word) if word and hi <= len(lines) else True
    if not held:  # or spelled on the lines as a string of the code (blocks["seed_embed"])
        code = [re.sub(r"//.*$", "", s) for s in lines]
        held = any(word in s for s in code[lo - 1 : hi]) or (
            None if held is None and not any(word in s for s in code) else False)
    if held is False:
        bad.append(f"{c}: does not hold `{c.name}`, nor lie in it")
    if c.quote and hi <= len(lines):  # quoted code the file has is on the cited lines
        quote = " ".join(c.quote.split())
        flat = [" ".join(s.split()) for s in lines]
        if any(quote in s for s in flat) and quote not in " ".join(flat[lo - 1 : hi]):
            bad.append(f"{c}: `{c.quote}` is not on the cited lines")
    if c.code:
        nums, strs = constant_values(c.code)
        cited = "\n".join(lines[a - 1 : b])
        for n in nums:
            if not re.search(rf"(?<![\w.]){n}(?![\w.])", cited):
                bad.append(f"{c}: the constant's {n} is not on the cited lines")
        for s in strs:
            if s not in cited:
                bad.append(f"{c}: the constant's \"{s}\" is not on the cited lines")
    return bad
