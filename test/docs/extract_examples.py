#!/usr/bin/env python3
"""The examples of refpool's documentation, as programs the test suite builds and runs.

A page marks a complete example with an HTML comment on the line before its fenced code block:

    <!-- example: NAME -->            the block is a whole program (C++, C or Python)
    <!-- example: NAME, in main -->   a C++ block of statements: its #include and using lines stay
                                      at the top, the rest becomes the body of main()
    <!-- output: NAME -->             before a code block (fenced or indented) that NAME must print
                                      exactly, line by line (optional)

Usage:
    extract_examples.py --list ROOT             pages scanned ("page PATH") and examples ("example
                                                NAME LANGUAGE PAGE"), for test/docs/meson.build
    extract_examples.py NAME PAGE SOURCE OUTPUT writes NAME's program to SOURCE and the output it
                                                must print to OUTPUT (empty: not checked)
    extract_examples.py --run OUTPUT COMMAND... runs the program, checks its exit status and, when
                                                OUTPUT is not empty, its standard output
Pages: README.md and docs/**/*.md (docs/log/, history, has no examples).
"""
import glob
import os
import re
import subprocess
import sys

MARK = re.compile(r"^<!--\s*(example|output):\s*([\w-]+)\s*(?:,\s*(in main))?\s*-->\s*$")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
LANGUAGES = {"cpp": "cpp", "c++": "cpp", "c": "c", "python": "py", "py": "py"}


def pages(root):
    found = ["README.md"] + sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "**", "*.md"),
                                                                            recursive=True))
    return [p for p in found if not p.startswith("docs/log/") and os.path.exists(os.path.join(root, p))]


def blocks(path):
    """{(kind, name): (language, mode, lines)} of the marked blocks of one page."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found = {}
    i = 0
    while i < len(lines):
        mark = MARK.match(lines[i])
        i += 1
        if not mark:
            continue
        kind, name, mode = mark.group(1), mark.group(2), mark.group(3)
        while i < len(lines) and not lines[i].strip():
            i += 1
        where = f"{path}:{i + 1}"
        if (kind, name) in found:
            sys.exit(f"{where}: a second {kind} named {name}")
        fence = FENCE.match(lines[i]) if i < len(lines) else None
        body = []
        if fence:
            language = fence.group(2).lower()
            i += 1
            while i < len(lines) and not lines[i].startswith(fence.group(1)):
                body.append(lines[i])
                i += 1
            if i == len(lines):
                sys.exit(f"{where}: the code block of {kind} {name} is never closed")
            i += 1
        elif kind == "output" and i < len(lines) and lines[i].startswith("    "):
            language = ""
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            while body and not body[-1].strip():
                body.pop()
        else:
            sys.exit(f"{where}: <!-- {kind}: {name} --> is not followed by a code block")
        if kind == "example" and language not in LANGUAGES:
            sys.exit(f"{where}: example {name}: a ```cpp, ```c or ```python block is needed, not '{language}'")
        found[(kind, name)] = (language, mode, body)
    for (kind, name) in found:
        if kind == "output" and ("example", name) not in found:
            sys.exit(f"{path}: output {name} belongs to no example of this page")
    return found


def program(language, mode, body):
    if mode != "in main":
        return "\n".join(body) + "\n"
    if LANGUAGES[language] != "cpp":
        sys.exit("'in main' is for C++ examples")
    top = [line for line in body if line.startswith(("#include", "using namespace"))]
    rest = [line for line in body if line not in top]
    return "\n".join(top + ["", "int main() {"] + ["  " + line if line else line for line in rest] +
                     ["  return 0;", "}"]) + "\n"


def main(argv):
    if len(argv) == 2 and argv[0] == "--list":
        root = argv[1]
        names = {}
        for page in pages(root):
            print("page", page)
            for (kind, name), (language, _, _) in blocks(os.path.join(root, page)).items():
                if kind != "example":
                    continue
                if name in names:
                    sys.exit(f"example {name} is in {names[name]} and in {page}: names must be unique")
                names[name] = page
                print("example", name, LANGUAGES[language], page)
        return 0
    if len(argv) >= 3 and argv[0] == "--run":
        expected = open(argv[1], encoding="utf-8").read()
        result = subprocess.run(argv[2:], stdout=subprocess.PIPE, text=True)
        sys.stdout.write(result.stdout)
        if result.returncode != 0:
            print(f"exit status {result.returncode}")
            return 1
        if expected and result.stdout.rstrip("\n").split("\n") != expected.rstrip("\n").split("\n"):
            print(f"the page says it prints:\n{expected}")
            return 1
        return 0
    if len(argv) == 4:
        name, page, source, output = argv
        found = blocks(page)
        if ("example", name) not in found:
            sys.exit(f"{page}: no example named {name}")
        language, mode, body = found[("example", name)]
        open(source, "w", encoding="utf-8").write(program(language, mode, body))
        expected = found.get(("output", name))
        open(output, "w", encoding="utf-8").write("\n".join(expected[2]) + "\n" if expected else "")
        return 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
