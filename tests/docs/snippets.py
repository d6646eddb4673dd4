"""Every fenced code block of the README and docs/, for the tests that compile
or run them (a snippet cannot rot unnoticed). Blocks without a language are
shown output (a run's text), not code, and are left alone; every other block
must have a checker: cpp (compiled: cpp_tu()), python (run:
tests/python/test_doc_snippets.py), sh, json, cmake (same file)."""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")


def doc_files(root=ROOT):
    files = [os.path.join(root, "README.md"), os.path.join(root, "benchmarks", "README.md")]
    docs = os.path.join(root, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return files


def blocks(root=ROOT):
    """(relative path, first line number, language, code) of every fenced block."""
    out = []
    for path in doc_files(root):
        lang, start, body = None, 0, []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = FENCE.match(line.rstrip("\n"))
                if lang is None and m:
                    lang, start, body = m.group(1), n + 1, []
                elif lang is not None and line.rstrip() == "```":
                    out.append((os.path.relpath(path, root), start, lang, "".join(body)))
                    lang = None
                elif lang is not None:
                    body.append(line)
    return out


def cpp_tu(root=ROOT):
    """One translation unit: each cpp block becomes the body of its own
    function (its #include lines go to the top), after a prelude that declares
    the trainer's own objects the snippets use (tests/docs/prelude.hpp)."""
    includes, funcs = [], []
    for i, (path, line, lang, code) in enumerate(b for b in blocks(root) if b[2] == "cpp"):
        body = []
        for text in code.splitlines():
            if text.lstrip().startswith("#include"):
                includes.append(text.strip())
                text = ""  # hoisted; the blank keeps the #line numbers right
            body.append(text)
        funcs.append(f"// {path}:{line}\n[[maybe_unused]] static int snippet_{i}() {{\n"
                     f'#line {line} "{path}"\n' + "\n".join(body) + "\n  return 0;\n}\n")
    head = "// Generated from the README and docs/ by tests/docs/snippets.py: do not edit.\n"
    head += '#include "prelude.hpp"\n' + "\n".join(dict.fromkeys(includes)) + "\n\n"
    return head + "using namespace doc_prelude;\n\n" + "\n".join(funcs)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: snippets.py OUT.cpp")
    text = cpp_tu()
    try:
        with open(sys.argv[1]) as f:
            if f.read() == text:
                sys.exit(0)  # unchanged: keep the timestamp, no rebuild
    except OSError:
        pass
    with open(sys.argv[1], "w") as f:
        f.write(text)
