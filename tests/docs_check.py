"""Checks of README.md and docs/*.md (tests/docs.cmake registers each mode as a CTest test).

  links PAGE...                  every relative link and #anchor resolves: the file exists and the
                                 anchor is a heading of the target page (GitHub's slugs)
  excerpts PAGE...               every block marked `<!-- excerpt: PATH -->` on the line above its fence
                                 is a verbatim slice of PATH (lines in order, none left out)
  python --pythonpath DIR PAGE...  runs every ```python block with this interpreter, each in a new
                                 temporary directory; a block marked `<!-- docs-test: continue -->`
                                 runs after the python block before it, in one program
  sh --bin DIR PAGE...           runs every ```sh block under `bash -e` with DIR first on PATH, in a
                                 temporary directory holding the input files the pages name
                                 (S.npy, Q.npy, ...: write_fixtures below)
  cpp-extract --out DIR PAGE...  writes every ```cpp block that is not an excerpt as a program
                                 DIR/doc_N.cpp (#include lines and namespace-scope struct and template
                                 definitions first, the other lines inside main) and prints
                                 "N PAGE:LINE" per program, for CMake to build and run each one
  count PAGE...                  prints how many blocks each mode covers

A ```cpp, ```python, ```sh or ```cmake block is either run (or compiled) by one of these modes or is
an excerpt; blocks without a language (synopses, pictures, printed output, the set-up commands) are
text. Only the standard library and NumPy are used.
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\S*)\s*$")
EXCERPT = re.compile(r"^<!--\s*excerpt:\s*(\S+)\s*-->\s*$")
CONTINUE = re.compile(r"^<!--\s*docs-test:\s*continue\s*-->\s*$")
RUN_LANGS = {"python", "sh", "cpp"}
CHECKED_LANGS = RUN_LANGS | {"cmake"}


class Block:
    def __init__(self, page, line, lang, text, excerpt, cont):
        self.page, self.line, self.lang, self.text, self.excerpt, self.cont = page, line, lang, text, excerpt, cont

    def where(self):
        return f"{self.page}:{self.line}"


def blocks(page):
    """Every fenced block of a page: its language, text and the marker on the line above it."""
    lines = pathlib.Path(page).read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not re.match(r"^```\s*$", lines[j]):
                j += 1
            if j == len(lines):
                raise SystemExit(f"{page}:{i + 1}: a code block that is never closed")
            above = lines[i - 1] if i > 0 else ""
            ex = EXCERPT.match(above)
            out.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n",
                             ex.group(1) if ex else None, bool(CONTINUE.match(above))))
            i = j
        i += 1
    return out


def slug(heading, seen):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-', -1, -2 on repeats."""
    s = re.sub(r"`", "", heading.strip().lower())
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"[^\w\- ]", "", s)
    s = s.replace(" ", "-")
    n = seen.get(s, 0)
    seen[s] = n + 1
    return s if n == 0 else f"{s}-{n}"


def anchors(page):
    seen, out, fenced = {}, set(), False
    for line in pathlib.Path(page).read_text().split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                out.add(slug(m.group(1), seen))
    return out


def check_links(pages):
    bad, count = [], 0
    for page in pages:
        fenced = False
        for n, line in enumerate(pathlib.Path(page).read_text().split("\n"), 1):
            if line.startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
            for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
                if re.match(r"^[a-z]+:", target):
                    continue  # http:, https:, mailto:: not checked offline
                count += 1
                path, _, anchor = target.partition("#")
                dest = (pathlib.Path(page).parent / path).resolve() if path else pathlib.Path(page).resolve()
                if not dest.exists():
                    bad.append(f"{page}:{n}: {target}: {dest} does not exist")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    bad.append(f"{page}:{n}: {target}: no heading of {path or page} has the anchor #{anchor}")
                elif anchor and dest.suffix != ".md":
                    bad.append(f"{page}:{n}: {target}: an anchor into a file that is not a page")
    return bad, count


def check_excerpts(pages, root):
    bad, count = [], 0
    for page in pages:
        for b in blocks(page):
            if b.excerpt is None:
                continue
            count += 1
            source = (pathlib.Path(page).parent / b.excerpt).resolve()
            if not source.exists():
                source = (root / b.excerpt).resolve()
            if not source.exists():
                bad.append(f"{b.where()}: excerpt of {b.excerpt}, which does not exist")
            elif ("\n" + source.read_text()).find("\n" + b.text) < 0:  # whole lines, in order
                bad.append(f"{b.where()}: not a verbatim slice of {b.excerpt}")
    for page in pages:
        for b in blocks(page):
            if b.lang == "cmake" and b.excerpt is None:
                bad.append(f"{b.where()}: a cmake block must be an excerpt of a file the build uses")
            if b.lang and b.lang not in CHECKED_LANGS and b.lang != "text":
                bad.append(f"{b.where()}: a ```{b.lang} block is neither run nor checked (use ```text)")
    return bad, count


def programs(pages, lang):
    """The runnable blocks of one language, those marked `continue` joined to the block before."""
    out = []
    for page in pages:
        last = None
        for b in blocks(page):
            if b.lang != lang:
                continue
            if b.cont and last is not None:
                out[-1] = (out[-1][0] + "+" + str(b.line), out[-1][1] + b.text)
            else:
                out.append((b.where(), b.text))
            last = b
    return out


def run_python(pages, pythonpath):
    bad = []
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    progs = programs(pages, "python")
    for where, text in progs:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([sys.executable, "-c", text], cwd=tmp, env=env, capture_output=True, text=True,
                               timeout=300)
            print(f"--- {where}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
            if r.returncode != 0:
                bad.append(f"{where}: the python block exits {r.returncode}")
    return bad, len(progs)


def write_fixtures(directory):
    """The input files the pages' command lines name, of the shapes cli.md gives them."""
    import numpy as np

    rng = np.random.default_rng(0)
    f32 = np.float32
    files = {
        "S.npy": rng.random((2, 2, 4)).astype(f32),
        "L.npy": np.array([2, 3], np.int64),
        "Q.npy": rng.normal(size=(2, 1, 2)).astype(f32),
        "K.npy": rng.normal(size=(2, 10, 2)).astype(f32),
        "V.npy": np.tile(np.arange(40, dtype=f32).reshape(1, 10, 4), (2, 1, 1)),
        "WQ.npy": rng.normal(size=(8, 2)).astype(f32),
        "WK.npy": rng.normal(size=(8, 2)).astype(f32),
        "WV.npy": rng.normal(size=(8,)).astype(f32),
        "X.npy": np.sort(rng.random(50) * 5).astype(f32),
        "XQ.npy": np.linspace(0, 5, 20, dtype=f32),
        "B.npy": np.array([0.4]),  # kreg's bandwidths, one per column of X.npy
    }
    files["Y.npy"] = (2 * np.sin(files["X.npy"]) + files["X.npy"] ** 0.8).astype(f32)
    for name, array in files.items():
        np.save(pathlib.Path(directory) / name, array)


def run_sh(pages, bindir):
    bad = []
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", ATTN_PROGRESS="never")
    progs = programs(pages, "sh")
    for where, text in progs:
        with tempfile.TemporaryDirectory() as tmp:
            write_fixtures(tmp)
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=tmp, env=env, capture_output=True,
                               text=True, timeout=300)
            print(f"--- {where}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
            if r.returncode != 0:
                bad.append(f"{where}: the sh block exits {r.returncode}")
    return bad, len(progs)


def cpp_program(text):
    """A block as a program: #includes and namespace-scope definitions first, statements in main."""
    head, body, lines, i = [], [], text.split("\n"), 0
    if re.search(r"\bint main\s*\(", text):
        return text
    while i < len(lines):
        line = lines[i]
        if line.startswith("#include"):
            head.append(line)
        elif re.match(r"^(struct|class|template|namespace|using|constexpr|static)\b", line):
            j = i
            while not (lines[j].startswith("}") or (j == i and line.rstrip().endswith(";"))):
                j += 1
            head.extend(lines[i:j + 1])
            i = j
        else:
            body.append("  " + line if line else line)
        i += 1
    includes = ["#include <cmath>", "#include <cstdint>", "#include <cstdio>", "#include <vector>", "",
                "#include <attn/attn.hpp>"]
    return "\n".join(includes + head + ["", "int main() {"] + body + ["  return 0;", "}", ""])


def cpp_extract(pages, out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for page in pages:
        for b in blocks(page):
            if b.lang != "cpp" or b.excerpt is not None:
                continue
            source = out / f"doc_{n}.cpp"
            text = f"// {b.where()}, extracted by tests/docs_check.py\n" + cpp_program(b.text)
            if not source.exists() or source.read_text() != text:
                source.write_text(text)
            print(f"{n} {b.where()}")
            n += 1


def count(pages):
    totals = {}
    for page in pages:
        for b in blocks(page):
            kind = "excerpt" if b.excerpt else (b.lang if b.lang in CHECKED_LANGS else "text")
            totals[kind] = totals.get(kind, 0) + 1
    print(totals)


def main(argv):
    mode, args = argv[1], argv[2:]
    opts = {}
    while args and args[0].startswith("--"):
        opts[args[0]] = args[1]
        args = args[2:]
    pages = args
    root = pathlib.Path(__file__).resolve().parent.parent
    if mode == "links":
        bad, n = check_links(pages)
    elif mode == "excerpts":
        bad, n = check_excerpts(pages, root)
    elif mode == "python":
        bad, n = run_python(pages, opts["--pythonpath"])
    elif mode == "sh":
        bad, n = run_sh(pages, opts["--bin"])
    elif mode == "cpp-extract":
        cpp_extract(pages, opts["--out"])
        return 0
    elif mode == "count":
        count(pages)
        return 0
    else:
        raise SystemExit(f"unknown mode {mode}")
    for line in bad:
        print(line, file=sys.stderr)
    print(f"{mode}: {n} checked, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
