"""The pinned ggk 0.9.7 source as the engine tier reads it: files by their cited names, the
families each `sd_version_is_*` covers (model.h), the branches of LLMEmbedder's template chain
(conditioner.hpp get_learned_condition) and the functions the command probe cuts by name.

Nothing here is retyped from the engine: every answer is parsed from the unpacked sdist
(engine_build.py unpacks it into the cache), so a citation, a tap or a pad that drifts from the
code fails the tier rather than a constant that drifted with it.

    src = Source()                         # the cached, unpacked sdist
    src.branch_of("VERSION_FLUX3")         # Branch(cond=..., head=3549, first=3550, last=3561)
    src.lines("conditioner.hpp", 3550, 3561)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

CONDITIONER = "diffusion/src/conditioning/conditioner.hpp"
MODEL_H = "diffusion/src/model.h"
# What a citation's file name resolves to when its basename is ambiguous in the sdist.
PREFERRED = {"model.hpp": "diffusion/src/model/diffusion/model.hpp",
             "fibo2.hpp": "diffusion/src/conditioning/fibo2.hpp",
             "main.cpp": "diffusion/cli/main.cpp",
             "common.cpp": "diffusion/cli/common/common.cpp"}


@dataclass(frozen=True)
class Branch:
    cond: str  # the `if (...)` condition as written
    versions: frozenset  # the VERSION_* it covers
    head: int  # the `} else if (...) {` line (1-based)
    first: int  # the branch body's first line
    last: int  # its last line (the line before the next `} else`)


class Source:
    def __init__(self, engine: Path | None = None):
        if engine is None:
            from engine_build import engine_dir

            engine = engine_dir()
        self.engine = Path(engine)

    # ---------------------------------------------------------------- files
    def path(self, cited: str) -> Path:
        """The sdist file a citation names: a path under vendor/engine (or diffusion/src), else a
        basename found once in the tree (PREFERRED settles the few found twice)."""
        for base in (self.engine, self.engine / "diffusion", self.engine / "diffusion" / "src"):
            if (base / cited).is_file():
                return base / cited
        name = Path(cited).name
        if name in PREFERRED and cited in PREFERRED[name]:
            return self.engine / PREFERRED[name]
        hits = [p for p in self._index.get(name, ()) if p.as_posix().endswith(cited)]
        if len(hits) != 1:
            raise KeyError(f"{cited}: {len(hits)} files of the sdist end with that name")
        return hits[0]

    @cached_property
    def _index(self) -> dict[str, list[Path]]:
        out: dict[str, list[Path]] = {}
        for p in (self.engine / "diffusion").rglob("*"):
            if p.suffix in (".hpp", ".cpp", ".h") and "vocab" not in p.parts:
                out.setdefault(p.name, []).append(p)
        return out

    def text(self, cited: str) -> list[str]:
        return self.path(cited).read_text(encoding="utf-8").splitlines()

    def lines(self, cited: str, first: int, last: int) -> list[str]:
        return self.text(cited)[first - 1 : last]

    # ---------------------------------------------------------------- versions
    @cached_property
    def version_sets(self) -> dict[str, frozenset]:
        """sd_version_is_X -> the VERSION_* it answers true for (model.h, calls resolved)."""
        src = (self.engine / MODEL_H).read_text(encoding="utf-8")
        bodies = {
            m.group(1): m.group(2)
            for m in re.finditer(
                r"static inline bool (sd_version_is_\w+)\(SDVersion version\) \{(.*?)\n\}", src,
                re.DOTALL)
        }
        out: dict[str, frozenset] = {}

        def resolve(name, seen=()):
            if name in out:
                return out[name]
            body = bodies[name]
            got = set(re.findall(r"\bVERSION_\w+", body))
            for call in re.findall(r"\b(sd_version_is_\w+)\(", body):
                if call not in seen and call in bodies:
                    got |= resolve(call, (*seen, name))
            out[name] = frozenset(got)
            return out[name]

        for name in bodies:
            resolve(name)
        return out

    def condition_versions(self, cond: str) -> frozenset:
        """The versions an `||` condition over `sd_version_is_X(version)` and `version == V`
        covers (an `&&` or anything else is refused: the chain has none)."""
        out: set[str] = set()
        for term in (t.strip() for t in cond.split("||")):
            if m := re.fullmatch(r"(sd_version_is_\w+)\(version\)", term):
                out |= self.version_sets[m.group(1)]
            elif m := re.fullmatch(r"version == (VERSION_\w+)", term):
                out.add(m.group(1))
            else:
                raise ValueError(f"condition term {term!r} is not a version test")
        return frozenset(out)

    # ---------------------------------------------------------------- template chain
    def _chain(self, lines: list[str], start: int) -> list[Branch]:
        """The `if / else if` chain at 8 spaces from line index `start` (0-based) to its
        `} else {` fallback."""
        head_re = re.compile(r"^        (?:\} else )?if \((.*)\) \{$")
        out, i, cur = [], start, None
        while i < len(lines):
            t = lines[i]
            m = head_re.match(t)
            if m and (cur is not None or not t.lstrip().startswith("}")):
                if cur is not None:
                    out.append(self._branch(cur, i))
                cur = (m.group(1), i + 1)
            elif cur is not None and t in ("        } else {", "        }"):
                out.append(self._branch(cur, i))
                return out
            i += 1
        raise ValueError("the template chain has no end")

    def _branch(self, cur: tuple[str, int], end: int) -> Branch:
        return Branch(cur[0], self.condition_versions(cur[0]), cur[1], cur[1] + 1, end)

    @cached_property
    def template_chain(self) -> list[Branch]:
        """LLMEmbedder::get_learned_condition's family branches, in order."""
        lines = self.text(CONDITIONER)
        start = next(i for i, t in enumerate(lines) if t.startswith("struct LLMEmbedder"))
        first = next(i for i in range(start, len(lines))
                     if "SDCondition get_learned_condition(" in lines[i])
        begin = next(i for i in range(first, len(lines)) if lines[i].startswith("        if ("))
        return self._chain(lines, begin)

    @property
    def chain_span(self) -> tuple[int, int]:
        chain = self.template_chain
        return chain[0].head, chain[-1].last + 1

    def branch_of(self, version: str) -> Branch:
        """The branch a family takes: the FIRST whose condition covers it (an else-if chain)."""
        for b in self.template_chain:
            if version in b.versions:
                return b
        raise KeyError(f"{version}: no branch of LLMEmbedder::get_learned_condition covers it")

    def family_version(self, family: str) -> str | None:
        """The VERSION_* of a family name as a pack's `serves` writes it ("Iris-3B" ->
        sd_version_is_iris -> VERSION_IRIS), when that function covers exactly one version."""
        key = re.split(r"[-\s.]", family.strip())[0].lower()
        got = self.version_sets.get(f"sd_version_is_{key}")
        return next(iter(got)) if got and len(got) == 1 else None

    # ---------------------------------------------------------------- functions
    def function(self, cited: str, head: str) -> tuple[int, int]:
        """Lines (1-based) of the first definition whose first line starts with `head` (after
        its indentation; its parameters may run on) up to its closing brace at that
        indentation."""
        lines = self.text(cited)
        first = next(i for i, t in enumerate(lines) if t.lstrip().startswith(head))
        indent = len(lines[first]) - len(lines[first].lstrip())
        close = " " * indent + "}"
        last = next(i for i in range(first + 1, len(lines)) if lines[i].rstrip() in (close,
                                                                                    close + ";"))
        return first + 1, last + 1

    def holds(self, cited: str, first: int, last: int, name: str) -> bool | None:
        """Whether lines first..last of a file hold `name` or lie inside its definition (a
        function or struct whose opening line names it); None when the file's code never names
        it (the citation's word is this tool's or a string's, not the engine's)."""
        # code only: a tensor name in a string literal ("...adapter.cap_query") is not an identifier
        lines = [re.sub(r"//.*$", "", re.sub(r'"(?:[^"\\]|\\.)*"', '""', s))
                 for s in self.text(cited)]
        if not any(name in s for s in lines):
            return None
        if any(name in s for s in lines[first - 1 : last]):  # has_vis_in holds vis_in
            return True
        for h in range(first - 2, -1, -1):
            if name in lines[h] and not lines[h].lstrip().startswith("//"):
                indent = lines[h][: len(lines[h]) - len(lines[h].lstrip())]
                end = next((j for j in range(h + 1, len(lines))
                            if lines[j].rstrip() in (indent + "}", indent + "};")), -1)
                if end + 1 >= last:
                    return True
        return False

    # ---------------------------------------------------------------- blocks
    def knows(self, cited: str) -> bool:
        """Whether a citation's file name is one file of the sdist (llama.cpp is not)."""
        try:
            self.path(cited)
            return True
        except KeyError:
            return False

    def _opener(self, lines: list[str], i: int) -> int | None:
        """The index of the line whose `{` opens the block headed at index i (i itself, or the
        last line of a signature whose parameters run on), None when i heads no block."""
        s = lines[i].strip()
        if not s or s.startswith(("//", "/*", "*", "#")) or s == "}":
            return None
        depth = 0  # a head's parentheses may run on over a few lines, its `{` after them
        for j in range(i, min(i + 12, len(lines))):
            t = re.sub(r"//.*$", "", re.sub(r'"(?:[^"\\]|\\.)*"', '""', lines[j])).rstrip()
            depth += t.count("(") - t.count(")")
            if depth <= 0:
                return j if t.endswith("{") else None
        return None

    def block_at(self, cited: str, line: int) -> tuple[int, int] | None:
        """(head, last) of the block line `line` heads (1-based): an `if`/`} else if` branch,
        a loop, a function or a struct. last is its body's last line: the one before the
        `}` or `} else` that closes it (a template branch's last, as in template_chain); None
        when the line heads no block."""
        lines = self.text(cited)
        i = line - 1
        if self._opener(lines, i) is None:
            return None
        indent = len(lines[i]) - len(lines[i].lstrip())
        for k in range(self._opener(lines, i) + 1, len(lines)):
            t = lines[k]
            if not t.strip():
                continue
            ind = len(t) - len(t.lstrip())
            if ind < indent:
                return None
            if ind == indent and t.lstrip().startswith("}"):
                return line, k
        return None

    def enclosing(self, cited: str, line: int) -> tuple[int, int] | None:
        """(head, last) of the innermost function or struct whose body holds line `line`."""
        lines = self.text(cited)
        floor = len(lines[line - 1]) - len(lines[line - 1].lstrip())
        for h in range(line - 2, -1, -1):
            t = lines[h]
            if not t.strip() or t.lstrip().startswith(("//", "*", "/*", "#")):
                continue
            ind = len(t) - len(t.lstrip())
            if ind >= floor:
                continue
            floor = ind
            head = t.strip()
            if head == "{" or re.match(r"(\}\s*)?(else|if|for|while|switch|do|try|case|namespace|"
                                       r"extern|default)\b", head):
                continue
            block = self.block_at(cited, h + 1)
            if block and block[1] >= line:
                return block
        return None

    def cut_block(self, cited: str, first: int, last: int) -> tuple[int, int] | None:
        """The first block that opens on lines first..last (1-based) but does not end by last:
        a range running on past a block it claims must end on a whole statement."""
        for h in range(first, last + 1):
            block = self.block_at(cited, h)
            if block and block[1] > last:
                return block
        return None
