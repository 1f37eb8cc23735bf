#!/usr/bin/env python3
"""Check that every reference in refpool's documentation resolves, and that reference pages are no log.

Usage: python3 docs/check_refs.py [REPOSITORY_ROOT]   (default: the folder above this script)

Pages: README.md, CHANGELOG.md and docs/**/*.md. For each page it checks:

- links and images, [text](target): the target exists (relative to the page), and its #anchor is a
  heading of the target page (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens);
- section references in prose, `page.md, "Section"`: the quoted text starts a heading of that page,
  or is a bold label (**Section**) in it;
- paths of the repository, in prose, in backticks and in shell code blocks (lib/..., test/...,
  bench/..., include/..., docs/..., examples/..., python/..., .ci/...; globs and {a,b} allowed):
  each matches at least one file or folder, and none leads out of the repository (`../x`); `refpool/x.hpp` is a public header under include/; a bare
  source file name in backticks (`plan_test.cpp`) is a file somewhere in the repository;
- reference pages only (not docs/log/ or CHANGELOG.md, which are history): no commit hash, no date,
  no "nth session". History goes to docs/log/.

History pages (docs/log/) name files as they were when it happened, so their bare paths are not
checked; their links are. Exits 1 and prints `page:line: problem` for each problem found.
"""
import glob
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
HISTORY = ("docs/log/", "CHANGELOG.md")
PREFIXES = ("lib", "test", "bench", "include", "docs", "examples", "python", ".ci")
SOURCE_EXTENSIONS = (".cpp", ".hpp", ".h", ".c", ".cu", ".inc", ".py", ".sh", ".patch")
# Files the build makes from a template of the same name plus ".in".
GENERATED = {"config.hpp"}
# Other projects' files that pages name by their base name.
EXTERNAL = {"CUDAPluggableAllocator.h", "CUDAPluggableAllocator.cpp", "CUDACachingAllocator.h", "test_cuda.py",
            "test_cudagraph_trees.py"}
# In shell code: what follows these is written, not read.
# A build folder's targets are no paths of the repository either.
OUTPUT = re.compile(r"(?:>>?|\s-o|--out|--json|--picture)\s+\S+|\bln\s+-\w+\s+\S+\s+\S+"
                    r"|\b(?:ninja|meson compile)\s+-C\s+\S+(?:\s+[\w/.-]+)*")

LINK = re.compile(r"!?\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SECTION_REF = re.compile(r"([\w./-]+\.md)\)?`?,\s+\"([^\"]+)\"")
PATH = re.compile(r"(?<![\w./${}-])((?:%s)/[\w.*?{},/-]*)" % "|".join(re.escape(p) for p in PREFIXES))
HEADER = re.compile(r"(?<![\w./-])(refpool/[\w./-]+\.(?:hpp|h|inc))")
INLINE_CODE = re.compile(r"`([^`]+)`")
COMMIT = re.compile(r"(?<![\w/#.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
SESSION = re.compile(r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
                     r" session\b", re.IGNORECASE)
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
SHELL_LANGUAGES = {"", "sh", "bash", "shell", "console"}


def pages():
    found = [p for p in ("README.md", "CHANGELOG.md") if os.path.exists(os.path.join(ROOT, p))]
    found += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                                 recursive=True))
    return found


def slug(heading):
    """GitHub's anchor for a heading: markup and punctuation dropped, lower case, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path, cache={}):
    """(anchors, heading texts, bold labels) of a page, outside code blocks."""
    if path not in cache:
        anchors, texts, bold = set(), [], set()
        counts = {}
        in_code = False
        with open(path, encoding="utf-8") as page:
            for line in page:
                if FENCE.match(line):
                    in_code = not in_code
                    continue
                if in_code:
                    continue
                match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
                if match:
                    base = slug(match.group(2))
                    n = counts.get(base, 0)
                    counts[base] = n + 1
                    anchors.add(base if n == 0 else f"{base}-{n}")
                    texts.append(match.group(2).replace("`", "").lower())
                for label in re.findall(r"\*\*([^*]+)\*\*", line):
                    bold.add(label.replace("`", "").rstrip(".:").lower())
        cache[path] = (anchors, texts, bold)
    return cache[path]


def expand_braces(pattern):
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [p for choice in match.group(1).split(",")
            for p in expand_braces(pattern[:match.start()] + choice + pattern[match.end():])]


def path_exists(reference):
    reference = reference.rstrip(".,;:")
    for candidate in expand_braces(reference):
        full = os.path.join(ROOT, candidate)
        if any(c in candidate for c in "*?["):
            if glob.glob(full):
                continue
            return False
        if not os.path.exists(full) and not (os.path.basename(candidate) in GENERATED and
                                             os.path.exists(full + ".in")):
            return False
    return True


def repository_files(cache=[]):
    if not cache:
        names = set()
        for folder, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith(("build", ".git", ".mesonpy")) and d != "__pycache__"]
            names.update(files)
        cache.append(names)
    return cache[0]


def check_link(page, target, problems, where):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
    if not full.startswith(ROOT + os.sep) and full != ROOT:
        problems.append(f"{where}: link {target} leaves the repository")
        return
    if not os.path.exists(full):
        problems.append(f"{where}: link {target}: no such file")
        return
    if anchor and full.endswith(".md") and anchor not in headings(full)[0]:
        problems.append(f"{where}: link {target}: no heading with anchor #{anchor} in {os.path.relpath(full, ROOT)}")


def check_section(page, target_page, section, problems, where):
    candidates = [os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target_page)),
                  os.path.join(ROOT, target_page), os.path.join(ROOT, "docs", target_page)]
    full = next((c for c in candidates if os.path.exists(c)), None)
    if full is None:
        problems.append(f"{where}: section reference to {target_page}: no such page")
        return
    _, texts, bold = headings(full)
    wanted = section.replace("`", "").rstrip(".").lower()
    if not any(t.startswith(wanted) for t in texts) and wanted not in bold:
        problems.append(f"{where}: {target_page} has no section \"{section}\"")


def check_paths(text, problems, where):
    for match in PATH.finditer(text):
        reference = match.group(1).rstrip(".,;:")
        if not path_exists(reference):
            problems.append(f"{where}: {reference}: no such file or folder")
    for match in HEADER.finditer(text):
        start = match.start()
        if start > 0 and text[start - 1] == "/":
            continue
        if not path_exists("include/" + match.group(1)):
            problems.append(f"{where}: <{match.group(1)}>: no such public header")


def check_page(page):
    problems = []
    history = page.startswith(HISTORY)
    in_code, code_language = False, ""
    with open(os.path.join(ROOT, page), encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            where = f"{page}:{number}"
            fence = FENCE.match(line)
            if fence:
                in_code = not in_code
                code_language = fence.group(2).lower() if in_code else ""
                continue
            if in_code:
                if not history and code_language in SHELL_LANGUAGES:
                    check_paths(OUTPUT.sub(" ", line), problems, where)
                continue
            indented_code = line.startswith("    ") and not line.lstrip().startswith(("- ", "* ", "|"))
            for target in LINK.findall(line):
                check_link(page, target, problems, where)
            if history:
                continue
            prose = LINK.sub(lambda m: m.group(0).split("](")[0], line)  # link targets were checked above
            check_paths(OUTPUT.sub(" ", prose) if indented_code else prose, problems, where)
            for code in INLINE_CODE.findall(prose):
                name = code.strip()
                if name.startswith("../") and not os.path.normpath(os.path.join(ROOT, name)).startswith(ROOT + os.sep):
                    problems.append(f"{where}: `{name}` is outside the repository")
                if (re.fullmatch(r"[\w.+-]+", name) and name.endswith(SOURCE_EXTENSIONS) and
                        name not in repository_files() and name not in EXTERNAL):
                    problems.append(f"{where}: `{name}`: no file of that name in the repository")
            for pattern, what in ((COMMIT, "a commit hash"), (DATE, "a date"), (SESSION, "a session")):
                for match in pattern.finditer(re.sub(r"https?://\S+", "", line)):
                    problems.append(f"{where}: {what} ({match.group(0)}) in a reference page: history goes to docs/log/")
    # Section references may wrap: look for them in each paragraph joined into one line.
    for start, paragraph in paragraphs(page):
        for target_page, section in SECTION_REF.findall(paragraph):
            check_section(page, target_page, section, problems, f"{page}:{start}")
    return problems


def paragraphs(page):
    """(first line number, text joined with spaces) of each paragraph outside code blocks."""
    found, current, start, in_code = [], [], 0, False
    with open(os.path.join(ROOT, page), encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if FENCE.match(line):
                in_code = not in_code
                line = ""
            if in_code or not line.strip():
                if current:
                    found.append((start, " ".join(current)))
                current = []
                continue
            if not current:
                start = number
            current.append(line.strip())
    if current:
        found.append((start, " ".join(current)))
    return found


def main():
    problems = []
    checked = pages()
    for page in checked:
        problems += check_page(page)
    for problem in problems:
        print(problem)
    print(f"check_refs: {len(checked)} pages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
