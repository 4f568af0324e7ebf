"""Doxygen's INPUT_FILTER for include/attn/*.hpp (docs/Doxyfile.in): attn's headers comment in `//`.

- A comment block directly above a declaration documents it (`//` becomes `///`). When several
  declarations follow the block with no blank line between them (set_backend and backend; the
  overloads of one operation), the block documents them all: they become a Doxygen member group
  (`///@{ ... ///@}`, DISTRIBUTE_GROUP_DOC).
- A comment after a member, enumerator or declaration on its own line documents it (`///<`); a
  `// NOLINT(...)` there is a lint directive, not documentation, and is dropped.
- The block that opens a file, before `#pragma once`, stays a plain comment.
The header is printed with as many lines as it has, so Doxygen's line numbers stay the file's.
"""
import re
import sys

COMMENT = re.compile(r"^(\s*)///?(?!/)( |$)")
TRAILING = re.compile(r"([;,{)])(\s+)//(?!/)\s?(.*)$")


def statement_end(lines, i):
    """The index of the last line of the declaration that starts at line i (braces balanced, ends in ; or })."""
    depth = 0
    for j in range(i, len(lines)):
        code = lines[j].split("//")[0]
        depth += code.count("{") - code.count("}")
        stripped = code.rstrip()
        if depth <= 0 and (stripped.endswith(";") or stripped.endswith("}")):
            return j
        if j - i > 60:
            break
    return i


def is_declaration(line):
    s = line.strip()
    return bool(s) and not s.startswith("//") and not s.startswith("#") and not s.startswith("}") and \
        s not in ("public:", "private:", "protected:") and not s.startswith("namespace")


def transform(lines):
    out = list(lines)
    start = 0
    for i, line in enumerate(lines):
        if line.startswith("#pragma once"):
            start = i + 1
            break
    i = start
    while i < len(lines):
        if COMMENT.match(lines[i]):
            first = i
            while i < len(lines) and COMMENT.match(lines[i]):
                out[i] = COMMENT.sub(lambda m: f"{m.group(1)}///{m.group(2)}", lines[i], count=1)  # `//`, `///`
                i += 1
            # The declarations right below the block, up to a blank line or another comment.
            ends, j = [], i
            while j < len(lines) and is_declaration(lines[j]):
                end = statement_end(lines, j)
                ends.append(end)
                j = end + 1
            if len(ends) >= 2:
                indent = re.match(r"^\s*", lines[first]).group(0)
                out[first] = f"{indent}/**@{{*/ {out[first].lstrip()}"
                out[ends[-1]] = f"{out[ends[-1]]} /**@}}*/"
            continue
        i += 1
    for k in range(start, len(out)):
        m = TRAILING.search(out[k])
        if m and not out[k].lstrip().startswith("//"):
            text = m.group(3)
            if text.startswith("NOLINT"):
                out[k] = out[k][:m.start()] + m.group(1)
            else:
                out[k] = out[k][:m.start()] + f"{m.group(1)}{m.group(2)}///< {text}"
    return out


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        text = f.read().split("\n")
    sys.stdout.write("\n".join(transform(text)))
